"""This process's part of the plan, applied once (the apply stage): :func:`start` in a planning
process (scheduler, the ``dask worker`` process, a client), :func:`start_worker` in a nanny's
worker process, from the host plan its parent wrote (:mod:`gpudask.apply.hostfile`).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any, cast

from gpudask import bootstrap
from gpudask import session as process_state
from gpudask.apply import hostfile, preimport, runtime, slots
from gpudask.bootstrap import plan_host
from gpudask.errors import GpudaskError
from gpudask.plan import HostPlan, ProcessPlan, UserValues, applied
from gpudask.plan.published import Published

logger = logging.getLogger("distributed.gpudask")


@dataclass
class Session:
    """What gpudask did in this process: its plan, and what it found in effect afterwards."""

    role: str
    host: HostPlan
    plan: ProcessPlan
    memory: dict[str, Any] = field(default_factory=dict)
    applied: bool = False
    # the live state read after apply (gpudask.apply.state) and its differences from the plan
    state: dict[str, Any] = field(default_factory=dict)
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    # the user's values of what apply changed (later plans of this process start from them)
    user_values: UserValues = field(default_factory=UserValues)
    planned_by_parent: bool = False  # the planning parent said the host's warnings
    planned_ahead: bool = False  # planned for the likely protocol before the scheduler was up

    @property
    def manager(self) -> Any:
        return self.host.ctx.manager

    @property
    def ctx(self) -> Any:
        return self.host.ctx

    def published(self) -> Published:
        """What this process publishes (tests/test_published_shape.py holds it to the type)."""
        from gpudask._version import __version__

        return cast(Published, {
            "version": __version__, "role": self.role, "protocol": self.host.protocol,
            "facts": self.host.facts.to_dict(), "facts_origin": self.host.facts.origin,
            "plugins": self.host.plugins, "plan": self.plan.to_dict(), "memory": self.memory,
            "applied": self.state, "mismatches": self.mismatches})


def current() -> Session | None:
    """This process's session (held by the process state, :mod:`gpudask.session`)."""
    return cast("Session | None", process_state.current().applied)


def _applied_role() -> str | None:
    s = current()
    return s.role if s is not None and s.applied else None


def _session_context() -> Any:
    s = current()
    return s.ctx if s is not None else None


applied.set_role_source(_applied_role)  # what gpudask.pluginapi.applied_role() answers
applied.set_context_source(_session_context)  # the plugin manager the /gpudask page asks


def start(role: str, cli: runtime.CliArgs | None = None, protocol: str | None = None,
          nworkers: int | None = None, apply: bool = True) -> Session:
    """Plan for this host and apply this process's part (``role``: scheduler, nanny, client)."""
    if cli is not None:
        if protocol is None:
            ahead = _start_ahead(role, cli, nworkers, apply)
            if ahead is not None:
                return ahead
        protocol = protocol or cli.scheduler_protocol()
        nworkers = nworkers or cli.nworkers or None  # 0: distributed refuses it and starts nothing
    protocol = _listening_protocol(protocol or "tcp")
    host = plan_host(protocol, nworkers, user_interface=cli.interface if cli is not None else None,
                     planner=role)
    session = Session(role, host, host.for_role(role))
    existing = current()
    if apply or existing is None or not existing.applied:
        # a plan-only session (a LocalCluster's scheduler in a client) never replaces an applied one
        process_state.current().applied = session
    if apply:
        _apply(session, cli)
        if role in ("nanny", "client"):
            # the worker processes this one starts read their plan there (and never plan)
            hostfile.publish(host, always=role == "nanny")
            if session.plan.multiprocessing_method == "forkserver":
                _start_forkserver(session.manager.preimport(host.facts, "worker", host.protocol)
                                  + _gpudask_modules(session))
    return session


def _start_ahead(role: str, cli: runtime.CliArgs, nworkers: int | None, apply: bool) -> Session | None:
    """``dask worker --scheduler-file F`` waits for F, which says the protocol (issue 41: that
    wait was idle).  Build the plan inputs now and preimport in the background; where a plugin
    names the likely protocol (``gpudask_likely_protocol``), plan, apply and open the transport
    (``gpudask_listen_ahead``) for it while the scheduler starts.  The session when the
    scheduler's protocol is the one planned for; else None (what was applied is put back, with
    an info line, and the caller plans for the scheduler's protocol)."""
    if cli.command != "worker" or cli.protocol or cli.scheduler_address or not cli.scheduler_file:
        return None
    if os.path.isfile(cli.scheduler_file):
        return None  # the scheduler is up: nothing to overlap
    inputs = bootstrap.inputs()
    nanny_imports = inputs.manager.preimport(inputs.facts, "nanny", None)
    likely = (inputs.manager.likely_protocol(inputs.facts) if inputs.settings.get("gpudask.start.plan-ahead").value
              else None)
    if likely is None or role != "nanny" or not apply:
        preimport.in_background(nanny_imports)
        return None
    session = start(role, cli, protocol=likely, nworkers=nworkers)
    # only now: a thread importing cupy and ucxx holds the GIL for most of a second, and the
    # workers' critical path (plan, publication, fork server) waited on it
    preimport.in_background(nanny_imports)
    later = cli.preload[cli.preload.index("gpudask") + 1:] if "gpudask" in cli.preload else ()
    if not later:
        # a preload imported after gpudask may still change what the transport reads at its start
        session.manager.listen_ahead(session.ctx, session.plan)
    actual = _listening_protocol(cli.scheduler_protocol() or "tcp")
    if actual == session.host.protocol:
        session.planned_ahead = True
        return session
    logger.info("gpudask: planned ahead for %s while the scheduler started; it listens on %s: planning for %s "
                "(gpudask.start.plan-ahead: false plans only once the scheduler is up)", session.host.protocol,
                actual, actual)
    hostfile.restore_user_values(session.host)
    bootstrap.keep_user_values(None)
    if session.plan.multiprocessing_method == "forkserver":
        from gpudask.compat.forkserver import stop_forkserver

        stop_forkserver()  # it was started with the other plan's environment: the workers inherit it
    session.applied = False
    return None


def _listening_protocol(protocol: str) -> str:
    """The protocol gpudask plans for: ``dask scheduler --protocol tcp,ws`` listens on both,
    so UCX when one of them is UCX; LocalCluster passes ``protocol="tcp://"``."""
    listeners = [p.strip() for p in protocol.split("://", 1)[0].split(",") if p.strip()]
    return next((p for p in listeners if p in ("ucx", "ucxx")), listeners[0] if listeners else "tcp")


def start_worker(locals_: dict[str, Any] | None = None) -> Session:
    """A nanny's worker process, at its first ``import gpudask``: apply this worker's plan."""
    locals_ = locals_ or {}
    index = slots.worker_index(str(locals_["nanny"]) if locals_.get("nanny") else None)
    # loaded before this process planned or read anything: by the fork server it was forked from
    found_loaded = sorted(m for m in sys.modules if m.startswith("gpudask.plugins."))
    host = hostfile.load()
    by_parent = host is not None
    if host is not None:
        hostfile.restore_user_values(host)  # what the planning parent changed for itself
    else:
        # no planning parent (LocalCluster(preload=["gpudask"]) without gpudask.initialize()):
        # plan for itself, once, only what it applies
        protocol = (locals_.get("protocol") or runtime.protocol_from(locals_.get("scheduler_ip"),
                                                                       locals_.get("scheduler_file")) or "tcp")
        planned = max(1, len(bootstrap.inputs().facts.visible_gpus()))  # what plan_host plans for by default
        host = plan_host(protocol.split("://", 1)[0], None if index < planned else index + 1,
                         user_interface=locals_.get("interface"), planner="worker")
    if index >= host.nworkers:
        # scaled up beyond the parent's plan: the plan for index+1 workers, made here, with its
        # own warning (GPUs shared round-robin)
        host = plan_host(host.protocol, index + 1, planner="worker")
        by_parent = False
    elif not by_parent and index > 0:
        by_parent = True  # each worker process plans the same host for itself: worker 0 says its warnings
    session = Session("worker", host, host.for_role("worker", index), planned_by_parent=by_parent)
    process_state.current().applied = session
    if session.plan.multiprocessing_method == "forkserver":
        # before _apply imports any of them itself: what the fork server had imported
        process_state.current().preimported = preimport.found_imported(
            session.manager.preimport(host.facts, "worker", host.protocol)) + found_loaded
    _apply(session)
    atexit.register(_end_without_collecting_everything)
    return session


def _end_without_collecting_everything() -> None:
    """Keep CPython's finalization from collecting every object at a worker process's exit:
    distributed kills a worker still alive 4 s (8 s) after its close, and collecting the
    ~94,000 objects of one with UCX and RMM took 1.2-3.9 s (``lab/fresh-machine/``)."""
    import gc

    gc.freeze()


def _apply(session: Session, cli: runtime.CliArgs | None = None) -> None:
    """Environment, config, CPU binding, then the apply hooks -- once per process."""
    import dask.config

    plan, ctx = session.plan, session.ctx
    session.user_values = UserValues({n: os.environ.get(n) for n in plan.env},
                                     {k: dask.config.get(k, default=None) for k in planned_config(plan)})
    bootstrap.keep_user_values(session.user_values)  # this process's later plans see the user's view
    os.environ.update(plan.env)
    apply_config(plan)
    if plan.cpu_affinity and session.role == "worker":
        bind_cpus(plan.cpu_affinity, ctx)
    if plan.interface and not ctx.facts.described and session.role in ("worker", "scheduler", "nanny"):
        # a worker of a nanny: its Worker under construction; dask scheduler / dask worker: the
        # command's own --interface (the nannies, and through them their workers)
        setter = runtime.set_listen_interface if session.role == "worker" and cli is None \
            else runtime.set_cli_interface
        outcome = setter(plan.interface)
        if outcome != "applied":
            logger.info("gpudask: listen interface %s %s", plan.interface, outcome)
    session.manager.context_init(ctx, plan)
    if session.role == "client":
        session.manager.client_setup(ctx, plan)
    if session.role == "worker":
        session.memory = setup_memory(session.manager, ctx, plan)
    session.applied = True


def setup_memory(manager: Any, ctx: Any, plan: ProcessPlan) -> dict[str, Any]:
    """``gpudask_setup_memory`` once per process: later calls (a late WorkerPlugin, a second
    preload, a re-plan) get what the first returned, so a pool is never built twice."""
    done = process_state.current().memory_setup
    if os.getpid() not in done:
        done[os.getpid()] = manager.setup_memory(ctx, plan)
    return done[os.getpid()]


def apply_config(plan: ProcessPlan) -> dict[str, Any]:
    """Put the plan's dask config in place; returns the keys that had another value (called
    again in ``dask_setup``: a nanny's worker process loads its nanny's config after import)."""
    import dask.config

    config = planned_config(plan)
    changed = {key: value for key, value in config.items() if dask.config.get(key, default=None) != value}
    if changed:
        dask.config.set(changed)
    return changed


def planned_config(plan: ProcessPlan) -> dict[str, Any]:
    """The dask config ``plan`` sets (its start method included)."""
    config = dict(plan.config)
    if plan.multiprocessing_method:
        config["distributed.worker.multiprocessing-method"] = plan.multiprocessing_method
    return config


def _gpudask_modules(session: Session) -> list[str]:
    """gpudask's modules a worker imports as it starts: its preload and the built-in plugins
    (a third party's module may do anything at import: not imported ahead)."""
    builtins = [p.obj.__name__ for p in session.manager.plugins
                if p.source == "builtin" and isinstance(p.obj, types.ModuleType)]
    return ["gpudask.apply.preload", "gpudask.plugin.manager", *builtins]


def _start_forkserver(preimport_modules: list[str]) -> None:
    """Start the fork server now, before this process opens UCX or CUDA, so worker processes
    are forked from a clean parent that imported what they import (``gpudask_preimport``)."""
    import multiprocessing
    import multiprocessing.forkserver

    import dask.config

    import gpudask_forkserver  # here its preload finds no list: it imports nothing

    # gpudask_forkserver imports them, every error caught (a failing import must not end the server)
    multiprocessing.get_context("forkserver").set_forkserver_preload(["distributed", "gpudask_forkserver"])
    # forked workers inherit the server's environment: what a nanny gives a spawned worker
    pre_spawn = {k: str(v) for k, v in (dask.config.get("distributed.nanny.pre-spawn-environ", default=None)
                                        or {}).items()}
    if pre_spawn.get("PYTHONHASHSEED") in (None, "0"):
        pre_spawn["PYTHONHASHSEED"] = "6640"
    pre_spawn[gpudask_forkserver.VARIABLE] = ",".join(preimport_modules)
    _short_multiprocessing_tempdir()
    saved = {k: os.environ.get(k) for k in pre_spawn}
    os.environ.update(pre_spawn)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        bootstrap.put_env(os.environ, saved)


# the fork server listens on <multiprocessing's temp dir>/listener-XXXXXXXX: a Unix socket, whose
# path the kernel limits to 107 bytes (sun_path); the temp dir is <TMPDIR>/pymp-XXXXXXXX
_SUN_PATH_MAX = 107
_LISTENER_NAME = len("/listener-") + 8
_PYMP_NAME = len("/pymp-") + 8


def _short_multiprocessing_tempdir() -> None:
    """A TMPDIR too long for the fork server's socket fails with ``AF_UNIX path too long``
    (Python 3.11 and 3.12 do not fall back): make multiprocessing's temp dir in ``/tmp``
    instead; where that is impossible too, one line naming TMPDIR."""
    import tempfile
    from multiprocessing import util

    def fits(directory: str) -> bool:  # a temp dir of multiprocessing's in ``directory``
        return len(os.fsencode(directory)) + _PYMP_NAME + _LISTENER_NAME <= _SUN_PATH_MAX

    if fits(tempfile.gettempdir()):
        return  # the usual case
    short = next((d for d in ("/tmp", "/var/tmp", "/dev/shm")
                  if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK) and fits(d)), None)
    if short is not None:
        saved, tempfile.tempdir = tempfile.tempdir, short
        try:
            chosen = util.get_temp_dir()  # cached by multiprocessing for this process
        finally:
            tempfile.tempdir = saved
        if fits(os.path.dirname(chosen)):
            logger.info("gpudask: TMPDIR is too long for the fork server's Unix socket: it listens in %s",
                        chosen)
            return
    raise GpudaskError(
        f"TMPDIR={tempfile.gettempdir()} is too long for the fork server's Unix socket (a socket path "
        f"may have {_SUN_PATH_MAX} bytes) and /tmp is not writable; accepted: a TMPDIR of at most "
        f"{_SUN_PATH_MAX - _LISTENER_NAME - _PYMP_NAME} bytes, or distributed.worker.multiprocessing-method: spawn")


def bind_cpus(cpus: list[int], ctx: Any) -> None:
    if ctx.facts.described:
        return  # the CPUs of a described host are not this machine's
    try:
        allowed = os.sched_getaffinity(0)
        target = set(cpus) & allowed
        if not target:
            logger.warning("gpudask: CPU affinity %s not applied: none of these CPUs is allowed to this process "
                           "(allowed: %s)", cpus, sorted(allowed))
            return
        # pid 0 is only the calling thread: bind the threads that already exist too (BLAS pools...)
        try:
            threads = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            threads = [0]
        for tid in threads:
            try:
                os.sched_setaffinity(tid, target)
            except ProcessLookupError:
                pass  # the thread ended meanwhile
    except OSError as e:  # e.g. EINVAL under Slurm cgroups: never fail the start for it
        logger.warning("gpudask: could not set CPU affinity %s: %s", cpus, e)


def startup_line(session: Session) -> str:
    from gpudask._version import __version__

    plugins = ", ".join(f"{p['name']}({p['priority']})" for p in session.host.plugins)
    where = session.role + (f" {session.plan.index}" if session.plan.index is not None else "")
    ahead = ", planned while the scheduler started" if session.planned_ahead else ""
    return f"gpudask {__version__} ({where}, protocol {session.host.protocol}{ahead}): plugins {plugins or 'none'}"

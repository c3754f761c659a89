"""This process's part of the plan, applied once (the apply stage).

:func:`start` plans for a *planning* process (``dask scheduler``, the ``dask worker`` process
that hosts the nannies, a client) and applies its part; :func:`start_worker` applies a nanny's
worker process's part, taken from the host plan its parent wrote (:mod:`gpudask.apply.hostfile`):
a worker process never plans again.  Each process keeps one :class:`Session`.
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
from gpudask.apply import hostfile, preimport, runtime
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
    # the live state read after apply (gpudask.apply.state.read) and its differences from the plan
    state: dict[str, Any] = field(default_factory=dict)
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    # the user's values of what apply changed (later plans of this process start from them)
    user_values: UserValues = field(default_factory=UserValues)
    # a worker process whose host plan a planning parent made: the parent said its warnings
    planned_by_parent: bool = False
    # the nanny host planned and applied for the likely protocol before its scheduler was up
    planned_ahead: bool = False

    @property
    def manager(self) -> Any:
        return self.host.ctx.manager

    @property
    def ctx(self) -> Any:
        return self.host.ctx

    def published(self) -> Published:
        """JSON-compatible summary for the worker's startup information / scheduler (its
        shape: :class:`gpudask.pluginapi.Published`)."""
        from gpudask._version import __version__

        # the parts are built as plain dicts; tests/test_published_shape.py holds them to the type
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
        # a plan-only session (e.g. a LocalCluster's scheduler inside a client process)
        # never replaces the one this process applied
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
    """``dask worker --scheduler-file F`` started beside the scheduler waits for F, which says
    the protocol.  The plan inputs do not depend on it (settings, plugins, facts): build them
    now and import, in a background thread, what the plugins say this process will import.
    Where a plugin names the likely protocol (``gpudask_likely_protocol``: UCX on a GPU host),
    plan and apply for it now -- the fork server starts importing, the host plan is published
    and the transport opened (``gpudask_listen_ahead``) while the scheduler starts (issue 41:
    the wait was idle, then planning, UCX's start and the fork server's imports came one after
    the other).  The session, when the scheduler's protocol is the one planned for; None when
    there was nothing to do ahead, or it planned for another protocol (then everything the
    plan applied to this process's environment and dask config is put back, with one info line,
    and the caller plans for the scheduler's protocol)."""
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
    # only now: a thread importing cupy and ucxx holds the GIL for most of a second, and the plan,
    # its publication and the fork server's start (the workers' critical path) waited on it
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
    """A nanny's worker process: take this worker's plan from the host plan and apply it (at
    the first ``import gpudask`` of the process, whoever imports it)."""
    locals_ = locals_ or {}
    index = runtime.worker_index(str(locals_["nanny"]) if locals_.get("nanny") else None)
    # loaded before this process planned or read anything: by the fork server it was forked from
    found_loaded = sorted(m for m in sys.modules if m.startswith("gpudask.plugins."))
    host = hostfile.load()
    by_parent = host is not None
    if host is not None:
        hostfile.restore_user_values(host)  # what the planning parent changed for itself
    else:
        # no planning parent (e.g. LocalCluster(preload=["gpudask"]) without gpudask.initialize()):
        # this process plans for itself, once, only what it applies (planner="worker")
        protocol = (locals_.get("protocol") or runtime.protocol_from(locals_.get("scheduler_ip"),
                                                                       locals_.get("scheduler_file")) or "tcp")
        planned = max(1, len(bootstrap.inputs().facts.visible_gpus()))  # what plan_host plans for by default
        host = plan_host(protocol.split("://", 1)[0], None if index < planned else index + 1,
                         user_interface=locals_.get("interface"), planner="worker")
    if index >= host.nworkers:
        # more workers than the parent planned for (scale-up beyond it): this worker's plan is
        # the one for index+1 workers, made here, once (GPUs shared round-robin, with a warning)
        host = plan_host(host.protocol, index + 1, planner="worker")
        by_parent = False  # a plan of its own, with its own warning (GPUs now shared)
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
    """At the exit of a nanny's worker process: keep CPython's finalization from collecting
    every object of the process.  distributed kills a worker process still alive 4 s (8 s)
    after its close, and collecting the ~94,000 objects of a worker with UCX and RMM took
    1.2-3.9 s (``lab/fresh-machine/``); frozen, they are left to the operating system, as in a
    forked child that leaves through ``os._exit``.  Module globals are still cleared."""
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
    """``gpudask_setup_memory`` once per process: every later call (a late WorkerPlugin, a
    second preload, a re-plan) gets what the first returned, so a pool is never built twice."""
    done = process_state.current().memory_setup
    kept = done.get(os.getpid())
    if kept is None:
        kept = manager.setup_memory(ctx, plan)
        done[os.getpid()] = kept
    return kept


def forget_memory_setup() -> None:
    """Forget what :func:`setup_memory` kept in this process (for tests that set up twice)."""
    process_state.current().memory_setup.pop(os.getpid(), None)


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
    this plan loads (a third party's module may do anything at import: the worker imports it)."""
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
    # forked workers inherit the server's interpreter: give it what a nanny gives a spawned
    # worker at start (MALLOC_TRIM_THRESHOLD_, PYTHONHASHSEED=6640), in its environment only
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
# path the kernel limits to 107 bytes (sun_path)
_SUN_PATH_MAX = 107
_LISTENER_NAME = len("/listener-") + 8


def _short_multiprocessing_tempdir() -> None:
    """A TMPDIR too long for the fork server's socket fails with ``AF_UNIX path too long``
    (Python 3.11 and 3.12 do not fall back): make multiprocessing's ``pymp-*`` temp dir in
    ``/tmp`` instead; where that is impossible too, one line naming TMPDIR."""
    import tempfile
    from multiprocessing import util

    def fits(directory: str) -> bool:
        return len(os.fsencode(directory)) + _LISTENER_NAME <= _SUN_PATH_MAX

    pymp = len("/pymp-") + 8
    if fits(os.path.join(tempfile.gettempdir(), "x" * (pymp - 1))):
        return  # the usual case: multiprocessing's own choice fits
    saved = tempfile.tempdir
    for short in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(short) and os.access(short, os.W_OK | os.X_OK) and fits(short + "x" * pymp):
            tempfile.tempdir = short
            try:
                chosen = util.get_temp_dir()  # cached by multiprocessing for this process
            finally:
                tempfile.tempdir = saved
            if fits(chosen):
                logger.info("gpudask: TMPDIR is too long for the fork server's Unix socket: it listens in %s",
                            chosen)
                return
            break
    raise GpudaskError(
        f"TMPDIR={tempfile.gettempdir()} is too long for the fork server's Unix socket (a socket path "
        f"may have {_SUN_PATH_MAX} bytes) and /tmp is not writable; accepted: a TMPDIR of at most "
        f"{_SUN_PATH_MAX - _LISTENER_NAME - pymp} bytes, or distributed.worker.multiprocessing-method: spawn")


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

"""Plan for this host and apply this process's part of it (DESIGN §2, §1).

``plan_host`` is what ``gpudask info`` prints; ``start`` is what ``--preload gpudask``
does at import time in a scheduler, nanny-host or worker process, and what
:func:`gpudask.initialize` does in a client.  Both go through the same code, so a
worker gets exactly what ``gpudask info`` says for the same host and config.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from gpudask import runtime
from gpudask.errors import GpudaskError
from gpudask.plan import HostPlan, ProcessPlan
from gpudask.plan.host import plan_host

logger = logging.getLogger("gpudask")


@dataclass
class Session:
    """What gpudask did in this process."""

    role: str
    host: HostPlan
    plan: ProcessPlan
    memory: dict[str, Any] = field(default_factory=dict)
    applied: bool = False

    @property
    def manager(self) -> Any:
        return self.host.ctx.manager

    @property
    def ctx(self) -> Any:
        return self.host.ctx

    def published(self) -> dict[str, Any]:
        """JSON-compatible summary for the worker's startup information / scheduler."""
        from gpudask import __version__

        return {"version": __version__, "role": self.role, "protocol": self.host.protocol,
                "facts": self.host.facts.to_dict(), "facts_origin": self.host.facts.origin,
                "plugins": self.host.plugins, "plan": self.plan.to_dict(), "memory": self.memory}


_SESSION: Session | None = None


def current() -> Session | None:
    return _SESSION


def start(role: str, cli: runtime.CliArgs | None = None, protocol: str | None = None,
          nworkers: int | None = None, apply: bool = True) -> Session:
    """Plan for this host and apply this process's part (``role``)."""
    global _SESSION
    if role == "worker":
        runtime.restore_parent_changes()
    locals_ = runtime.worker_init_locals() if role == "worker" else {}
    if cli is not None:
        protocol = protocol or cli.protocol or runtime.protocol_from(cli.scheduler_address, cli.scheduler_file)
        nworkers = nworkers or cli.nworkers
    if locals_:
        protocol = protocol or locals_.get("protocol") or runtime.protocol_from(
            locals_.get("scheduler_ip"), locals_.get("scheduler_file"))
    protocol = protocol or os.environ.get("GPUDASK_PROTOCOL") or "tcp"
    protocol = protocol.split("://", 1)[0]  # LocalCluster passes Worker(protocol="tcp://")
    nworkers = nworkers or runtime.int_env("GPUDASK_NWORKERS")
    index = runtime.worker_index(locals_) if role == "worker" else None
    if index is not None and nworkers is not None:
        nworkers = max(nworkers, index + 1)
    elif index is not None:
        nworkers = None  # default: one per visible GPU; widened below if needed
    # the nanny passes the CLI's --interface to its workers as Worker(interface=...)
    interface = (cli.interface if cli is not None else None) or locals_.get("interface")
    host = plan_host(protocol, nworkers, user_interface=interface)
    if index is not None and index >= host.nworkers:
        host = plan_host(protocol, index + 1, user_interface=interface)
    plan = host.for_role(role, index)
    session = Session(role, host, plan)
    if apply or _SESSION is None or not _SESSION.applied:
        # a plan-only session (e.g. a LocalCluster's scheduler inside a client process)
        # never replaces the one this process applied
        _SESSION = session
    if apply:
        apply_plan(session)
        _export_for_children(session)
        if role in ("nanny", "client") and plan.multiprocessing_method == "forkserver":
            _start_forkserver()
    return session


def apply_plan(session: Session) -> None:
    """Environment, config, CPU binding, start method, then the apply hooks."""
    import dask.config

    plan, ctx = session.plan, session.ctx
    shadow = runtime.load_shadow()
    for name, value in plan.env.items():
        if os.environ.get(name) != value:
            shadow["env"].setdefault(name, os.environ.get(name))
            os.environ[name] = value
    config = dict(plan.config)
    if plan.multiprocessing_method:
        config["distributed.worker.multiprocessing-method"] = plan.multiprocessing_method
    for key, value in config.items():
        current = dask.config.get(key, default=None)
        if current != value:
            shadow["config"].setdefault(key, current)
            dask.config.set({key: value})
    os.environ[runtime.SHADOW_ENV] = json.dumps(shadow)
    if plan.cpu_affinity and session.role == "worker":
        _bind_cpus(plan.cpu_affinity, ctx)
    if plan.interface and session.role == "worker" and not ctx.facts.described:
        outcome = runtime.set_listen_interface(plan.interface)
        if outcome != "applied":
            logger.info("gpudask: listen interface %s %s", plan.interface, outcome)
    session.manager.context_init(ctx, plan)
    if session.role == "worker":
        session.memory = session.manager.setup_memory(ctx, plan)
    session.applied = True


def _start_forkserver() -> None:
    """Start the fork server now, before this process opens UCX or CUDA, so worker
    processes are forked from a clean parent (with the environment exported above)."""
    import multiprocessing
    import multiprocessing.forkserver

    import dask.config

    multiprocessing.get_context("forkserver").set_forkserver_preload(["distributed"])
    # Workers forked from the server inherit its interpreter: give it what a nanny gives a
    # spawned worker at interpreter start (MALLOC_TRIM_THRESHOLD_, PYTHONHASHSEED=6640 as in
    # distributed's Nanny), in the server's environment only.
    pre_spawn = {k: str(v) for k, v in (dask.config.get("distributed.nanny.pre-spawn-environ", default=None)
                                        or {}).items()}
    if pre_spawn.get("PYTHONHASHSEED") in (None, "0"):
        pre_spawn["PYTHONHASHSEED"] = "6640"
    saved = {k: os.environ.get(k) for k in pre_spawn}
    os.environ.update(pre_spawn)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _bind_cpus(cpus: list[int], ctx: Any) -> None:
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


def _export_for_children(session: Session) -> None:
    """What child processes (a nanny's workers) need to plan the same way."""
    host = session.host
    os.environ["GPUDASK_PROTOCOL"] = host.protocol
    os.environ["GPUDASK_NWORKERS"] = str(host.nworkers)
    if session.role in ("nanny", "client"):
        os.environ.setdefault("GPUDASK_GROUP", f"pid-{os.getpid()}")
    if not host.facts.described:
        os.environ["GPUDASK_PROBED_FACTS"] = json.dumps(host.facts.to_dict())


def startup_line(session: Session) -> str:
    from gpudask import __version__

    plugins = ", ".join(f"{p['name']}({p['priority']})" for p in session.host.plugins)
    where = session.role + (f" {session.plan.index}" if session.plan.index is not None else "")
    return f"gpudask {__version__} ({where}, protocol {session.host.protocol}): plugins {plugins or 'none'}"


def fail_clean(error: GpudaskError) -> None:
    logger.error("gpudask: %s", error)

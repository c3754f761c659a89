"""The preload entry points: import time, ``dask_setup``, and ``initialize`` for clients."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

from gpudask import runtime, session
from gpudask.errors import GpudaskError

logger = logging.getLogger("gpudask")


def _ensure_log_handler() -> None:
    """distributed configures only its own loggers; show gpudask's INFO lines the same way."""
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def on_import() -> None:
    """Run at ``import gpudask`` in a dask CLI or worker process (before ``listen()``)."""
    role, cli = runtime.detect_role()
    if role == "client":
        return
    if not _imported_by_distributed_preload():
        # Imported late in a running server (e.g. while unpickling a plugin registered by
        # a client): too late for import-time apply; gpudask.distributed_plugins handles it.
        return
    _ensure_log_handler()
    try:
        s = session.start(role, cli)
    except GpudaskError as e:
        logger.error("gpudask: %s", e)
        if cli is not None:
            import click

            # inside the CLI's option callback: click prints "Error: ..." and exits 1
            raise click.ClickException(f"gpudask: {e}") from None
        raise
    logger.info(session.startup_line(s))
    for warning in s.host.warnings:
        logger.warning("gpudask: %s", warning)


def _imported_by_distributed_preload() -> bool:
    """Is this import run by distributed's preload machinery (``--preload``,
    ``--preload-nanny``, ``distributed.*.preload``), i.e. before ``listen()``?"""
    suffix = os.path.join("distributed", "preloading.py")
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(suffix):
            return True
        frame = frame.f_back
    return False


def initialize(protocol: str | None = None, nworkers: int | None = None) -> session.Session:
    """Apply the client's part of the plan in this process (call before creating a Client
    or a cluster, like dask-cuda's ``initialize``): UCX environment and config, the
    CUDA-context check.  Returns the session; calling it again returns the same one."""
    existing = session.current()
    if existing is not None and existing.role == "client":
        return existing
    return session.start("client", protocol=protocol, nworkers=nworkers)


def _session_for(role: str) -> session.Session:
    """The session of this process, or a plan-only one when gpudask was imported too late
    to act at import time (e.g. a scheduler inside a LocalCluster in a client process)."""
    s = session.current()
    if s is not None and (s.role == role or (role == "nanny" and s.role == "nanny")):
        return s
    return session.start(role, apply=False)


def dask_setup(server: Any) -> None:
    """distributed calls this after ``listen()``, before a worker registers."""
    from distributed import Nanny, Scheduler, Worker

    if isinstance(server, Worker):
        s = _session_for("worker")
        _setup_worker(s, server)
    elif isinstance(server, Nanny):
        s = _session_for("nanny")
        _setup_nanny(s, server)
    elif isinstance(server, Scheduler):
        s = _session_for("scheduler")
        s.manager.preload(s.ctx, s.plan, server)
        from gpudask.dashboard import install  # TEMPORARY wiring (dash branch), lead redoes it
        from gpudask.prometheus import register_scheduler_collector

        install(server)
        register_scheduler_collector(server)
    else:  # pragma: no cover - distributed has no other servers that preload
        return


def _setup_worker(s: session.Session, worker: Any) -> None:
    published = s.published()
    worker.startup_information["gpudask"] = lambda _worker: published
    if s.plan.resources and not worker.state.total_resources:
        # resources are read in Worker.__init__ before the preload; the worker has not
        # registered yet, so setting them here is what the scheduler sees first
        for name, amount in s.plan.resources.items():
            worker.state.total_resources[name] = amount
            worker.state.available_resources[name] = amount
    s.manager.preload(s.ctx, s.plan, worker)
    from gpudask.prometheus import register_worker_collector  # TEMPORARY wiring (dash branch), lead redoes it

    register_worker_collector(worker)


_NANNY_INDEX: dict[int, int] = {}


def _setup_nanny(s: session.Session, nanny: Any) -> None:
    """``--preload-nanny gpudask``: give this nanny's worker process its plan through
    ``nanny.env``, which survives restarts (the same nanny respawns the same worker)."""
    index = _NANNY_INDEX.setdefault(id(nanny), len(_NANNY_INDEX))
    if index >= len(s.host.workers):
        s = session.start("nanny", protocol=s.host.protocol, nworkers=index + 1, apply=False)
    plan = s.host.workers[index]
    shadow = runtime.load_shadow()
    for name, value in plan.env.items():
        shadow["env"].setdefault(name, os.environ.get(name))
    nanny.env.update(plan.env)
    nanny.env["GPUDASK_WORKER_INDEX"] = str(index)
    nanny.env[runtime.SHADOW_ENV] = json.dumps(shadow)
    s.manager.preload(s.ctx, s.plan, nanny)

"""The forkserver start method for worker processes: on GPU hosts, and always with InfiniBand.

A process that has opened InfiniBand through UCX must not ``fork()`` (the child shares its pinned
memory copy-on-write, which can corrupt data), and the nanny opens UCX before it starts its
workers: a fork server started at gpudask's import, before UCX, starts them.  On any GPU host it is
also the faster start (docs/process-start.md); the server never imports CUDA libraries.  Opt-in
diagnostics (``gpudask.forkserver.diagnose-fork``) name the process and code of a fork after UCX.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import traceback
from typing import TYPE_CHECKING

from gpudask.pluginapi import Option, hookimpl, parse_bool, parse_optional_bool

if TYPE_CHECKING:
    from gpudask.pluginapi import PlanContext, ProcessPlan

name = "forkserver"
priority = 30
# `dask cuda worker --multiprocessing-method`: the start method is this plugin's decision
dask_cuda_refused_options = {
    "--multiprocessing-method": "the start method is automatic (forkserver on a GPU host); to choose it, "
                                "DASK_DISTRIBUTED__WORKER__MULTIPROCESSING_METHOD=spawn (stock dask config, wins over "
                                "detection) or DASK_GPUDASK__FORKSERVER__ENABLED=false",
}

ENABLED = "gpudask.forkserver.enabled"
DIAGNOSE = "gpudask.forkserver.diagnose-fork"
METHOD_KEY = "distributed.worker.multiprocessing-method"

logger = logging.getLogger("distributed.gpudask")


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [
        Option(ENABLED, None, "Start worker processes with the forkserver method: null = on a host with a GPU or when "
               "UCX uses an active InfiniBand port, true = always, false = never.", parse_optional_bool,
               "true, false or null (auto)"),
        Option(DIAGNOSE, False, "Diagnose fork() after UCX opened InfiniBand: UCX_IB_FORK_INIT=n makes UCX warn at "
               "such a fork and gpudask names the process and the Python code that forked.", parse_bool,
               "true or false"),
    ]


def _active_infiniband(ctx: PlanContext) -> list[str]:
    """The active InfiniBand ports ("mlx5_0:1") of the infiniband plugin's facts section, if any."""
    section = ctx.facts.section("infiniband") or {}
    ports = [p for p in section.get("ports", []) if p.get("state") == "ACTIVE" and p.get("link_layer") == "InfiniBand"]
    return [f"{p['name']}:{p['port']}" for p in sorted(ports, key=lambda p: (p["name"], p["port"]))]


def _decide(ctx: PlanContext) -> tuple[bool, str]:
    """(use forkserver?, why) -- the same answer for every plan of the host."""
    setting = ctx.require(ENABLED)
    ib = _active_infiniband(ctx)
    if setting.value is True:
        return True, f"{ENABLED}=true (from {setting.source})"
    if setting.value is False:
        if ib and ctx.uses_ucx:
            return False, (f"{ENABLED}=false (from {setting.source}) although UCX uses InfiniBand "
                           f"({', '.join(ib)}): processes forked after UCX opened it are not fork-safe")
        return False, f"{ENABLED}=false (from {setting.source})"
    infiniband = bool(ib and ctx.uses_ucx)
    if not infiniband and not ctx.gpus:
        why = "no GPU visible and " + ("no active InfiniBand port" if not ib else
                                       f"protocol {ctx.protocol} does not use UCX")
        return False, f"{why}: worker processes start as distributed's config says"
    user_method = ctx.user_dask_config(METHOD_KEY)
    if user_method and user_method != "forkserver":
        if infiniband:
            ctx.warn(f"{METHOD_KEY}={user_method!r} set by the user while UCX uses InfiniBand ({', '.join(ib)}): a "
                     f"fork after UCX opened InfiniBand can corrupt registered memory; gpudask would use forkserver")
        return False, f"{METHOD_KEY}={user_method!r} set by the user (explicit settings win)"
    if infiniband:
        return True, (f"UCX over InfiniBand ({', '.join(ib)}): workers forked from a server started before UCX "
                      "opens it (not fork-safe after)")
    return True, ("GPU workers start sooner: each is forked from a server that has already imported distributed, "
                  "instead of starting an interpreter and importing it (see docs/process-start.md); the server "
                  "never touches CUDA, so its children are as clean as spawned ones")


@hookimpl
def gpudask_plan_process(ctx: PlanContext, plan: ProcessPlan) -> None:
    if plan.role == "scheduler":
        return  # the scheduler starts no worker processes
    use, why = _decide(ctx)
    if use:
        if plan.role == "worker":
            why = "started by its nanny's fork server"
        plan.set_multiprocessing_method("forkserver", why)
        if plan.role == "worker":
            plan.set_env("PTXCOMPILER_CHECK_NUMBA_CODEGEN_PATCH_NEEDED", "0",
                         "no fork at import: ptxcompiler (imported by cudf) would start a subprocess")
    elif plan.role == "nanny":
        plan.note("forkserver not used", why)
    if ctx.value(DIAGNOSE):
        plan.set_env("UCX_IB_FORK_INIT", "n",
                     f"{DIAGNOSE}=true: UCX skips ibv_fork_init() and warns at any fork() after it opened "
                     "InfiniBand; gpudask names the process and the code that forked")


# -- diagnostics ---------------------------------------------------------------------
_WATCHING = False


@hookimpl
def gpudask_context_init(ctx: PlanContext, plan: ProcessPlan) -> None:
    global _WATCHING
    if not ctx.value(DIAGNOSE) or _WATCHING:
        return
    _WATCHING = True
    where = plan.role + (f" {plan.index}" if plan.index is not None else "")
    logger.info("gpudask: fork diagnostics on in %s (pid %d): a UCX warning 'ibv_fork_init() was disabled or "
                "failed, yet a fork() has been issued' from this process means it forked after UCX opened InfiniBand",
                where, os.getpid())

    os.register_at_fork(before=functools.partial(_before_fork, where))


def _before_fork(where: str) -> None:
    module = sys.modules.get("distributed_ucxx.ucxx")  # never imported here
    if module is None or getattr(module, "ucxx", None) is None:
        return  # this process has not initialised UCX through distributed-ucxx
    try:
        stack = "".join(traceback.format_stack(limit=9)[:-1]).rstrip()  # without this frame
        logger.warning("gpudask: %s (pid %d) is forking after UCX initialised: if UCX opened an InfiniBand device "
                       "here, the child shares its registered memory copy-on-write and data may be corrupted (UCX "
                       "warns 'ibv_fork_init() was disabled or failed, yet a fork() has been issued'). Start "
                       "processes with 'forkserver' or 'spawn' instead (for worker processes: %s). The fork comes "
                       "from:\n%s", where, os.getpid(), ENABLED, stack)
    except Exception:  # noqa: BLE001 - never break a fork for a diagnostic
        pass

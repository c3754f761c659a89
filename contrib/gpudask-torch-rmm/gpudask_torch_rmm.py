"""gpudask plugin ``torch-rmm``: PyTorch's CUDA allocations come from RMM in dask workers.

PyTorch's own caching allocator competes with a worker's RMM pool (the ``rmm`` plugin) for the
GPU: this plugin asks rmm, through the plan, to count PyTorch among the pool's users, and points
PyTorch at ``rmm_torch_allocator`` right after rmm built the pool, before ``listen()`` and any task
(it can only change before PyTorch allocates).  torch and rmm are imported only in that hook.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import Option, hookimpl, parse_bool

if TYPE_CHECKING:
    from gpudask.pluginapi import PlanContext, ProcessPlan

name = "torch-rmm"
priority = 110  # gpudask_setup_memory after rmm's (100): the pool exists when PyTorch is pointed at it
# rmm's section (its libraries, its pool), read in gpudask_plan_finish, the step after rmm decides
reads_sections = ("rmm",)

ENABLED = "gpudask.torch-rmm.enabled"
DECISION = "torch allocator: rmm"

logger = logging.getLogger("distributed.gpudask.torch-rmm")

_RESULT: dict[str, Any] | None = None  # what was done in this process (a second call reports it)


@hookimpl
def gpudask_facts_packages() -> dict[str, list[str]]:
    # both must be installed for PyTorch to allocate through RMM
    return {"torch": ["torch"], "rmm": ["rmm", "rmm-cu12", "rmm-cu13"]}


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [Option(ENABLED, True,
                   "Point PyTorch's CUDA allocator at RMM in workers (plugin torch-rmm; needs torch and rmm in the "
                   "workers and a GPU).", parse_bool, "true or false")]


def wanted(ctx: PlanContext) -> tuple[bool, str]:
    """(on, why) from the settings and the facts alone (before rmm decided)."""
    setting = ctx.require(ENABLED)
    if not setting.value:
        return False, f"{ENABLED} is false (from {setting.source})"
    if not ctx.gpus:
        return False, "no GPU visible"
    missing = [p for p in ("torch", "rmm") if not ctx.facts.packages.get(p)]
    if missing:
        return False, f"{' and '.join(missing)} not installed on this host"
    return True, ""


def decide(ctx: PlanContext, plan: ProcessPlan) -> tuple[bool, str]:
    """(on, why) for one worker plan, once rmm decided (its section of the plan)."""
    on, why = wanted(ctx)
    if not on:
        return on, why
    rmm = plan.section("rmm")
    if "torch" in (rmm.get("libraries") or []):
        return False, "the rmm plugin already points PyTorch at RMM (gpudask.rmm.libraries lists torch)"
    pool = rmm.get("initial_pool_size")
    shared = f"the worker's RMM pool ({pool} bytes)" if pool else "RMM's current memory resource"
    return True, (f"torch {ctx.facts.packages['torch']} and rmm {ctx.facts.packages['rmm']} installed: PyTorch's "
                  f"CUDA caching allocator is replaced by rmm_torch_allocator, so PyTorch allocates from {shared}")


@hookimpl
def gpudask_plan_process(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Ask the rmm plugin, through the plan, to count PyTorch among its pool's users (a
    default pool is then not capped for PyTorch's sake)."""
    if plan.role != "worker":
        return
    on, _ = wanted(ctx)
    if on:
        plan.request("rmm", {"allocates_through": ["torch"]},
                     "PyTorch's CUDA allocations will come from RMM's current resource (torch-rmm)")


@hookimpl
def gpudask_plan_finish(ctx: PlanContext, plan: ProcessPlan) -> None:
    if plan.role != "worker":
        return
    on, why = decide(ctx, plan)
    plan.note(DECISION if on else "skipped", why)


@hookimpl
def gpudask_setup_memory(ctx: PlanContext, plan: ProcessPlan) -> dict[str, Any] | None:
    """Worker processes only: change PyTorch's allocator (or report why not)."""
    global _RESULT
    if _RESULT is not None:
        return {**_RESULT, "already_set_up": True}
    _RESULT = {**_setup(ctx, plan), "pid": os.getpid()}
    return _RESULT


def _setup(ctx: PlanContext, plan: ProcessPlan) -> dict[str, Any]:
    on, why = decide(ctx, plan)
    if not on:
        return _default(why)
    if ctx.facts.described:
        return _default(f"host described by {ctx.facts.origin}: no real GPU here, PyTorch left alone")
    try:
        import torch
        from rmm.allocators.torch import rmm_torch_allocator
    except ImportError as e:
        return _default(f"cannot import torch / rmm.allocators.torch: {e}")
    if rmm_torch_allocator is None:
        return _default("this torch has no CUDA support (rmm_torch_allocator is None)")
    try:
        torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
    except RuntimeError as e:  # PyTorch already allocated with its own allocator
        logger.warning("gpudask torch-rmm: PyTorch's allocator not changed: %s", e)
        return _default(f"PyTorch refused the change: {str(e).splitlines()[0]}")
    return {"torch_allocator": "rmm", "why": why}


def _default(why: str) -> dict[str, Any]:
    return {"torch_allocator": "default", "why": why}

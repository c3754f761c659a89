"""Dask defaults that break on GPU data, changed where the graph is built; a value the user set wins.

* ``array.rechunk.method``: dask picks P2P for large rechunks with a distributed client, and P2P
  fails on CuPy-backed arrays; ``"tasks"`` where graphs are built (the client, worker_client tasks).
* ``dataframe.shuffle.method``: P2P shuffles go through pyarrow, without cuDF support; ``"tasks"``
  where cuDF is installed (chosen at the client's ``optimize()``).
* ``distributed.comm.offload`` for GPU workers over UCX: read once, when ``distributed.comm.utils``
  is imported, before a worker's plan applies, so copied into ``OFFLOAD_THRESHOLD`` at server setup.

A client without gpudask keeps dask's defaults: :mod:`.p2p` warns it from the scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import Option, hookimpl, offload_threshold, parse_bytes, set_offload_threshold

if TYPE_CHECKING:
    from distributed import Nanny, Scheduler, Worker

    from gpudask.pluginapi import PlanContext, ProcessPlan

name = "gpu-dask-defaults"
priority = 150

RECHUNK_KEY = "array.rechunk.method"
SHUFFLE_KEY = "dataframe.shuffle.method"
OFFLOAD = "gpudask.comm.offload-threshold"
# Measured on one H200 (2026-12-01, lab/bench/pull-levers.py, medians of 15 in-worker pulls, ms at 1 MiB /
# 64 MiB / 1 GiB): distributed's 10 MiB 0.71 / 1.45 / 1.99; 512 MiB 0.57 / 0.58 / 1.73; never 0.91 /
# 0.96 / 1.35; dask cuda worker 0.98 / 1.78 / 2.42.  2 GiB keeps every GPU pull up to 2 GiB inline
# while a host message above it is still handed to a thread.
OFFLOAD_DEFAULT = "2GiB"
OFFLOAD_KEY = "distributed.comm.offload"


def parse_threshold(value: Any) -> int | bool | None:
    """null (distributed's own), false (never offload), or a size in bytes ("512MiB", 2**29)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null", "auto")):
        return None
    if value is False or (isinstance(value, str) and value.strip().lower() in ("false", "off", "no")):
        return False
    if isinstance(value, bool):
        raise ValueError("null, false or a size")
    try:
        size = int(parse_bytes(value)) if isinstance(value, str) else int(value)
    except (ValueError, TypeError, OverflowError):
        size = -1
    if size <= 0 or size > 2**50:
        raise ValueError('null (distributed\'s own, 10 MiB), false (never offload), or a size such as "512MiB"')
    return size


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [Option(OFFLOAD, OFFLOAD_DEFAULT, "distributed.comm.offload for GPU workers over UCX, made to take effect "
                   "in the worker process: a size (messages larger are (de)serialised in a thread; default 2GiB: GPU "
                   "pulls up to 2 GiB stay on the event loop), false = never, null = distributed's own (10 MiB).",
                   parse_threshold, 'a size such as "2GiB", false, or null')]


@hookimpl
def gpudask_plan_process(ctx: PlanContext, plan: ProcessPlan) -> None:
    if plan.role == "worker":
        _plan_offload(ctx, plan)
    if plan.role not in ("worker", "client"):
        return
    gpu = bool(ctx.gpus)
    cupy = [p for p in ("cupy",) if ctx.facts.packages.get(p)]
    cudf = [p for p in ("cudf", "dask-cudf") if ctx.facts.packages.get(p)]
    if plan.role == "worker" and not gpu:
        plan.note("skipped", "no GPU visible: dask's defaults kept")
        return
    if plan.role == "client" and not (gpu or cupy or cudf):
        plan.note("skipped", "no GPU visible and neither CuPy nor cuDF installed: dask's defaults kept")
        return
    where = ("the graph is built here (dask.array.rechunk at the call, or optimize() for array-expr)"
             if plan.role == "client" else "tasks that build graphs (worker_client) read it in the worker")
    what = f"GPU {'worker' if plan.role == 'worker' else 'client'}" + (
        "" if gpu else f" ({', '.join(cupy + cudf)} installed)")
    _set_unless_user(ctx, plan, RECHUNK_KEY, "tasks",
                     f"P2P rechunk fails on CuPy-backed arrays; {what}: {where}")
    if cudf:
        lowered = "here" if plan.role == "client" else "in tasks that build graphs"
        _set_unless_user(ctx, plan, SHUFFLE_KEY, "tasks",
                         f"{', '.join(cudf)} installed: P2P shuffle (pyarrow-based) does not support cuDF "
                         f"data; the method is chosen when the graph is lowered ({lowered})")


def _plan_offload(ctx: PlanContext, plan: ProcessPlan) -> None:
    """A GPU worker over UCX: the threshold asked for, as distributed.comm.offload."""
    setting = ctx.setting(OFFLOAD)
    if setting is None or setting.value is None:
        return
    if not (ctx.uses_ucx and ctx.gpus):
        if setting.explicit:  # the default is for GPU workers over UCX: nothing to say elsewhere
            plan.note(f"{OFFLOAD} not applied", "it is for GPU workers over UCX, whose large messages are GPU frames")
        return
    user = ctx.user_dask_config(OFFLOAD_KEY)
    if user is not None:
        plan.note(f"{OFFLOAD_KEY} kept at {user!r}", "set by the user (explicit settings win)")
        return
    value = setting.value
    what = "never" if value is False else f"above {value} bytes"
    plan.set_config(OFFLOAD_KEY, value,
                    f"{OFFLOAD}={value!r} (from {setting.source}): (de)serialisation handed to a thread {what}; "
                    "the hand-off doubled a 64 MiB GPU pull on an H200 (1.83 -> 0.77 ms without it)")


def _set_unless_user(ctx: PlanContext, plan: ProcessPlan, key: str, value: str, why: str) -> None:
    user = ctx.user_dask_config(key)
    if user is not None:
        plan.note(f"{key} kept at {user!r}", f"set by the user (explicit settings win); gpudask would choose "
                                              f"{value!r}: {why}")
        return
    plan.set_config(key, value, why)


@hookimpl
def gpudask_server_setup(ctx: PlanContext, plan: ProcessPlan, server: Scheduler | Worker | Nanny) -> None:
    """On the scheduler: tell a client whose graph rechunks with P2P while GPU workers are connected.
    In a worker: the planned offload threshold, where distributed's comms read it."""
    from distributed import Scheduler

    if plan.role == "worker" and OFFLOAD_KEY in plan.config:
        set_offload_threshold(plan.config[OFFLOAD_KEY])
    if plan.role != "scheduler" or not isinstance(server, Scheduler):
        return
    from .p2p import NAME, P2PRechunkWarning

    if NAME not in server.plugins:
        server.add_plugin(P2PRechunkWarning(), name=NAME, idempotent=True)


@hookimpl
def gpudask_applied_state(ctx: PlanContext, plan: ProcessPlan) -> dict[str, dict[str, Any]] | None:
    """The offload threshold distributed's comms use in this worker, against the plan."""
    if plan.role != "worker" or OFFLOAD_KEY not in plan.config:
        return None
    return {"distributed.comm.utils.OFFLOAD_THRESHOLD": {"planned": plan.config[OFFLOAD_KEY],
                                                         "actual": offload_threshold()}}

"""Dask defaults that break on GPU data, changed where the graph is built.

* ``array.rechunk.method``: dask picks P2P rechunking for large rechunks whenever a
  distributed client exists; P2P fails on CuPy-backed arrays ("P2P ... failed during
  transfer phase", seen on an H200 over tcp and ucx).  The method is read where the graph
  is *built* -- ``dask.array.rechunk`` at the call (``_choose_rechunk_method``), or the
  array-expr ``Rechunk._lower`` at ``optimize()`` -- which is the client, and a worker
  when a task builds graphs itself (``worker_client``).  The scheduler only materialises
  graphs whose method is already chosen.  So the client plan and the GPU worker plans
  get ``"tasks"``.
* ``dataframe.shuffle.method``: P2P shuffling goes through pyarrow tables and is not
  supported for cuDF data (dask-cudf accepts tasks and explicit-comms only).  Chosen at
  lowering (``get_default_shuffle_method``), i.e. in the client's ``optimize()``; set
  to ``"tasks"`` where cuDF is installed.

* ``distributed.comm.offload`` for GPU workers over UCX, when ``gpudask.comm.offload-threshold``
  asks for one, made to take effect in the worker process (:mod:`.offload`).

A value the user set (``dask.config`` / YAML / ``DASK_ARRAY__RECHUNK__METHOD``) always wins.

A client that does not import gpudask keeps dask's default.  On the scheduler this plugin
installs :class:`gpudask.plugins.dask_defaults.p2p.P2PRechunkWarning`: a client whose graph
rechunks with P2P while GPU workers are connected gets one warning naming the fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import hookimpl

from . import offload

if TYPE_CHECKING:
    from distributed import Nanny, Scheduler, Worker

    from gpudask.pluginapi import Option, PlanContext, ProcessPlan

name = "gpu-dask-defaults"
priority = 150

RECHUNK_KEY = "array.rechunk.method"
SHUFFLE_KEY = "dataframe.shuffle.method"


def _installed(ctx: PlanContext, *packages: str) -> list[str]:
    return [p for p in packages if ctx.facts.packages.get(p)]


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [offload.option()]


@hookimpl
def gpudask_plan_process(ctx: PlanContext, plan: ProcessPlan) -> None:
    offload.plan_offload(ctx, plan)
    if plan.role not in ("worker", "client"):
        return
    gpu = bool(ctx.gpus)
    cupy = _installed(ctx, "cupy")
    cudf = _installed(ctx, "cudf", "dask-cudf")
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

    offload.apply_offload(plan)
    if plan.role != "scheduler" or not isinstance(server, Scheduler):
        return
    from .p2p import NAME, P2PRechunkWarning

    if NAME not in server.plugins:
        server.add_plugin(P2PRechunkWarning(), name=NAME, idempotent=True)


@hookimpl
def gpudask_applied_state(ctx: PlanContext, plan: ProcessPlan) -> dict[str, dict[str, Any]] | None:
    """The offload threshold distributed's comms use in this worker, against the plan."""
    return offload.applied(plan)

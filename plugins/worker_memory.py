"""Each GPU worker's host memory limit: the host's memory split between its workers, as
dask-cuda's ``dask cuda worker`` (and ``LocalGPUCluster``) give it; an explicit ``--memory-limit`` wins.

distributed's ``auto`` limit is ``nthreads / CPUs`` of the host (8 GiB of a 32-CPU, 256 GiB host
with ``--nthreads 1``) and it counts GPU objects against it: above 0.6 they went to disk, and
dask-cuda's ``local_cupy`` dot took 27-31 s instead of 3 s (lab/device-runs/2026-11-30-dc-local-cupy-x2.md).
The nanny is told too: it restarts its worker above ``distributed.worker.memory.terminate`` of
its *own* limit, which stays ``auto`` otherwise (on a 16-CPU H200 host it killed the worker every
few seconds once host copies of spilled GPU objects and pinned buffers passed 7.5 GiB).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import Option, choice, format_bytes, hookimpl

if TYPE_CHECKING:
    from distributed import Nanny, Scheduler, Worker

    from gpudask.pluginapi import PlanContext, ProcessPlan

name = "worker-memory"
priority = 105

LIMIT = "gpudask.worker-memory.limit"
logger = logging.getLogger("distributed.gpudask")


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [Option(LIMIT, "auto", "Host memory limit of each GPU worker: auto (the host's memory split between "
                   "its workers, as dask cuda worker does) or distributed (distributed's own default, nthreads/CPUs "
                   "of it). An explicit --memory-limit always wins.", choice("auto", "distributed"),
                   "auto | distributed")]


@hookimpl
def gpudask_plan_memory(ctx: PlanContext, plan: ProcessPlan) -> None:
    if plan.role != "worker" or plan.gpu is None:
        return
    setting = ctx.require(LIMIT)
    if setting.value == "distributed":
        plan.note("skipped", f"{LIMIT}=distributed (from {setting.source}): distributed's own default limit")
        return
    share = round(1 / max(1, ctx.nworkers), 6)
    plan.set_section({"host_memory_fraction": share}, decision=f"memory: host_memory_fraction={share}",
                     why=f"1/{ctx.nworkers} of the host's memory per worker, as dask cuda worker splits it "
                            "(distributed's 'auto', nthreads/CPUs of it, spilled GPU arrays to disk: dask-cuda's "
                            "dot benchmark 10x slower); an explicit --memory-limit wins")


@hookimpl
def gpudask_server_setup(ctx: PlanContext, plan: ProcessPlan, server: Scheduler | Worker | Nanny) -> None:
    from distributed import Worker, system
    from distributed.worker_memory import parse_memory_limit

    share = plan.sections.get(name, {}).get("host_memory_fraction")
    if plan.role != "worker" or not share or not isinstance(server, Worker):
        return  # the nanny (--preload-nanny) has its own limit: _tell_nanny below
    manager = server.memory_manager
    auto = parse_memory_limit("auto", server.state.nthreads, logger=logger)
    if manager.memory_limit != auto:
        return  # --memory-limit (or memory_limit=...) given: it wins
    limit = int(system.MEMORY_LIMIT * share)
    if limit == auto:
        return  # distributed's own default already splits the host this way
    manager.memory_limit = limit
    data = manager.data
    target = manager.memory_target_fraction
    if target and hasattr(data, "n"):  # distributed's SpillBuffer (a zict.Buffer): its target moves too
        data.n = int(limit * target)
    logger.info("gpudask: worker %s: host memory limit %s (1/%d of the host's), not distributed's auto %s",
                plan.index, _fmt(limit), round(1 / share), _fmt(auto))
    _tell_nanny(server, limit, auto)


def _set_nanny_limit(limit: int, auto: int | None, dask_worker: object = None) -> bool:
    """Run in the nanny (distributed's ``run`` handler): the worker's limit becomes the nanny's."""
    manager = getattr(dask_worker, "memory_manager", None)
    if manager is None or getattr(manager, "memory_limit", None) != auto:
        return False  # --memory-limit given to the nanny: it wins
    manager.memory_limit = limit
    return True


def _tell_nanny(server: Worker, limit: int, auto: int | None) -> None:
    nanny = server.nanny
    if not nanny:
        return
    import asyncio

    from distributed.protocol import pickle

    async def tell() -> None:
        try:
            # distributed's pickle is untyped: dumps returns bytes
            await server.rpc(nanny).run(function=pickle.dumps(_set_nanny_limit),  # type: ignore[no-untyped-call]
                                        args=pickle.dumps((limit, auto)))  # type: ignore[no-untyped-call]
        except Exception as e:  # noqa: BLE001 - a nanny that cannot be told keeps its own limit: say so
            logger.warning("gpudask: worker-memory: the nanny %s keeps its own host memory limit %s (%s: %s); "
                           "it restarts the worker above %s", nanny, _fmt(auto), type(e).__name__, e, _fmt(auto))

    try:
        task = asyncio.get_running_loop().create_task(tell())
    except RuntimeError:  # no running loop (not in a server): nothing to tell
        return
    _PENDING.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(_PENDING.discard)


_PENDING: set[Any] = set()


def _fmt(n: int | None) -> str:
    return "none" if n is None else format_bytes(n)

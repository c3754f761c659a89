"""The rmm plugin's apply side: build the planned RMM memory resource in a worker process
(rmm, cupy, numba and torch are imported here only inside functions).

The GPU may have changed since the plan (another command's workers, a peer still mapping an old
pool), so each worker, under a host lock, reads NVML's free memory right before it allocates: a
default size that no longer fits becomes half of what is free, a size the user set is refused in one line."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import GpudaskError, add_worker_metric, hookimpl, host_lock, nvml_session

from . import shares
from .options import ALIGNMENT, DEFAULT_FRACTION, gib, share_maximum, share_of

if TYPE_CHECKING:
    from distributed import Nanny, Scheduler, Worker

    from gpudask.pluginapi import PlanContext, ProcessPlan

logger = logging.getLogger("distributed.gpudask")
SECTION = "rmm"  # the plugin's section of the plan: what to build (plugins/rmm/plugin.py)
_MR: Any = None  # the memory resource in use (for the metric); None: nothing built in this process
_REPORT: dict[str, Any] | None = None  # the last report, whatever happened (JSON-compatible)


@hookimpl
def gpudask_setup_memory(ctx: PlanContext, plan: ProcessPlan) -> dict[str, Any]:
    """Build the planned memory resource in this worker process, or report why not (called once per process)."""
    global _REPORT
    _REPORT = _setup(ctx, plan)
    return _REPORT


def _setup(ctx: PlanContext, plan: ProcessPlan) -> dict[str, Any]:
    global _MR
    memory = plan.sections.get(SECTION)
    if memory is None or memory.get("allocator") is None:
        return {"allocator": None, "applied": False, "why": "no memory setup planned (see gpudask info)"}
    report: dict[str, Any] = dict(memory)
    memory, recounted = _recount(ctx, plan, memory)
    if recounted:
        logger.warning("gpudask: %s", recounted)
        report.update(recounted=recounted, planned_initial_pool_size=report.get("initial_pool_size"),
                      initial_pool_size=memory.get("initial_pool_size"),
                      maximum_pool_size=memory.get("maximum_pool_size"), share=memory.get("share"))
    if ctx.facts.described:
        report.update(applied=False, skipped=f"host described by {ctx.facts.origin}: no real GPU here, "
                                             f"RMM not initialised, no pool allocated")
        return report
    try:
        import rmm
    except ImportError as e:
        raise GpudaskError(f"gpudask.rmm: an RMM {memory['allocator']} allocator is planned for GPU "
                           f"{memory.get('gpu')} but rmm cannot be imported: {e}") from None
    existing = rmm.mr.get_current_device_resource()
    if type(existing) is not rmm.mr.CudaMemoryResource:  # not RMM's default resource
        # someone (a user, another plugin, a previous preload) set a resource: leave it
        report.update(applied=False, existing=_chain(existing), pool_size=_pool_size(rmm, existing),
                      why="a memory resource was already set in this process; gpudask does not replace it "
                          "(restart the worker to change it)")
        _MR = existing
        return report
    who = f"worker {plan.index}"
    waited = _wait_for_release(memory, plan, who)
    if waited is not None:
        report["waited"] = waited
    with host_lock(f"gpu-{memory.get('gpu')}"):  # read what is free and allocate, one process at a time
        memory, fitted = _fit_to_gpu(memory, who)
        mr = _build(rmm, memory)
    shares.record(plan.index, memory.get("gpu"), memory.get("initial_pool_size"))
    if fitted:
        logger.warning("gpudask: %s", fitted)
        report.update(fitted=fitted, fitted_initial_pool_size=memory["initial_pool_size"])
    rmm.mr.set_current_device_resource(mr)
    report.update(applied=True, resource=_chain(mr), pool_size=_pool_size(rmm, mr))
    if memory.get("log_file"):
        report["log_file"] = _log_file(rmm, mr) or memory["log_file"]
    report["libraries"] = {lib: _point_library(lib) for lib in memory.get("libraries") or []}
    _MR = mr
    return report


def _fit_to_gpu(memory: dict[str, Any], who: str) -> tuple[dict[str, Any], str | None]:
    gpu = memory.get("gpu")
    if not memory.get("initial_pool_size") or not gpu or not str(gpu).startswith("GPU-"):
        return memory, None  # no initial pool, or a MIG instance (NVML's free is the parent GPU's)
    found = device_memory(str(gpu))
    if found is None:
        return memory, None
    holding = None
    if memory["initial_pool_size"] > found[0] - reserve(found[1]):  # short: name who holds it
        holding = shares.holders_text(shares.gpu_processes(str(gpu)), shares.known_workers())
    return fit(memory, found[0], found[1], who, holding)


# left free beside a pool: the worker's own CUDA context grows (cuBLAS / cuFFT handles, UCX's
# bounce buffers), and so do its neighbours'
MIN_RESERVE = 256 * 2**20
RESERVE_FRACTION = 0.01
# a default pool smaller than this is not worth a pool
MIN_POOL = 64 * 2**20


def device_memory(uuid: str) -> tuple[int, int] | None:
    with nvml_session() as nvml:
        handle = nvml.call("nvmlDeviceGetHandleByUUID", uuid) if nvml else None
        info = nvml.call("nvmlDeviceGetMemoryInfo", handle) if nvml and handle is not None else None
        return None if info is None else (int(info.free), int(info.total))


def reserve(total: int) -> int:
    return max(MIN_RESERVE, int(RESERVE_FRACTION * total))


def fit(memory: dict[str, Any], free: int, total: int, who: str,
        holding: str | None = None) -> tuple[dict[str, Any], str | None]:
    """``memory`` with an initial pool that fits in ``free``, and the line saying what changed (None: nothing);
    GpudaskError (one line) when a size the user set does not fit."""
    initial = memory.get("initial_pool_size")
    if not initial or memory.get("allocator") not in ("pool", "async"):
        return memory, None
    room = free - reserve(total)
    if initial <= room:
        return memory, None
    gpu = memory.get("gpu")
    held = f"{gib(free)} of {gib(total)} free now, other processes hold {gib(total - free)}"
    if holding:
        held += f": {holding}"
    if not memory.get("fit_to_free"):
        raise GpudaskError(
            f"gpudask.rmm.pool-size: the pool of {initial} bytes ({gib(initial)}) set for {who} does not fit on GPU "
            f"{gpu} ({held}); accepted: at most {max(0, room) // ALIGNMENT * ALIGNMENT} bytes now, a smaller size "
            "or fraction, or no gpudask.rmm.pool-size (a default pool fits itself to what is free)")
    smaller = int(DEFAULT_FRACTION * free) // ALIGNMENT * ALIGNMENT
    smaller = min(smaller, max(0, room) // ALIGNMENT * ALIGNMENT)
    if smaller < MIN_POOL:
        raise GpudaskError(
            f"gpudask.rmm: no room for {who}'s default pool on GPU {gpu} ({held}); accepted: free the GPU, "
            "give this worker another GPU (CUDA_VISIBLE_DEVICES), or gpudask.rmm.pool-size: false (no pool)")
    fitted = dict(memory, initial_pool_size=smaller)
    if fitted.get("maximum_pool_size") == initial:  # capped at the initial size (PyTorch beside it): still so
        fitted["maximum_pool_size"] = smaller
    line = (f"{who}: the default RMM pool planned at {gib(initial)} does not fit on GPU {gpu} ({held}): it starts "
            f"at {gib(smaller)}, {DEFAULT_FRACTION:g} of what is free (gpudask.rmm.pool-size sets it)")
    return fitted, line


def _recount(ctx: PlanContext, plan: ProcessPlan, memory: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A default pool's share counted again as the worker starts (a gpudask command started after this
    one was planned adds its workers), from the GPU's total memory: the same pool at every restart."""
    share = memory.get("share")
    total = memory.get("gpu_memory")
    gpu = memory.get("gpu")
    if not isinstance(share, dict) or not isinstance(total, int) or not gpu or not memory.get("initial_pool_size"):
        return memory, None
    exclude = {p for p in (shares.own_planner(),) if p is not None}
    others = shares.other_commands(str(ctx.facts.hostname), exclude).get(str(gpu), {})
    command = int(share.get("command_workers") or 1)
    counted = command + sum(others.values())
    declared = share.get("declared")
    n = max(int(declared), counted) if isinstance(declared, int) else counted
    if n == share.get("workers"):
        return memory, None
    initial = share_of(total, n, float(share.get("fraction") or DEFAULT_FRACTION))
    maximum = memory.get("maximum_pool_size")
    rule = share.get("maximum")
    if rule == "set":
        initial = min(initial, maximum) if isinstance(maximum, int) else initial
    elif rule == "initial":
        maximum = initial
    else:
        cap = share_maximum(total, n)
        maximum = None if cap is None else max(initial, cap)
    where = " + ".join([f"{command} of this command"] + [f"{k} of pid {pid}" for pid, k in sorted(others.items())])
    line = (f"worker {plan.index}: {n} workers share GPU {gpu} now ({where}), {share.get('workers')} when this "
            f"command planned: its default RMM pool is {gib(initial)}, {DEFAULT_FRACTION:g} of the GPU / {n} "
            f"(planned {gib(int(memory['initial_pool_size']))}; gpudask.rmm.workers-per-gpu declares the count)")
    return dict(memory, initial_pool_size=initial, maximum_pool_size=maximum,
                share=dict(share, workers=n, other_workers={str(p): k for p, k in sorted(others.items())})), line


def _wait_for_release(memory: dict[str, Any], plan: ProcessPlan, who: str) -> dict[str, Any] | None:
    """Wait (bounded: gpudask.rmm.release-wait) while memory this worker's predecessor, or any process
    going away, still holds is released; what happened, or None (nothing to wait for)."""
    gpu = memory.get("gpu")
    initial = memory.get("initial_pool_size")
    if not initial or not gpu or not str(gpu).startswith("GPU-") or memory.get("allocator") not in ("pool", "async"):
        return None
    uuid = str(gpu)
    before = shares.predecessor(plan.index)
    known = shares.known_workers()

    read = functools.partial(device_memory, uuid)

    def leaving() -> bool:
        # the predecessor is this process's sibling (same nanny host, same pid namespace): while it
        # lives it still holds its pool, whatever NVML lists (NVML's pids may be another namespace's)
        if before is not None and not shares.going(before):
            return True
        listed = shares.gpu_processes(uuid) or []
        return any(pid == before or (pid in known and shares.going(pid)) or shares.state_of(pid) == b"Z"
                   for pid, _ in listed)

    first = read()
    if first is None:
        return None
    needed = int(initial) + reserve(first[1])
    if first[0] >= needed:
        return None
    wait = memory.get("release_wait")
    timeout = float(wait) if isinstance(wait, (int, float)) else 30.0
    waited = shares.wait_for_memory(read, needed, timeout, leaving)
    if waited is None:
        return None
    out = {"seconds": round(waited.seconds, 2), "stopped": waited.why_stopped, "free": waited.free,
           "needed": needed, "predecessor": before}
    if waited.free >= needed:
        logger.info("gpudask: %s: waited %.1f s for GPU %s memory being released (predecessor pid %s): %s free",
                    who, waited.seconds, uuid, before, gib(waited.free))
    return out


def _build(rmm: Any, memory: dict[str, Any]) -> Any:
    kind = memory["allocator"]
    initial, maximum = memory.get("initial_pool_size"), memory.get("maximum_pool_size")
    what = f"RMM {kind} allocator" + (f" with a pool of {initial} bytes" if initial else "")
    if memory.get("log_file"):
        os.makedirs(os.path.dirname(memory["log_file"]) or ".", exist_ok=True)
    try:
        if kind == "async":
            mr = rmm.mr.CudaAsyncMemoryResource(initial_pool_size=initial,
                                                release_threshold=memory.get("release_threshold"))
            if maximum is not None:
                mr = rmm.mr.LimitingResourceAdaptor(mr, allocation_limit=maximum)
        elif kind == "pool":
            upstream = rmm.mr.ManagedMemoryResource() if memory.get("managed_memory") else rmm.mr.CudaMemoryResource()
            mr = rmm.mr.PoolMemoryResource(upstream, initial_pool_size=initial, maximum_pool_size=maximum)
        elif kind == "managed":
            mr = rmm.mr.ManagedMemoryResource()
        else:
            mr = rmm.mr.CudaMemoryResource()
        if memory.get("log_file"):
            mr = rmm.mr.LoggingResourceAdaptor(mr, log_file_name=memory["log_file"])
        if memory.get("track_allocations"):
            mr = rmm.mr.TrackingResourceAdaptor(mr)
    except (MemoryError, RuntimeError, OSError, ValueError) as e:
        raise GpudaskError(f"gpudask.rmm: could not build the {what} on GPU {memory.get('gpu')}: "
                           f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return mr


def _upstreams(mr: Any) -> Iterator[Any]:
    for _ in range(16):  # a chain of adaptors, bounded
        if mr is None:
            return
        yield mr
        mr = getattr(mr, "upstream_mr", None)


def _chain(mr: Any) -> str:
    return " -> ".join(type(m).__name__ for m in _upstreams(mr))


def _pool_size(rmm: Any, mr: Any) -> int | None:
    return next((int(m.pool_size()) for m in _upstreams(mr) if isinstance(m, rmm.mr.PoolMemoryResource)), None)


def _allocated(mr: Any) -> int | None:
    return next((int(m.get_allocated_bytes()) for m in _upstreams(mr) if hasattr(m, "get_allocated_bytes")), None)


def _log_file(rmm: Any, mr: Any) -> str | None:
    return next((str(m.get_file_name()) for m in _upstreams(mr) if isinstance(m, rmm.mr.LoggingResourceAdaptor)),
                None)


def _point_library(lib: str) -> str:
    """Make ``lib`` allocate through RMM; a short status for the report (never raises)."""
    try:
        if lib == "cupy":
            import cupy
            from rmm.allocators.cupy import rmm_cupy_allocator

            cupy.cuda.set_allocator(rmm_cupy_allocator)
        elif lib == "numba":
            from numba import cuda
            from rmm.allocators.numba import RMMNumbaManager

            cuda.set_memory_manager(RMMNumbaManager)
        elif lib == "torch":
            import torch
            from rmm.allocators.torch import rmm_torch_allocator

            if rmm_torch_allocator is None:
                return "not pointed: torch sees no CUDA device"
            torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
        return "rmm"
    except ImportError:
        return "not installed"
    except Exception as e:  # noqa: BLE001 - e.g. torch's allocator already initialised
        return f"not pointed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


@hookimpl
def gpudask_server_setup(ctx: PlanContext, plan: ProcessPlan, server: Scheduler | Worker | Nanny) -> None:
    """Add a ``gpudask-rmm`` worker metric: allocator, initial and current pool size."""
    if plan.role != "worker" or type(server).__name__ == "Nanny":
        return
    add_worker_metric(server, "gpudask-rmm", _metric)


def _metric(worker: Any = None) -> dict[str, Any] | None:
    if _REPORT is None:
        return None
    out = {k: _REPORT.get(k) for k in ("allocator", "initial_pool_size", "maximum_pool_size", "applied")}
    if _MR is not None:
        import rmm

        out["pool_size"] = _pool_size(rmm, _MR)
        out["used"] = _allocated(_MR)
    return out


_RESOURCE_OF = {"pool": "PoolMemoryResource", "async": "CudaAsyncMemoryResource", "managed": "ManagedMemoryResource",
                "default": "CudaMemoryResource"}


@hookimpl
def gpudask_applied_state(ctx: PlanContext, plan: ProcessPlan) -> dict[str, dict[str, Any]] | None:
    """The RMM resource in place in this process, read back, against the plan."""
    import sys

    memory = plan.sections.get(SECTION)
    if plan.role != "worker" or memory is None or memory.get("allocator") is None or ctx.facts.described:
        return None
    kind = memory["allocator"]
    planned = _RESOURCE_OF.get(kind, kind)
    rmm = sys.modules.get("rmm")
    if rmm is None:
        return {"resource": {"planned": planned, "actual": "rmm not imported"}}
    mr = rmm.mr.get_current_device_resource()
    chain = [type(m).__name__ for m in _upstreams(mr)]
    out: dict[str, dict[str, Any]] = {"resource": {"planned": planned,
                                                   "actual": planned if planned in chain else " -> ".join(chain)}}
    # a default pool fitted to what was free at start (fit) is in place at its fitted size; the
    # fit is said at start and is the check's pool-fitted finding, not a plan that did not take effect
    # a default pool's share counted again at start (another command's workers joined) likewise
    initial = ((_REPORT or {}).get("fitted_initial_pool_size") or (_REPORT or {}).get("initial_pool_size")
               or memory.get("initial_pool_size"))
    if kind == "pool" and initial:
        size = _pool_size(rmm, mr)
        # a pool grows from its initial size: in place when it holds at least that much
        out["pool_size"] = {"planned": initial, "actual": initial if size is not None and size >= initial else size}
    return out

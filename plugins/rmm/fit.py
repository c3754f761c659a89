"""Fit a worker's pool to its GPU as it is when the worker starts (part of the rmm plugin).

The GPU may have changed since the plan (another command's workers, a peer still mapping an old
pool), so each worker, under a host lock, reads NVML's free memory right before it allocates: a
default size that no longer fits becomes half of what is free, a size the user set is refused in one line."""

from __future__ import annotations

from typing import Any

from gpudask.pluginapi import GpudaskError, nvml_session

from .options import ALIGNMENT, DEFAULT_FRACTION, gib

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

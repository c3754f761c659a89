"""The spill workload: a CuPy working set larger than the workers' device memory limit.

:func:`spill_figure` measures both sides of the ``spill`` figure (docs/benchmarks.md), on gpudask
and dask-cuda workers alike: what runs on workers is sent detached (they never import gpudask).
"""

from __future__ import annotations

import math
import time
from typing import Any

from gpudask_bench.configs import MiB
from gpudask_bench.workers import detached

FILL_VALUES = 7  # chunk i holds the value i % 7 + 1: the exact total is known in advance


# -- functions that run on workers (sent by value) --------------------------------------------
def _w_make_chunk(i, elems):
    import cupy

    x = cupy.full(elems, float(i % 7 + 1), dtype="float64")
    cupy.cuda.get_current_stream().synchronize()
    return x


def _w_chunk_sum(x):
    return float(x.sum().item())


def _w_add(*values):
    return float(sum(values))


def _w_start_sampler(dask_worker, interval):
    """Poll NVML for this worker process's GPU memory until stopped; keep the peak."""
    import os
    import threading

    state = {"peak": 0, "method": None, "stop": threading.Event(), "samples": 0, "thread": None}
    dask_worker._spill_bench_sampler = state
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # noqa: BLE001 - no driver: the figure has no memory column
        return os.getpid()
    pid = os.getpid()

    def own_bytes():
        for h in handles:
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if int(p.pid) == pid and p.usedGpuMemory is not None:
                    return int(p.usedGpuMemory)
        return None

    def poll():
        while not state["stop"].is_set():
            try:
                used = own_bytes()
            except pynvml.NVMLError:
                used = None
            if used is not None:
                state["method"] = "nvml process"
                state["peak"] = max(state["peak"], used)
                state["samples"] += 1
            state["stop"].wait(interval)

    state["thread"] = threading.Thread(target=poll, name="spill-bench-nvml", daemon=True)
    state["thread"].start()
    return pid


def _w_stop_sampler(dask_worker):
    state = getattr(dask_worker, "_spill_bench_sampler", None)
    if state is None:
        return None
    state["stop"].set()
    if state["thread"] is not None:
        state["thread"].join(timeout=5)
    del dask_worker._spill_bench_sampler
    return {"peak_bytes": state["peak"] if state["method"] else None, "method": state["method"],
            "samples": state["samples"]}


def _w_spill_metric(dask_worker):
    metric = dask_worker.metrics.get("gpudask-spill")
    return metric(dask_worker) if metric is not None else None


# -- the figure -------------------------------------------------------------------------------
def plan_chunks(limit_bytes: int, nworkers: int, factor: float = 2.5,
                chunk_bytes: int | None = None) -> tuple[int, int]:
    """(elements per float64 chunk, number of chunks) for ``factor`` x the limit per worker.

    Chunks are at most 1/16 of the limit (so the device tier holds many) and 256 MiB."""
    if limit_bytes <= 0 or nworkers <= 0 or factor <= 0:
        raise ValueError("limit_bytes, nworkers and factor must be positive")
    chunk_bytes = chunk_bytes or max(MiB, min(limit_bytes // 16, 256 * MiB))
    elems = max(1, chunk_bytes // 8)
    return elems, math.ceil(factor * limit_bytes * nworkers / (elems * 8))


def expected_total(elems: int, chunks: int) -> float:
    return float(elems * sum(i % FILL_VALUES + 1 for i in range(chunks)))


def spill_figure(client: Any, limit_bytes: int, *, chunk_bytes: int | None = None) -> dict[str, Any]:
    """Run the workload once on ``client``'s workers; the figure and what it was measured on.

    ``limit_bytes`` (the workers' device memory limit) sizes the working set, every chunk held at
    once.  A wrong total raises ``RuntimeError``: a time for a wrong answer is no figure."""
    from distributed import wait

    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    if not workers:
        raise RuntimeError("spill_figure: the cluster has no workers")
    elems, chunks = plan_chunks(limit_bytes, len(workers), chunk_bytes=chunk_bytes)
    pids = client.run(detached(_w_start_sampler), interval=0.02)  # NVML every 20 ms
    futures: list[Any] = []
    try:
        start = time.perf_counter()
        futures = client.map(detached(_w_make_chunk), range(chunks), elems=elems, pure=False)
        wait(futures)
        filled = time.perf_counter()
        sums = client.map(detached(_w_chunk_sum), futures, pure=False)
        total = client.submit(detached(_w_add), *sums, pure=False).result()
        elapsed = time.perf_counter() - start
    finally:
        peaks = client.run(detached(_w_stop_sampler))
    metrics = client.run(detached(_w_spill_metric))
    placed = client.who_has(futures)
    per_worker = {w: sum(1 for holders in placed.values() if w in holders) for w in workers}
    del futures
    expected = expected_total(elems, chunks)
    if total != expected:
        raise RuntimeError(f"spill_figure: wrong total {total!r}, expected {expected!r}")
    return {
        "spill_s": elapsed,
        "fill_s": filled - start,
        "reduce_s": elapsed - (filled - start),
        "total": total,
        "limit_bytes": int(limit_bytes),
        "working_set_bytes": elems * 8 * chunks,
        "chunk_bytes": elems * 8,
        "chunks": chunks,
        "chunks_per_worker": per_worker,
        "workers": {w: {"pid": pids.get(w), **(peaks.get(w) or {}), "spill": metrics.get(w)} for w in workers},
        "peak_worker_gpu_bytes": max((p or {}).get("peak_bytes") or 0 for p in peaks.values()) or None,
    }

"""The spill workload: a CuPy working set larger than the workers' device memory limit.

:func:`spill_figure` measures both sides of the ``spill`` figure (docs/benchmarks.md), on gpudask
and dask-cuda workers alike: what runs on workers is sent detached (they never import gpudask).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from gpudask_bench.configs import MiB
from gpudask_bench.workers import detached, getpid

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


def _sample_peaks(seen: dict[int, dict[str, Any]], interval: float, stop: threading.Event) -> None:
    """Until ``stop``, every ``interval`` s: the GPU memory NVML attributes to each process of
    ``seen`` (by pid), its peak kept there.  In the bench's process, not in the workers measured."""
    from gpudask.pluginapi import nvml_session
    from gpudask_bench.measures import nvml_processes

    with nvml_session() as nvml:
        while nvml is not None and not stop.is_set():
            used: dict[int, int] = {}
            for p in nvml_processes(nvml) or []:
                if p["pid"] in seen and p["MiB"] is not None:
                    used[p["pid"]] = used.get(p["pid"], 0) + round(p["MiB"] * MiB)
            for pid, n in used.items():
                s = seen[pid]
                s.update(peak_bytes=max(s["peak_bytes"] or 0, n), method="nvml process", samples=s["samples"] + 1)
            stop.wait(interval)


def spill_figure(client: Any, limit_bytes: int, *, chunk_bytes: int | None = None) -> dict[str, Any]:
    """Run the workload once on ``client``'s workers; the figure and what it was measured on.

    ``limit_bytes`` (the workers' device memory limit) sizes the working set, every chunk held at
    once.  A wrong total raises ``RuntimeError``: a time for a wrong answer is no figure."""
    from distributed import wait

    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    if not workers:
        raise RuntimeError("spill_figure: the cluster has no workers")
    elems, chunks = plan_chunks(limit_bytes, len(workers), chunk_bytes=chunk_bytes)
    pids = client.run(detached(getpid))
    seen = {pid: {"peak_bytes": None, "method": None, "samples": 0} for pid in pids.values()}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_peaks, args=(seen, 0.02, stop), name="spill-bench-nvml", daemon=True)
    sampler.start()  # NVML every 20 ms
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
        stop.set()
        sampler.join(timeout=5)
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
        "workers": {w: {"pid": pids.get(w), **seen.get(pids.get(w), {}), "spill": metrics.get(w)} for w in workers},
        "peak_worker_gpu_bytes": max((s["peak_bytes"] or 0 for s in seen.values()), default=0) or None,
    }

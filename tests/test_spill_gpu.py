"""Spilling on a real GPU: a CuPy working set 2.5x the device memory limit completes with the
right total while the worker's GPU memory stays under the limit plus a stated slack; the same
workload with spilling off runs out of memory (so the first test can fail).

The H200 has 140 GiB, far more than a two-minute test can fill, so the worker is given a
6 GB "GPU": gpudask's rmm plugin points CuPy at RMM without a pool (``allocator
default``: cudaMalloc/cudaFree, so NVML sees live memory, not a cache), and the test wraps
that resource in RMM's ``LimitingResourceAdaptor`` of 6 GB (the limit 4 GB: a 10 GB working set).  Unspilled arrays are
re-created through ``rmm.DeviceBuffer``, so the same limit covers them.
"""

from __future__ import annotations

import pytest
from conftest import BENCH_MISSING, base_env

pytest.importorskip("gpudask_bench", reason=BENCH_MISSING)

from gpudask_bench.spill import spill_figure  # noqa: E402
from gpudask_bench.workers import detached  # noqa: E402

GB = 10**9
LIMIT = 4 * GB
GPU_SIZE = 6 * GB  # the worker's stand-in GPU
# what the worker holds beyond the limit: its CUDA context and library handles (~0.6 GiB is
# typical; not measured here), the chunk a task just made before the store moves another
# one out, and an unspilled chunk (256 MiB each)
SLACK = 2 * 2**30


def _cap_device_memory(limit):
    import rmm

    mr = rmm.mr.get_current_device_resource()
    if not isinstance(mr, rmm.mr.LimitingResourceAdaptor):
        rmm.mr.set_current_device_resource(rmm.mr.LimitingResourceAdaptor(mr, allocation_limit=limit))
    return type(rmm.mr.get_current_device_resource()).__name__


def _start(cluster, spilling: bool):
    env = base_env(DASK_GPUDASK__SPILL__DEVICE_MEMORY_LIMIT=str(LIMIT) if spilling else "0",
                   DASK_GPUDASK__RMM__ALLOCATOR="default")
    cluster.scheduler()
    cluster.worker("--preload", "gpudask", "--nworkers", "1", "--nthreads", "1", env=env)
    client = cluster.client()
    client.wait_for_workers(1, timeout=120)
    assert set(client.run(detached(_cap_device_memory), GPU_SIZE).values()) == {"LimitingResourceAdaptor"}
    return client


@pytest.mark.gpu
@pytest.mark.process
@pytest.mark.timeout(240)
def test_cupy_working_set_of_2_5x_the_limit_completes_under_the_limit(cluster):
    with _start(cluster, spilling=True) as client:
        result = spill_figure(client, LIMIT)
    print("spill figure:", result)
    assert result["working_set_bytes"] >= 2 * LIMIT  # and > GPU_SIZE: it cannot fit without spilling
    assert result["working_set_bytes"] > GPU_SIZE
    (worker,) = result["workers"].values()
    assert worker["method"] == "nvml process", f"NVML did not report the worker's pid: {worker}"
    assert worker["peak_bytes"] <= LIMIT + SLACK, (worker["peak_bytes"], LIMIT + SLACK)
    spill = worker["spill"]
    assert spill["limit"] == LIMIT and spill["spilled_bytes"] >= result["working_set_bytes"] - LIMIT
    assert spill["unspilled_count"] > 0


@pytest.mark.gpu
@pytest.mark.process
@pytest.mark.timeout(240)
def test_the_same_workload_without_spilling_runs_out_of_memory(cluster):
    with _start(cluster, spilling=False) as client:
        assert set(client.run(lambda dask_worker: type(dask_worker.data).__name__).values()) != {"DeviceHostStore"}
        with pytest.raises(Exception) as e:
            spill_figure(client, LIMIT)
    text = f"{type(e.value).__name__}: {e.value}"
    print("without spilling:", text[:300])
    assert isinstance(e.value, MemoryError) or "out_of_memory" in text or "OutOfMemory" in text, text


@pytest.mark.gpu
@pytest.mark.process
@pytest.mark.timeout(420)
def test_gpudask_bench_measures_the_spill_figure_on_both_sides(tmp_path):
    """`gpudask bench` has `spill_s` for gpudask and (when installed) dask-cuda, from a launch
    of its own with the same device limit, and a checked total (a wrong one is no figure)."""
    import json
    import subprocess
    import sys

    # 1 GB: the smallest limit whose 2.5x working set still spills a real amount (the suite's budget)
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "bench", "--configs", "gpudask,dask-cuda", "--quick",
                          "--repeat", "1", "--no-workloads", "--spill-limit", "1GB", "--json"],
                         capture_output=True, text=True, timeout=400, cwd=tmp_path, env=base_env())
    assert out.returncode == 0, out.stderr[-3000:]
    measured = [c for c in json.loads(out.stdout)["configs"] if c["status"] != "skipped"]
    assert measured and measured[0]["name"] == "gpudask"
    for c in measured:
        assert c["figures"]["spill_s"]["runs"][0] > 0, (c["name"], c["notes"])
        assert c["spill"]["limit_bytes"] == GB and c["spill"]["working_set_bytes"] >= 2.5 * GB

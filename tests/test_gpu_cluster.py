"""On the GPU machine (``python -m pytest -m gpu``): what a user's script gets, read from the
live worker processes -- any GPU count; the tests that need two GPUs skip on one.

Issue-level promises checked here: the top-level-import script gets one GPU (UUID), its pool
and its context per worker; a pool that cannot be allocated stops ``dask worker`` with one
line; on two NVLink GPUs each worker has its own GPU, its NVML CPU affinity, and moves data
over cuda_ipc; gpudask workers are not slower than plain ones on a small dot workload.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import cloudpickle
import pytest
from conftest import base_env, real_gpu_count

# the functions below run in the workers, which cannot import this test module
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.gpu, pytest.mark.process]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in base_env().items() if not k.startswith("UCX_") or k == "UCX_WARN_UNUSED_ENV_VARS"}
    env.update(extra)
    return env


def live() -> dict:
    """What this worker process really runs with (reads CUDA, RMM and NVML; changes nothing)."""
    import cupy
    import rmm
    from distributed.diagnostics.nvml import has_cuda_context

    device = cupy.cuda.Device()
    context = has_cuda_context()
    mr = rmm.mr.get_current_device_resource()
    pool = None
    while mr is not None:
        if isinstance(mr, rmm.mr.PoolMemoryResource):
            pool = int(mr.pool_size())
            break
        mr = getattr(mr, "upstream_mr", None)
    uuid = context.device_info.uuid if context.has_context else None
    return {"pid": os.getpid(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "pci": device.pci_bus_id,
            "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
            "resource": type(rmm.mr.get_current_device_resource()).__name__, "pool": pool,
            "affinity": sorted(os.sched_getaffinity(0))}


SCRIPT = """
import json, sys
import gpudask                      # at the top, the way docs/usage.md shows it
from distributed import Client

from test_gpu_cluster import live

if __name__ == "__main__":
    with gpudask.LocalGPUCluster(protocol="ucx", dashboard_address=None) as cluster, Client(cluster) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
        out = {"live": client.run(live), "plans": {a: w["gpudask"]["plan"] for a, w in workers.items()},
               "mismatches": {a: w["gpudask"]["mismatches"] for a, w in workers.items()}}
    print("RESULT " + json.dumps(out))
"""


def test_top_level_import_script_gives_each_worker_its_gpu_pool_and_context(tmp_path):
    """Each worker its GPU, its context there, and the memory setup its plan names (a pool
    only where the plan makes one)."""
    (tmp_path / "script.py").write_text(SCRIPT)
    here = os.path.dirname(__file__)
    env = _env(PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "script.py"], capture_output=True, text=True, timeout=240, env=env,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.split("RESULT ", 1)[1])
    print("\n" + json.dumps(result["live"], indent=1))
    workers = result["live"]
    assert len(workers) == real_gpu_count()
    for address, w in workers.items():
        plan = result["plans"][address]
        assert w["cvd"] == plan["cuda_visible_devices"]
        assert w["uuid"] == plan["gpu"]  # the context is on the worker's own GPU
        memory = (plan.get("sections") or {}).get("rmm") or {}
        if memory.get("allocator") in ("pool", "async") and memory.get("initial_pool_size"):
            assert w["resource"] != "CudaMemoryResource"
            if memory["allocator"] == "pool":
                assert w["pool"] == memory["initial_pool_size"]
        else:
            # what the plan says: e.g. one GPU and one worker use no cuda_ipc, so the plan
            # makes no pool (`gpudask info --protocol ucx` says why), and the worker has none
            assert w["pool"] is None, (plan.get("reasons"), w)
        assert result["mismatches"][address] == []
    assert len({w["uuid"] for w in workers.values()}) == len(workers)  # each worker its own GPU


def test_a_pool_that_cannot_be_allocated_stops_dask_worker_with_one_line(cluster):
    env = _env(DASK_GPUDASK__RMM__POOL_SIZE="0.999", CUDA_VISIBLE_DEVICES="0")
    cluster.scheduler(protocol="ucx", env=env)
    proc = cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nthreads", "1", env=env)
    assert proc.wait(timeout=120) != 0
    log = cluster.log("worker")
    print("\n" + "\n".join(x for x in log.splitlines() if " INFO " not in x and not x.startswith(" "))[-3000:])
    errors = [x for x in log.splitlines() if x.startswith("Error: ")]
    assert errors and errors[-1].startswith("Error: gpudask: ") and "rmm" in errors[-1]
    assert "Traceback" not in log


def _two_gpus() -> None:
    if real_gpu_count() < 2:
        pytest.skip("needs two GPUs (device kind nvidia-h200-x2)")


def test_two_gpus_each_worker_its_own_gpu_affinity_and_cuda_ipc_over_nvlink(cluster):
    _two_gpus()
    import pynvml

    env = _env()
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    with cluster.client(timeout=120) as client:
        client.wait_for_workers(2, timeout=180)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        state = client.run(live)
        tls = client.run(lambda: __import__("ucxx").get_config()["TLS"])
        a, b = sorted(workers)

        def make():
            import cupy

            x = cupy.ones(2**30 // 8)
            cupy.cuda.runtime.deviceSynchronize()
            return x

        def receive(x):
            import cupy

            cupy.cuda.runtime.deviceSynchronize()
            return x.nbytes

        from distributed import wait

        rates = []
        for _ in range(4):
            x = client.submit(make, workers=[a], pure=False)
            wait(x, timeout=120)
            start = time.perf_counter()
            n = client.submit(receive, x, workers=[b], pure=False).result(timeout=120)
            rates.append(n / (time.perf_counter() - start) / 1e9)
            del x
    print(f"\n1 GiB CuPy array between the two GPUs over ucx://: {', '.join(f'{r:.1f}' for r in rates)} GB/s")
    pynvml.nvmlInit()
    try:
        for address, w in state.items():
            plan = workers[address]["gpudask"]["plan"]
            assert w["uuid"] == plan["gpu"]
            handle = pynvml.nvmlDeviceGetHandleByUUID(plan["gpu"])
            assert "cuda_ipc" in plan["env"]["UCX_TLS"].split(",") and "cuda_ipc" in tls[address].split(",")
            assert any("NVLink" in r["why"] for r in plan["reasons"] if r["decision"] == "UCX transport cuda_ipc")
            assert set(w["affinity"]) <= set(plan["cpu_affinity"])  # bound to its GPU's CPUs (NVML)
            assert plan["cpu_affinity"] and pynvml.nvmlDeviceGetIndex(handle) == plan["gpu_index"]
    finally:
        pynvml.nvmlShutdown()
    assert len({w["uuid"] for w in state.values()}) == 2
    assert max(rates) > 30, rates


# speed against plain workers and dask-cuda is measured by the bench and the shape matrix, side by side
# (docs/benchmarks.md), not asserted by a timed test

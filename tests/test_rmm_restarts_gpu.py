"""Pools that hold through restarts, on a real GPU (issue 40, item 1).

Two ``dask worker --nworkers 1 --preload gpudask`` commands on the one GPU (a default-sized
pool: ``gpudask.rmm.allocator: pool``), beside -- on the same GPU, their own scheduler -- two
``dask cuda worker --rmm-pool-size 20GB`` commands (skipped where dask_cuda is not importable).
Each of 10 ``client.restart()`` of both clusters is followed by reading every worker's pool
(``rmm.mr.get_current_device_resource()`` and its pool size) and the GPU memory NVML lists per
pid: gpudask's pools are equal across its workers and identical from the first restart on (the
second command counted the first one's worker when it started; the first counts the second's
from its first restart).  Then a ``kill -9`` of one gpudask worker, a task that runs its pool out
of memory (a MemoryError at the pool's maximum, its neighbour untouched) followed by a task that
runs, and one more restart: the same pools again.

Measured before (2026-12-02, H200): 70.2 / 34.0 GiB at start, 16.4 / 7.9 GiB after a restart
and from then on.  The figures of every step are written as JSON to ``$OUT/rmm-restarts.json``
when ``OUT`` is set.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import signal
import sys
import time

import cloudpickle
import pytest
from conftest import base_env

# the functions below run in the workers, which cannot import this test module: send them by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

GiB = 2**30
RESTARTS = 10


def _pool(dask_worker=None):
    """In a worker: its RMM resource chain, pool size and maximum, and its pid."""
    import os

    import rmm

    mr = rmm.mr.get_current_device_resource()
    chain, size, m, seen = [], None, mr, 0
    while m is not None and seen < 16:
        chain.append(type(m).__name__)
        if isinstance(m, rmm.mr.PoolMemoryResource) and size is None:
            size = int(m.pool_size())
        m = getattr(m, "upstream_mr", None)
        seen += 1
    from gpudask.plugins.rmm import setup as rmm_setup

    report = rmm_setup._REPORT or {}
    return {"pid": os.getpid(), "chain": chain, "pool_size": size,
            "maximum_pool_size": report.get("maximum_pool_size"), "waited": report.get("waited"),
            "recounted": report.get("recounted"), "fitted": report.get("fitted")}


def _dask_cuda_pool(dask_worker=None):
    import os

    import rmm

    m, seen = rmm.mr.get_current_device_resource(), 0
    while m is not None and seen < 16:
        if isinstance(m, rmm.mr.PoolMemoryResource):
            return {"pid": os.getpid(), "pool_size": int(m.pool_size())}
        m = getattr(m, "upstream_mr", None)
        seen += 1
    return {"pid": os.getpid(), "pool_size": None}


def _nvml_used() -> dict[int, int | None]:
    """pid -> bytes NVML lists on GPU 0 (pids of another namespace are listed as NVML gives them)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {int(p.pid): (int(p.usedGpuMemory) if isinstance(p.usedGpuMemory, int) else None)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    finally:
        pynvml.nvmlShutdown()


def _run_out_of_pool(chunk: int = GiB) -> dict:
    """A task that allocates until the pool says no; everything is freed when it ends."""
    import rmm

    held = []
    try:
        while len(held) < 4096:
            held.append(rmm.DeviceBuffer(size=chunk))
    except MemoryError as e:
        return {"allocated": len(held) * chunk, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    return {"allocated": len(held) * chunk, "error": None}


def _next_task(n: int = 2**28) -> int:
    """A task that needs the GPU after the out-of-memory one: 1 GiB through CuPy (RMM's pool)."""
    import cupy

    a = cupy.ones(n, dtype=cupy.float32)
    return int(a.sum())


def _wait_for(client, n: int, timeout: float = 120) -> None:
    client.wait_for_workers(n, timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(client.run(os.getpid, on_error="ignore")) == n:
            return
        time.sleep(0.5)
    raise AssertionError(f"{n} workers did not come back in {timeout} s")


def _write(figures: dict) -> None:
    out = os.environ.get("OUT")
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(out) / "rmm-restarts.json").write_text(json.dumps(figures, indent=1, default=str))


@pytest.mark.gpu
@pytest.mark.process
@pytest.mark.timeout(300)
def test_two_commands_pools_equal_and_identical_through_restarts_kill_and_oom(gpudask_cluster_factory, tmp_path):
    pytest.importorskip("rmm")
    own = tmp_path / "tmp"  # a state directory of this test's own: no other gpudask command is counted
    own.mkdir(mode=0o700)
    figures: dict = {"gpudask": [], "dask_cuda": [], "nvml": []}
    cuda = None
    if importlib.util.find_spec("dask_cuda") is not None:
        cuda = gpudask_cluster_factory("dask-cuda")
        cuda.scheduler(env=base_env())
        for label in ("cuda-a", "cuda-b"):
            cuda.spawn(label, [sys.executable, "-m", "dask", "cuda", "worker", "--scheduler-file", cuda.scheduler_file,
                               "--rmm-pool-size", "20GB", "--death-timeout", "60", "--no-dashboard"], base_env())
    else:
        figures["dask_cuda"] = "skipped: dask_cuda is not importable"

    # the tasks below are functions of this module: the scheduler and workers import it
    here = os.path.dirname(os.path.abspath(__file__))
    env = base_env(DASK_GPUDASK__RMM__ALLOCATOR="pool", TMPDIR=str(own),
                   PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    env.pop("XDG_RUNTIME_DIR", None)
    gd = gpudask_cluster_factory("gpudask")
    gd.scheduler(env=env)
    cuda_client = cuda.client(timeout=60) if cuda is not None else None
    client = gd.client(timeout=60)
    try:
        if cuda_client is not None:  # dask-cuda's pools first: gpudask's workers start beside them
            _wait_for(cuda_client, 2)
        gd.worker("--preload", "gpudask", "--nworkers", "1", "--nthreads", "1", env=env, label="first")
        _wait_for(client, 1)
        gd.worker("--preload", "gpudask", "--nworkers", "1", "--nthreads", "1", env=env, label="second")
        _wait_for(client, 2)

        def step(name: str) -> list[tuple[int | None, int | None]]:
            pools = client.run(_pool)
            row = {"step": name, "workers": list(pools.values())}
            figures["gpudask"].append(row)
            if cuda_client is not None:
                figures["dask_cuda"].append({"step": name, "workers": list(cuda_client.run(_dask_cuda_pool).values())})
            figures["nvml"].append({"step": name, "used": _nvml_used()})
            _write(figures)
            return sorted((w["pool_size"], w["maximum_pool_size"]) for w in pools.values())

        start = step("start")
        print("start:", start)
        after = []
        for i in range(RESTARTS):
            if cuda_client is not None:
                cuda_client.restart(timeout=120)
            client.restart(timeout=120)
            _wait_for(client, 2)
            after.append(step(f"restart {i + 1}"))
        first = after[0]
        assert first[0] == first[1], f"pools differ after a restart: {first}"
        assert first[0][0] is not None and first[0][0] >= 30 * GiB, first  # 0.5 of an H200 / 2 workers
        assert all(a == first for a in after), after
        if cuda_client is not None:
            sizes = [sorted(w["pool_size"] for w in r["workers"]) for r in figures["dask_cuda"][1:]]
            figures["dask_cuda_equal_and_identical"] = all(s == sizes[0] and s[0] == s[-1] for s in sizes)

        # kill -9 of one worker: its nanny starts another, with the same pool
        victim = next(iter(client.run(os.getpid).values()))
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pids = client.run(os.getpid, on_error="ignore")
            if len(pids) == 2 and victim not in pids.values():
                break
            time.sleep(0.5)
        assert step("kill -9") == first

        # a task that runs the pool out of memory, then the next task on that worker and its neighbour
        a, b = sorted(client.run(os.getpid))
        oom = client.submit(_run_out_of_pool, workers=[a], pure=False).result(timeout=120)
        figures["oom"] = oom
        assert oom["error"] and ("MemoryError" in oom["error"] or "out_of_memory" in oom["error"]), oom
        for addr in (a, b):
            assert client.submit(_next_task, workers=[addr], pure=False).result(timeout=60) == 2**28
        grown = {w["pid"]: w["pool_size"] for w in client.run(_pool).values()}
        figures["after_oom"] = grown
        cap = first[0][1]
        assert cap is not None and all(size <= cap for size in grown.values()), (grown, cap)
        client.restart(timeout=120)
        _wait_for(client, 2)
        assert step("restart after the out-of-memory task") == first
    finally:
        _write(figures)
        client.close()
        if cuda_client is not None:
            cuda_client.close()

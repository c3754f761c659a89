"""The spill store in live workers: an in-process worker, then real `dask worker --preload gpudask`
processes on a described host (the store needs no device of its own: it only moves objects
whose type says they are on one, so a stand-in class shows it working on this CPU machine).
"""

from __future__ import annotations

import textwrap
import time

import pytest
from conftest import BENCH_MISSING, base_env, host, plan_on
from test_spill_store import FakeDeviceArray, dev

from gpudask.plugins.spill import plugin as spill
from gpudask.plugins.spill.store import DeviceHostStore

KEY = "gpudask.spill.device-memory-limit"
MB = 10**6


def make_chunk(i: int) -> FakeDeviceArray:
    return dev(MB, i)


def total(*chunks: FakeDeviceArray) -> int:
    return int(sum(int(c.data.sum()) for c in chunks))


def test_store_replaces_worker_data_before_any_task_and_spills_under_distributed(tmp_path):
    from distributed import Client, LocalCluster

    host_plan = plan_on(host("h200-single.json"), "tcp", **{KEY: "4MB", "gpudask.spill.log": True})
    plan = host_plan.workers[0]
    assert plan.sections["spill"]["device_memory_limit"] == 4 * MB
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0",
                      memory_limit="2GB", local_directory=str(tmp_path)) as cluster, Client(cluster) as client:
        (worker,) = cluster.workers.values()
        host_tier = worker.data
        assert type(host_tier).__name__ == "SpillBuffer" and not host_tier  # distributed's own, empty
        spill.gpudask_server_setup(host_plan.ctx, plan, worker)  # what dask_setup does before registration
        store = worker.data
        assert isinstance(store, DeviceHostStore) and worker.state.data is store and store.host is host_tier
        assert store.device_memory_limit == 4 * MB and store.log_spilling
        spill.gpudask_server_setup(host_plan.ctx, plan, worker)  # a second call (WorkerPlugin) keeps it
        assert worker.data is store

        chunks = client.map(make_chunk, range(10))
        result = client.submit(total, *chunks).result()
        assert result == sum(i * MB for i in range(10))
        m = worker.metrics[spill.METRIC](worker)
        assert m["limit"] == 4 * MB and m["device_bytes"] <= 4 * MB and m["device_count"] <= 4
        assert m["spilled_count"] >= 6 and m["spilled_bytes"] >= 6 * MB and m["unspilled_count"] >= 1
        # the host copies are in distributed's SpillBuffer, under its memory limit
        assert sum(1 for k in host_tier if k in store) >= 6
        # the metric reaches the scheduler with the heartbeats
        deadline = time.time() + 30
        while time.time() < deadline:
            seen = client.scheduler_info()["workers"][worker.address]["metrics"].get(spill.METRIC)
            if seen and seen["spilled_count"] >= 6:
                break
            time.sleep(0.2)
        assert seen and seen["spilled_count"] >= 6 and seen["limit"] == 4 * MB
        del chunks
        client.run(lambda: None)
        deadline = time.time() + 10
        while len(store) and time.time() < deadline:
            time.sleep(0.05)
        assert len(store) == 0 and store.device_bytes == 0


def test_no_limit_leaves_the_worker_store_alone(tmp_path):
    from distributed import LocalCluster

    host_plan = plan_on(host("h200-single.json"), "tcp", **{KEY: False})
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0", memory_limit="2GB",
                      local_directory=str(tmp_path)) as cluster:
        (worker,) = cluster.workers.values()
        before = worker.data
        spill.gpudask_server_setup(host_plan.ctx, host_plan.workers[0], worker)
        assert worker.data is before and spill.METRIC not in worker.metrics


CHUNKS = textwrap.dedent('''
    """Stand-in device arrays for the process test (importable by the worker and the client)."""
    import numpy as np


    class FakeDeviceArray:
        def __init__(self, data):
            self.data = data

        @property
        def __cuda_array_interface__(self):
            return {"shape": self.data.shape, "typestr": self.data.dtype.str,
                    "data": (self.data.ctypes.data, False), "version": 3}

        @property
        def nbytes(self):
            return self.data.nbytes


    def make(i):
        return FakeDeviceArray(np.full(1_000_000, i, dtype="u1"))


    def total(*chunks):
        return int(sum(int(c.data.sum()) for c in chunks))


    def store_view(dask_worker):
        data = dask_worker.data
        return {"type": type(data).__name__, "limit": getattr(data, "device_memory_limit", None),
                "host": type(getattr(data, "host", None)).__name__, "state": dask_worker.state.data is data,
                "log": getattr(data, "log_spilling", None)}


    def spill_metric(dask_worker):
        return dask_worker.metrics["gpudask-spill"](dask_worker)
''')


@pytest.mark.process
def test_preloaded_workers_have_the_store_and_spill(cluster, tmp_path, monkeypatch):
    (tmp_path / "fakechunks.py").write_text(CHUNKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import fakechunks

    env = base_env(GPUDASK_FACTS=host("h200-single.json"), PYTHONPATH=str(tmp_path),
                   DASK_GPUDASK__SPILL__DEVICE_MEMORY_LIMIT="4MB", DASK_GPUDASK__SPILL__LOG="true")
    cluster.scheduler()
    cluster.worker("--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", "--memory-limit", "2GB", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        views = client.run(fakechunks.store_view)
        assert list(views.values()) == [{"type": "DeviceHostStore", "limit": 4 * MB, "host": "SpillBuffer",
                                         "state": True, "log": True}] * 2, cluster.log("worker")
        (address, _), *_ = views.items()
        chunks = client.map(fakechunks.make, range(10), workers=[address])
        result = client.submit(fakechunks.total, *chunks, workers=[address]).result()
        assert result == sum(i * MB for i in range(10))
        m = client.run(fakechunks.spill_metric, workers=[address])[address]
        assert m["spilled_count"] >= 6 and m["device_bytes"] <= 4 * MB and m["unspilled_count"] >= 1
    assert "moved key" in cluster.log("worker") and "from device to host" in cluster.log("worker")


# -- the bench workload's plumbing (the figure itself is measured on the GPU machine) ---------
def test_bench_chunks_cover_the_working_set():
    pytest.importorskip("gpudask_bench", reason=BENCH_MISSING)
    from gpudask_bench.spill import expected_total, plan_chunks

    elems, chunks = plan_chunks(8 * 10**9, 1)
    assert elems * 8 == 256 * 2**20 and chunks * elems * 8 >= 2.5 * 8 * 10**9 > (chunks - 1) * elems * 8
    elems, chunks = plan_chunks(4 * MB, 2, factor=2)
    assert elems * 8 == 2**20 and chunks == 16  # 2 x 2 x 4 MB in 1 MiB chunks; at most 1/16 of the limit, at least 1 MiB
    assert expected_total(10, 8) == 10 * (1 + 2 + 3 + 4 + 5 + 6 + 7 + 1)
    with pytest.raises(ValueError):
        plan_chunks(0, 1)


def test_bench_workload_runs_and_checks_its_total_with_a_stand_in_array_library(tmp_path, monkeypatch):
    """CuPy stands in as the stand-in device arrays (no GPU here): the workload spills and
    unspills through the store of a real worker, checks its total, and reports the spill
    metric; the NVML sampler falls back to no memory column without a driver."""
    import types

    import numpy as np
    from distributed import Client, LocalCluster

    pytest.importorskip("gpudask_bench", reason=BENCH_MISSING)
    from gpudask_bench.spill import spill_figure

    stream = types.SimpleNamespace(synchronize=lambda: None)
    fake = types.SimpleNamespace(full=lambda n, v, dtype: FakeDeviceArray(np.full(n, v, dtype=dtype)), cuda=types.SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)
    host_plan = plan_on(host("h200-single.json"), "tcp", **{KEY: "4MB"})
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0",
                      memory_limit="2GB", local_directory=str(tmp_path)) as cluster, Client(cluster) as client:
        (worker,) = cluster.workers.values()
        spill.gpudask_server_setup(host_plan.ctx, host_plan.workers[0], worker)
        result = spill_figure(client, 4 * MB, chunk_bytes=MB)
        worker_address = worker.address
    (w,) = result["workers"].values()
    assert result["chunks"] == 10 and result["working_set_bytes"] == 10 * MB
    assert result["spill_s"] > 0 and result["total"] > 0
    assert w["method"] is None and w["peak_bytes"] is None  # no NVML on this machine
    assert w["spill"]["spilled_count"] >= 6 and w["spill"]["unspilled_count"] >= 1
    assert result["chunks_per_worker"] == {worker_address: 10}

"""worker-memory: each GPU worker's host memory limit is the host's memory split between its
workers (distributed's 'auto' gives nthreads/CPUs of it and spilled CuPy arrays to disk: the
10x dot of dask-cuda's benchmark).  Plans on described hosts, then a live worker."""

from __future__ import annotations

import pytest
from conftest import base_env, host, plan_on


def _reason(plan):
    return next(r for r in plan.reasons if r.plugin == "worker-memory")


@pytest.mark.parametrize("facts, nworkers, share", [("workstation-2gpu-pcie.json", None, 0.5),
                                                     ("hgx-4gpu-2ib.json", 4, 0.25),
                                                     ("h200-single.json", 2, 0.5)])
def test_each_gpu_worker_gets_its_share_of_the_host(facts, nworkers, share):
    h = plan_on(host(facts), "ucx", nworkers)
    for w in h.workers:
        assert w.sections["worker-memory"]["host_memory_fraction"] == share
        assert "as dask cuda worker splits it" in _reason(w).why
    assert "worker-memory" not in h.scheduler.sections


def test_distributed_keeps_distributeds_own_limit_and_a_cpu_host_is_left_alone():
    w = plan_on(host("workstation-2gpu-pcie.json"), "ucx", **{"gpudask.worker-memory.limit": "distributed"}).workers[0]
    assert "worker-memory" not in w.sections
    assert "distributed's own default limit" in _reason(w).why
    cpu = plan_on(host("no-gpu.json"), "tcp").workers[0]
    assert "worker-memory" not in cpu.sections


def test_a_bad_value_is_refused():
    from gpudask.errors import ConfigError

    with pytest.raises(ConfigError, match=r"gpudask.worker-memory.limit = 'half' .*accepted: auto \| distributed"):
        plan_on(host("workstation-2gpu-pcie.json"), "ucx", **{"gpudask.worker-memory.limit": "half"})


@pytest.mark.process
def test_live_workers_run_with_the_split_limit_and_an_explicit_one_wins(cluster):
    from distributed.system import MEMORY_LIMIT

    env = base_env(GPUDASK_FACTS=host("hgx-4gpu-2ib.json"))
    cluster.scheduler()
    cluster.worker("--preload", "gpudask", "--nworkers", "4", "--nthreads", "1", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "1", "--nthreads", "1", "--memory-limit", "3GB",
                   env=env, label="explicit")
    with cluster.client() as client:
        client.wait_for_workers(5, timeout=90)
        limits = sorted(w["memory_limit"] for w in client.scheduler_info(n_workers=-1)["workers"].values())
    assert limits.count(int(MEMORY_LIMIT * 0.25)) == 4  # distributed's auto would give 1/2 on 2 CPUs
    assert 3 * 10**9 in limits  # --memory-limit wins


def _nanny_limit(dask_worker):
    return dask_worker.memory_manager.memory_limit


# sent by value: the nannies cannot import this test module
__import__("cloudpickle").register_pickle_by_value(__import__("sys").modules[__name__])


@pytest.mark.process
def test_the_nanny_restarts_the_worker_by_the_same_limit_the_worker_runs_with(cluster):
    """The nanny's memory monitor restarts its worker above 95 % of the *nanny's* limit. With
    only the worker's raised (1 GPU worker on a 16-CPU H200 host with --nthreads 1: worker
    the whole host, nanny distributed's auto 1/16 of it) the nanny killed the worker every
    few seconds once spilled GPU objects and pinned buffers filled host memory."""
    from distributed.system import MEMORY_LIMIT

    env = base_env(GPUDASK_FACTS=host("h200-single.json"))
    cluster.scheduler()
    cluster.worker("--preload", "gpudask", "--nworkers", "1", "--nthreads", "1", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "1", "--nthreads", "1", "--memory-limit", "3GB",
                   env=env, label="explicit")
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=90)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        nannies = {a: w["memory_limit"] for a, w in workers.items()}  # client.run(nanny=True) keys by worker
        import time

        deadline = time.monotonic() + 30  # the worker tells its nanny right after it starts
        while True:
            told = client.run(_nanny_limit, nanny=True)
            if told == nannies or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert sorted(nannies.values()) == [3 * 10**9, int(MEMORY_LIMIT)]  # the whole host for the 1 GPU worker
    assert told == nannies  # each nanny watches its worker by the worker's own limit; --memory-limit wins

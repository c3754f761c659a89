"""``dask worker --nworkers`` resolved as distributed resolves it (negative, ``auto``) before
gpudask plans, so every worker gets a plan for the same count and warnings say the
resolved numbers; real ``dask worker`` processes on a described GPU host."""

from __future__ import annotations

import pytest
from conftest import base_env, host

from dask.system import CPU_COUNT
from distributed.deploy.utils import nprocesses_nthreads

from gpudask.apply.runtime import resolve_nworkers

EIGHT_GPUS = host("dgx-8gpu-nvswitch-4ib.json")


def test_resolve_nworkers_the_way_distributed_does():
    assert resolve_nworkers(None) is None and resolve_nworkers(3) == 3 and resolve_nworkers("4") == 4
    assert resolve_nworkers(-1) == CPU_COUNT
    assert resolve_nworkers(-CPU_COUNT) == 1
    assert resolve_nworkers(-CPU_COUNT - 5) == 0  # distributed refuses it (no worker to plan for)
    assert resolve_nworkers(0) == 0
    assert resolve_nworkers("auto") == nprocesses_nthreads()[0]
    assert resolve_nworkers("many") is None  # click refuses it before anything starts


@pytest.mark.process
def test_a_negative_nworkers_gives_every_worker_a_plan_for_the_resolved_count(cluster):
    # distributed: CPU_COUNT + 1 + n workers; n chosen so that 2 start on any machine
    n = -(CPU_COUNT - 1)
    env = base_env(GPUDASK_FACTS=EIGHT_GPUS)
    cluster.scheduler(env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", str(n), "--nthreads", "1", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(2, timeout=120)
        workers = list(client.scheduler_info(n_workers=-1)["workers"].values())
    assert len(workers) == 2
    plans = [w["gpudask"]["plan"] for w in workers]
    assert sorted(p["index"] for p in plans) == [0, 1]
    assert len({p["gpu"] for p in plans}) == 2  # two distinct GPUs
    # each worker takes half the host's memory, never "the whole host" and "a half"
    assert [p["sections"]["worker-memory"]["host_memory_fraction"] for p in plans] == [0.5, 0.5]
    from distributed.system import MEMORY_LIMIT

    assert sum(w["memory_limit"] for w in workers) <= MEMORY_LIMIT
    log = cluster.log("worker")
    assert "dask worker starts 2 worker(s) on a host with 8 visible GPU(s): 6 GPU(s) stay idle" in log, log[-3000:]
    assert f"starts {n} worker(s)" not in log


@pytest.mark.process
def test_a_negative_nworkers_distributed_refuses_gets_no_gpudask_warning(cluster):
    env = base_env(GPUDASK_FACTS=EIGHT_GPUS)
    cluster.scheduler(env=env)
    proc = cluster.worker("--preload", "gpudask", "--nworkers", str(-CPU_COUNT - 5), env=env)
    assert proc.wait(timeout=120) != 0
    log = cluster.log("worker")
    assert "at least one process" in log, log[-2000:]  # distributed's own refusal
    assert "stay idle" not in log and "worker(s) on a host" not in log, log[-2000:]


TWO_GPUS = host("workstation-2gpu-pcie.json")


@pytest.mark.process
def test_a_second_dask_worker_command_on_the_host_says_once_that_its_workers_share_gpus(cluster):
    """Each `dask worker` command numbers its workers from 0: the second one's worker lands
    on the first one's GPU, and gpudask says so once, in that command's log."""
    env = base_env(GPUDASK_FACTS=TWO_GPUS)
    cluster.scheduler(env=env)
    first = cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env, label="first")
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(1, timeout=120)
        cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env, label="second")
        client.wait_for_workers(2, timeout=120)
    log = cluster.log("second")
    line = (f"another dask worker command on this host (pid {first.pid}) already runs workers on GPU(s) 0: "
            "this command's 1 worker(s) share them")
    assert log.count(line) == 1, log[-3000:]
    assert "--nworkers 2" in log and "another dask worker" not in cluster.log("first")

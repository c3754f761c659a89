"""``register(client, restart=True)`` on a cluster already running gpudask (issue 40, data
loss): before, distributed's ``NannyPlugin(restart=True)`` restarted every worker at
registration although each already ran its whole plan, and the data scattered to them was
lost.  Now only the workers that do not run their plan are restarted: here none."""

from __future__ import annotations

import os

import pytest
from conftest import base_env, host

from gpudask.apply import server_plugins

TWO_GPUS = host("workstation-2gpu-pcie.json")


def test_only_workers_not_running_their_plan_need_a_restart():
    report = {
        "tcp://a:1": {"preloaded": True, "needs_restart": []},
        "tcp://b:1": {"preloaded": False, "needs_restart": []},  # WorkerPlugin alone: GPU not chosen by plan
        "tcp://c:1": {"preloaded": True, "needs_restart": [{"what": "UCX_TLS"}]},
    }
    assert server_plugins.workers_needing_restart(report) == ["tcp://b:1", "tcp://c:1"]


@pytest.mark.process
def test_register_with_restart_on_a_preloaded_cluster_keeps_the_workers_and_their_data(cluster):
    env = base_env(GPUDASK_FACTS=TWO_GPUS)
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        pids = client.run(os.getpid)
        futures = client.scatter(list(range(10)), broadcast=False)
        held = {f.key for f in futures}
        status = server_plugins.register(client, restart=True)
        assert client.run(os.getpid) == pids  # the same processes: none was restarted
        assert client.gather(futures) == list(range(10))  # the data is still there
        assert set().union(*client.has_what().values()) >= held
    assert sorted(status) == sorted(pids)
    assert all(s["preloaded"] and s["needs_restart"] == [] for s in status.values()), status

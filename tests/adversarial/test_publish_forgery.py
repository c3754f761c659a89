"""``gpudask_publish`` accepts a worker's state only from that worker, and the docs' recipe
for a running cluster keeps its workers under every ``scheduler-check.action`` (issue 32)."""

from __future__ import annotations

import pytest
from conftest import base_env, host

TWO_GPUS = host("workstation-2gpu-pcie.json")

FORGED = {"version": "0.0.forged", "protocol": "tcp", "plan": {"role": "worker", "index": 0, "gpu": "GPU-forged",
                                                               "env": {"UCX_TLS": "forged"}}}


def _published(client) -> dict:
    return {a: (w.get("gpudask") or {}) for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}


@pytest.mark.process
def test_a_client_cannot_publish_for_a_real_worker(cluster):
    import gpudask

    env = base_env(GPUDASK_FACTS=TWO_GPUS)
    cluster.scheduler(env=env)  # no --preload: gpudask comes in through register_plugin
    cluster.worker("--nworkers", "2", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        client.register_plugin(gpudask.WorkerPlugin())
        client.register_plugin(gpudask.SchedulerPlugin())
        real = _published(client)
        assert all(p.get("version") == gpudask.__version__ for p in real.values()), real
        victim = sorted(real)[0]

        answer = client.sync(client.scheduler.gpudask_publish, worker=victim, published=FORGED)
        after = _published(client)
    # before: /gpudask showed the victim with the forged version, GPU and UCX_TLS
    assert answer == "OK"  # the scheduler read the victim's own state again
    assert after[victim].get("version") == gpudask.__version__, after[victim]
    assert "forged" not in repr(after[victim])


RECIPE = """
import sys
import gpudask
from distributed import Client

with Client(sys.argv[1], timeout=30) as client:
    client.wait_for_workers(2, timeout=60)
    client.register_plugin(gpudask.WorkerPlugin())
    client.register_plugin(gpudask.SchedulerPlugin())
    import time
    time.sleep(2)  # the check's refusals, if any, take effect
    print("WORKERS", len(client.scheduler_info(n_workers=-1)["workers"]))
"""


@pytest.mark.process
@pytest.mark.parametrize("action", ["refuse"])  # warn and error close no worker
def test_the_running_cluster_recipe_keeps_its_workers_under_every_action(cluster, tmp_path, action):
    import subprocess
    import sys

    env = base_env(GPUDASK_FACTS=TWO_GPUS, DASK_GPUDASK__SCHEDULER_CHECK__ACTION=action)
    cluster.scheduler(env=env)
    cluster.worker("--nworkers", "2", env=env)
    (tmp_path / "recipe.py").write_text(RECIPE)
    out = subprocess.run([sys.executable, "recipe.py", cluster.address], capture_output=True, text=True,
                         timeout=120, cwd=str(tmp_path), env=env)
    # before (SchedulerPlugin first, as the docs had it): refuse closed every worker
    assert out.returncode == 0, out.stderr[-3000:]
    assert "WORKERS 2" in out.stdout, out.stdout + out.stderr[-3000:]

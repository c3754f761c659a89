"""Real processes on loopback: stock `dask scheduler` / `dask worker` with `--preload gpudask`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import base_env, host

pytestmark = pytest.mark.process  # every test here starts dask processes


def info_json(*args: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--json", *args], capture_output=True,
                         text=True, timeout=120, env=env or base_env())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_preloaded_cluster_computes_and_workers_publish_their_plan(cluster):
    cluster.scheduler("--preload", "gpudask")
    cluster.worker("--preload", "gpudask", "--nworkers", "2", "--nthreads", "1")
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        assert client.submit(sum, [1, 2, 3]).result() == 6
        workers = client.scheduler_info(n_workers=-1)["workers"]
        published = [w["gpudask"] for w in workers.values()]
    assert sorted(p["plan"]["index"] for p in published) == [0, 1]
    assert all(p["role"] == "worker" and p["plan"]["role"] == "worker" for p in published)
    assert all(p["facts"]["schema"] == 2 and p["protocol"] == "tcp" for p in published)
    # this CPU host over tcp: gpudask decided nothing, so it says nothing at INFO
    assert "distributed.gpudask" not in cluster.log("worker") + cluster.log("scheduler")


def test_workers_get_exactly_what_gpudask_info_prints(cluster):
    """A described 4-GPU host: each worker's plan and environment equal `gpudask info` for that host."""
    facts = host("hgx-4gpu-2ib.json")
    env = base_env(GPUDASK_FACTS=facts)
    expected = info_json("--facts", facts, "--nworkers", "2", env=base_env())["workers"]
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        # msgpack hands lists back as tuples: compare as JSON, like `gpudask info --json`
        plans = {w["gpudask"]["plan"]["index"]: json.loads(json.dumps(w["gpudask"]["plan"])) for w in workers.values()}
        real_env = client.run(lambda: {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "UCX_TLS")})
        cvd = {w["gpudask"]["plan"]["index"]: real_env[addr]["CUDA_VISIBLE_DEVICES"] for addr, w in workers.items()}
    for i in (0, 1):
        for field in ("gpu", "cuda_visible_devices", "env", "config", "interface", "cpu_affinity", "sections",
                      "multiprocessing_method"):
            assert plans[i][field] == expected[i][field], (i, field)
        assert cvd[i] == expected[i]["env"].get("CUDA_VISIBLE_DEVICES")


def test_worker_without_nanny_plans_for_itself(cluster):
    cluster.scheduler("--preload", "gpudask")
    cluster.worker("--preload", "gpudask", "--no-nanny")
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        (published,) = [w["gpudask"] for w in client.scheduler_info()["workers"].values()]
    assert published["role"] == "worker" and published["plan"]["index"] == 0


def test_interface_given_to_dask_worker_wins_and_matches_gpudask_info(cluster):
    """On the described HGX host the plan would name ib0; `--interface lo` is the user's choice."""
    facts = host("hgx-4gpu-2ib.json")
    env = base_env(GPUDASK_FACTS=facts, GPUDASK_PLUGINS="gpu-pinning,tcp,infiniband")
    expected = info_json("--facts", facts, "--nworkers", "1", "--interface", "lo",
                         env=base_env(GPUDASK_PLUGINS="gpu-pinning,tcp,infiniband"))["workers"][0]
    assert expected["interface"] == "lo"
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "1", "--interface", "lo", env=env)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        ((addr, w),) = client.scheduler_info()["workers"].items()
    published = w["gpudask"]["plan"]
    assert published["interface"] == "lo" == expected["interface"]
    assert any("dask worker --interface" in r["why"] for r in published["reasons"])
    assert addr.startswith("tcp://127.0.0.1:")

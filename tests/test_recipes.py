"""The deployment recipes of docs/usage.md (docs/recipes/*.py), run for real without Slurm or Kubernetes.

The Slurm recipe builds its cluster (scheduler in this process, gpudask preloaded) and
its job script; the script is then run with bash, as Slurm would run it on a node (here
described as a 4-GPU HGX).  The Kubernetes recipe is a DaskCluster manifest; its
scheduler and worker container commands are run as the pods would run them (the worker
pod described as a one-GPU host).  Either way the workers must come up with
gpudask, one per GPU.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import base_env, host

ROOT = pathlib.Path(__file__).parent.parent
RECIPES = ROOT / "docs" / "recipes"


@pytest.mark.parametrize("name", ["slurm.py", "kubernetes.yaml"])
def test_usage_shows_each_recipe_verbatim(name):
    usage = (ROOT / "docs" / "usage.md").read_text()
    assert f"](recipes/{name})" in usage, f"docs/usage.md does not link docs/recipes/{name}"
    blocks = re.findall(r"```(?:python|yaml)\n(.*?)```", usage, flags=re.S)
    assert (RECIPES / name).read_text() in blocks, f"docs/usage.md must show docs/recipes/{name} as it is"


SLURM_DRIVER = """
import json, os, runpy, signal, subprocess, sys
from distributed import Client

cluster = runpy.run_path(sys.argv[1])["gpu_cluster"](protocol="tcp")
script = cluster.job_script()
# the job as Slurm would start it on a node: the script itself, run by bash
job = subprocess.Popen(["bash", "-c", script], env={**os.environ, "GPUDASK_FACTS": sys.argv[2]},
                       start_new_session=True)
try:
    with Client(cluster) as client:
        client.wait_for_workers(4, timeout=150)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        preloads = client.run_on_scheduler(lambda dask_scheduler: [p.name for p in dask_scheduler.preloads])
        print(json.dumps({"script": script, "address": cluster.scheduler_address, "scheduler_preloads": preloads,
                          "workers": [dict(w.get("gpudask") or {}, resources=w.get("resources"))
                                      for w in workers.values()]}, default=str))
finally:
    os.killpg(job.pid, signal.SIGTERM)
    job.wait(30)
    cluster.close()
"""


@pytest.mark.process
def test_slurm_recipe_job_script_starts_one_gpudask_worker_per_gpu(tmp_path):
    out = subprocess.run([sys.executable, "-c", SLURM_DRIVER, str(RECIPES / "slurm.py"), host("hgx-4gpu-2ib.json")],
                         cwd=tmp_path, env=base_env(), capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    script = report["script"]
    assert "#SBATCH --gres=gpu:4" in script and "export DASK_GPUDASK__RMM__POOL_SIZE=0.8" in script
    command = next(line for line in script.splitlines() if "distributed.cli.dask_worker" in line).split()
    assert command[command.index("--nworkers") + 1] == "4"  # one worker per GPU of the node
    assert command[command.index("--nthreads") + 1] == "1"
    assert command[command.index("--preload") + 1] == "gpudask"
    assert report["address"] in command
    assert report["scheduler_preloads"] == ["gpudask"]
    workers = report["workers"]
    assert len(workers) == 4
    assert sorted(w["plan"]["gpu_index"] for w in workers) == [0, 1, 2, 3]  # each its own GPU
    assert {w["plan"]["cuda_visible_devices"] for w in workers} == {"0,1,2,3", "1,2,3,0", "2,3,0,1", "3,0,1,2"}
    assert all(w["resources"] == {"GPU": 1} for w in workers)


def _kubernetes_manifest() -> dict:
    import yaml

    return yaml.safe_load((RECIPES / "kubernetes.yaml").read_text())


def test_kubernetes_recipe_has_one_gpu_and_one_worker_per_pod():
    spec = _kubernetes_manifest()
    assert (spec["apiVersion"], spec["kind"]) == ("kubernetes.dask.org/v1", "DaskCluster")
    worker_group = spec["spec"]["worker"]
    assert worker_group["replicas"] == 4
    worker = worker_group["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    args = worker["args"]
    assert args[:2] == ["dask", "worker"] and "$(DASK_WORKER_NAME)" in args
    assert args[args.index("--nworkers") + 1] == "1" and args[args.index("--preload") + 1] == "gpudask"
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    assert scheduler["args"][:2] == ["dask", "scheduler"] and scheduler["args"][-2:] == ["--preload", "gpudask"]
    assert not scheduler.get("resources"), "the scheduler needs no GPU"
    assert {"name": "DASK_GPUDASK__RMM__POOL_SIZE", "value": "0.8"} in worker["env"]


def test_kubernetes_recipe_is_what_make_cluster_spec_gives_with_the_preload():
    """Where dask-kubernetes is installed (not in the test extra: see pyproject.toml), the
    manifest is its operator's own spec plus gpudask's changes, nothing else."""
    pytest.importorskip("dask_kubernetes", reason="dask-kubernetes is not installed (not in the test extra)")
    from dask_kubernetes.operator import make_cluster_spec

    expected = make_cluster_spec(name="gpu", image="my-registry/gpudask:latest", n_workers=4,
                                 worker_command="dask worker", env={"DASK_GPUDASK__RMM__POOL_SIZE": "0.8"})
    expected["spec"].pop("idleTimeout")  # 0 is the operator's default
    worker = expected["spec"]["worker"]["spec"]["containers"][0]
    worker["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    worker["args"] += ["--nworkers", "1", "--preload", "gpudask"]
    scheduler = expected["spec"]["scheduler"]["spec"]["containers"][0]
    scheduler["args"] = ["dask", "scheduler", *scheduler["args"][1:], "--preload", "gpudask"]
    del scheduler["env"], scheduler["resources"]
    assert _kubernetes_manifest() == expected


def _container_command(args: list[str]) -> list[str]:
    """A container's args as this machine runs them (the `dask` of this environment)."""
    assert args[0] == "dask"
    return [str(pathlib.Path(sys.executable).parent / "dask"), *args[1:]]


@pytest.mark.process
def test_kubernetes_recipe_pods_commands_start_a_gpudask_worker(tmp_path):
    from distributed import Client

    spec = _kubernetes_manifest()
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    worker = spec["spec"]["worker"]["spec"]["containers"][0]
    pod_env = {e["name"]: e["value"] for e in worker["env"]}  # the scheduler's container sets none
    scheduler_file = tmp_path / "scheduler.json"
    procs = []
    try:
        # the scheduler pod's command; free ports and a scheduler file only because this is not a pod
        procs.append(subprocess.Popen(
            [*_container_command(scheduler["args"]), "--port", "0", "--dashboard-address", ":0",
             "--scheduler-file", str(scheduler_file)],
            env=base_env(), cwd=tmp_path, start_new_session=True,
            stdout=(tmp_path / "scheduler.log").open("w"), stderr=subprocess.STDOUT))
        deadline = time.time() + 60
        while not scheduler_file.exists():
            assert procs[0].poll() is None and time.time() < deadline, (tmp_path / "scheduler.log").read_text()
            time.sleep(0.2)
        address = json.loads(scheduler_file.read_text())["address"]
        # the worker pod's command, with what the operator puts in the pod's environment;
        # the pod sees one GPU: described here as a one-GPU host
        args = [a.replace("$(DASK_WORKER_NAME)", "gpu-default-worker-0") for a in worker["args"]]
        procs.append(subprocess.Popen(
            _container_command(args),
            env=base_env(**pod_env, DASK_SCHEDULER_ADDRESS=address, DASK_WORKER_NAME="gpu-default-worker-0",
                         GPUDASK_FACTS=host("single-gpu.json")),
            cwd=tmp_path, start_new_session=True, stdout=(tmp_path / "worker.log").open("w"),
            stderr=subprocess.STDOUT))
        with Client(address, timeout=30) as client:
            client.wait_for_workers(1, timeout=120)
            (info,) = client.scheduler_info(n_workers=-1)["workers"].values()
            preloads = client.run_on_scheduler(lambda dask_scheduler: [p.name for p in dask_scheduler.preloads])
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
    assert preloads == ["gpudask"]
    published = info["gpudask"]
    assert info["name"] == "gpu-default-worker-0" and info["resources"] == {"GPU": 1}
    assert published["plan"]["gpu_index"] == 0 and published["facts"]["hostname"] == "ws-4090"

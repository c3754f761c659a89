"""Process start in real clusters: stock `dask scheduler` / `dask worker` processes on loopback.

CPU tests stand in for GPUs with a described host (``GPUDASK_FACTS``): each worker's
real environment must match the plan ``gpudask info`` prints, through ``client.restart()``
and a killed worker process, with ``--preload`` and with ``--preload-nanny``; on an
InfiniBand host with ``--protocol ucx`` the workers must really come from a fork server.

GPU tests (``@pytest.mark.gpu``) run on the device machine only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from conftest import base_env, host

pytestmark = pytest.mark.process  # every test here starts dask processes

# The described hosts' InfiniBand ports, interfaces and cuda transports are not this machine's:
# the process-start plugins alone decide here (transport plugins have their own cluster tests).
PROCESS_PLUGINS = "gpu-pinning,cpu-affinity,forkserver,cuda-context"


def info_workers(facts: str, nworkers: int, protocol: str = "tcp", env: dict | None = None) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--json", "--facts", facts, "--nworkers",
                          str(nworkers), "--protocol", protocol], capture_output=True, text=True, timeout=120,
                         env=env or base_env())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["workers"]


def worker_state(client) -> dict[str, dict]:
    """nanny address -> what its worker process really has."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    real = client.run(lambda: {"pid": os.getpid(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                               "rapids": os.environ.get("RAPIDS_NO_INITIALIZE")})
    return {w["nanny"]: dict(real[addr], index=w["gpudask"]["plan"]["index"], resources=dict(w["resources"]))
            for addr, w in info.items()}


def assert_matches_plan(state: dict[str, dict], planned: list[dict]) -> None:
    for nanny, w in state.items():
        plan = planned[w["index"]]
        assert w["cvd"] == plan["cuda_visible_devices"] == plan["env"]["CUDA_VISIBLE_DEVICES"], (nanny, w)
        assert w["rapids"] == plan["env"]["RAPIDS_NO_INITIALIZE"] == "1"
        assert w["resources"] == plan["resources"] == {"GPU": 1}
    assert sorted(w["index"] for w in state.values()) == list(range(len(state)))
    assert len({w["cvd"] for w in state.values()}) == len(state)  # every worker its own GPU


def assert_forked_by_the_fork_server_of(cli_pid: int, workers) -> None:
    """Each worker's parent is a fork server, the child of the `dask worker` process."""
    for w in workers:
        parent = psutil.Process(w["pid"]).parent()
        assert "forkserver" in " ".join(parent.cmdline()), parent.cmdline()
        assert parent.ppid() == cli_pid


def wait_for_new_pids(client, old: dict[str, dict], n: int, timeout: float = 60) -> dict[str, dict]:
    deadline = time.time() + timeout
    while True:
        try:
            client.wait_for_workers(n, timeout=timeout)
            state = worker_state(client)
            if len(state) == n and all(state[k]["pid"] != old[k]["pid"] for k in old if k in state):
                return state
        except Exception:  # noqa: BLE001 - a worker may leave between the two calls while restarting
            pass
        if time.time() > deadline:
            raise TimeoutError("workers did not come back")
        time.sleep(0.3)


@pytest.mark.parametrize("facts,nworkers,cycle", [("hgx-4gpu-2ib.json", 3, True), ("mig.json", 2, False)])
def test_preload_gives_each_worker_its_gpu_through_restarts_and_kills(cluster, facts, nworkers, cycle):
    facts = host(facts)
    env = base_env(GPUDASK_FACTS=facts)
    planned = info_workers(facts, nworkers)
    cluster.scheduler()
    cli = cluster.worker("--preload", "gpudask", "--nworkers", str(nworkers), "--nthreads", "1", env=env)
    with cluster.client() as client:
        client.wait_for_workers(nworkers, timeout=60)
        first = worker_state(client)
        assert_matches_plan(first, planned)
        # a GPU host: every worker is forked by the fork server the `dask worker` process started
        assert_forked_by_the_fork_server_of(cli.pid, first.values())
        if not cycle:
            return

        client.restart()
        restarted = wait_for_new_pids(client, first, nworkers)
        assert_matches_plan(restarted, planned)
        assert {k: w["cvd"] for k, w in restarted.items()} == {k: w["cvd"] for k, w in first.items()}
        assert_forked_by_the_fork_server_of(cli.pid, restarted.values())

        victim = sorted(restarted)[1]
        os.kill(restarted[victim]["pid"], signal.SIGKILL)  # the nanny starts a new process
        after_kill = wait_for_new_pids(client, {victim: restarted[victim]}, nworkers)
        assert_matches_plan(after_kill, planned)
        assert {k: w["cvd"] for k, w in after_kill.items()} == {k: w["cvd"] for k, w in first.items()}


def test_preload_nanny_gives_each_worker_its_gpu(cluster):
    facts = host("uuid-visible.json")  # the user's CUDA_VISIBLE_DEVICES names GPUs by UUID
    env = base_env(GPUDASK_FACTS=facts)
    planned = info_workers(facts, 2)
    assert [w["cuda_visible_devices"].split(",")[0] for w in planned] == [
        "GPU-5a1ce6b0-981e-5c3c-adfe-eec30a070d42", "GPU-4a4a7cc0-dccc-5f35-a637-296e51e8883b"]
    cluster.scheduler()
    cluster.worker("--preload-nanny", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        # the nanny adds gpudask to its worker's preloads: each worker applies its own plan
        real = client.run(lambda: (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("RAPIDS_NO_INITIALIZE"),
                                   "gpudask" in sys.modules))
        first = sorted(real.values())
        assert first == sorted((w["cuda_visible_devices"], "1", True) for w in planned)
        before = client.run(os.getpid)
        client.restart()
        deadline = time.time() + 60
        while True:
            client.wait_for_workers(2, timeout=60)
            now = client.run(os.getpid)
            if len(now) == 2 and not set(now.values()) & set(before.values()):
                break
            assert time.time() < deadline, "workers did not restart"
            time.sleep(0.3)
        real = client.run(lambda: (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("RAPIDS_NO_INITIALIZE"),
                                   "gpudask" in sys.modules))
        assert sorted(real.values()) == first


@pytest.mark.ucx_client
def test_workers_come_from_a_fork_server_with_ucx_over_infiniband(cluster):
    facts = host("hgx-4gpu-2ib.json")
    env = base_env(GPUDASK_FACTS=facts, UCX_TLS="tcp", GPUDASK_PLUGINS=PROCESS_PLUGINS)
    planned = info_workers(facts, 2, "ucx", env=env)
    assert [w["multiprocessing_method"] for w in planned] == ["forkserver", "forkserver"]
    cluster.scheduler(protocol="ucx", env=base_env(UCX_TLS="tcp"))
    cli = cluster.worker("--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=90)
        real = client.run(lambda: (os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES"),
                                   os.environ.get("PTXCOMPILER_CHECK_NUMBA_CODEGEN_PATCH_NEEDED")))
        hashes = set(client.run(hash, "gpudask").values())
    # the fork server started like a spawned worker: distributed's PYTHONHASHSEED=6640
    seeded = subprocess.run([sys.executable, "-c", "print(hash('gpudask'))"], capture_output=True, text=True,
                            env=dict(base_env(), PYTHONHASHSEED="6640"), check=True).stdout.strip()
    assert hashes == {int(seeded)}
    assert all(addr.startswith("ucx://") for addr in real)
    assert sorted(cvd for _, cvd, _ in real.values()) == ["0,1,2,3", "1,2,3,0"]
    assert {ptx for _, _, ptx in real.values()} == {"0"}
    assert_forked_by_the_fork_server_of(cli.pid, [{"pid": pid} for pid, _, _ in real.values()])


# -- GPU (device machine only) ------------------------------------------------------------
def _gpu_uuid_of_context(pid: int) -> set[str]:
    import pynvml

    pynvml.nvmlInit()
    try:
        found = set()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            if any(p.pid == pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)):
                uuid = pynvml.nvmlDeviceGetUUID(h)
                found.add(uuid.decode() if isinstance(uuid, bytes) else uuid)
        return found
    finally:
        pynvml.nvmlShutdown()


def _compute_pids() -> set[int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        return {p.pid for i in range(pynvml.nvmlDeviceGetCount())
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))}
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.gpu
def test_gpu_only_worker_processes_hold_gpu_memory_over_ucx(cluster):
    """A real scheduler and 2 workers over UCX: NVML lists the worker pids and the scheduler's (which
    relays GPU results) as compute processes; each worker's context is on its own GPU; the nanny
    host holds none."""
    env = base_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    sched = cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cli = cluster.worker("--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(2, timeout=120)
        info = client.scheduler_info(n_workers=-1)["workers"]
        pids = client.run(os.getpid)
        assert all(addr.startswith("ucx://") for addr in pids)
        # the context each worker has is on the GPU its plan names (NVML: no context created here)
        for addr, pid in pids.items():
            plan = info[addr]["gpudask"]["plan"]
            assert _gpu_uuid_of_context(pid) == {plan["gpu"]}, (addr, plan["gpu"])
            # ... and what CUDA calls device 0 in the worker is that GPU
            seen = client.run(lambda: str(__import__("cuda.core", fromlist=["Device"]).Device(0).uuid), workers=[addr])
            assert bare(seen[addr]) == bare(plan["gpu"])
        holders = _compute_pids()
        ours = {sched.pid, cli.pid, *(c.pid for c in psutil.Process(cli.pid).children(recursive=True))}
        ours |= {c.pid for c in psutil.Process(sched.pid).children(recursive=True)}
        if not set(pids.values()) & holders:
            pytest.skip("NVML lists pids of another pid namespace (container): cannot match processes")
        # workers do, and the scheduler (it relays GPU results: its context on its own GPU); the
        # process hosting the nannies and its helpers do not
        assert holders & ours == set(pids.values()) | {sched.pid}
    logs = cluster.log("worker") + cluster.log("scheduler")
    assert "has a CUDA context" not in logs  # gpudask found no stray context anywhere
    assert "already exists on process ID" not in logs  # ucxx's warning about gpudask's own context is dropped


def bare(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-").replace("-", "")


TOUCH_FIRST = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.INFO)
    from cuda.core import Device
    Device(0).set_current()          # the client touches the GPU first ...
    import gpudask
    try:
        gpudask.initialize(protocol="ucx")  # ... and gpudask says so
    except gpudask.GpudaskError as e:
        print("RAISED", e)
""")


@pytest.mark.gpu
def test_gpu_client_that_touched_the_gpu_first_is_reported_by_initialize():
    env = base_env()
    out = subprocess.run([sys.executable, "-c", TOUCH_FIRST], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "this client process (pid" in out.stderr and "already has a CUDA context on GPU 0" in out.stderr
    assert "gpudask.initialize()" in out.stderr  # the fix is named
    out = subprocess.run([sys.executable, "-c", TOUCH_FIRST], capture_output=True, text=True, timeout=120,
                         env=dict(env, DASK_GPUDASK__CONTEXT__ON_EXISTING="error"))
    assert "RAISED" in out.stdout and "gpudask.context.on-existing=error" in out.stdout, out.stdout + out.stderr

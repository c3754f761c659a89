"""Real UCX (over TCP) between stock `dask scheduler` / `dask worker --preload gpudask` processes.

What each process really got -- ``ucxx.get_config()`` (UCX's own view once initialised), its
``UCX_*`` environment and its ``distributed-ucxx.*`` config -- is compared with the plan it
published (``scheduler_info()["workers"][addr]["gpudask"]["plan"]``) and with what
``gpudask info --json`` prints for the same host and config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import cloudpickle
import pytest
from conftest import base_env, host, real_gpu_count

pytestmark = pytest.mark.process  # every test here starts dask processes

# the functions below run in the workers, which cannot import this test module
cloudpickle.register_pickle_by_value(sys.modules[__name__])

UCX_FLAG_KEYS = ("tcp", "cuda-copy", "nvlink", "infiniband", "rdmacm", "create-cuda-context")


def info_json(*args: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--json", *args], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def ucx_env(**extra: str) -> dict[str, str]:
    """The environment of the dask processes: no UCX_* of ours unless a test sets one."""
    env = {k: v for k, v in base_env().items() if not k.startswith("UCX_") or k == "UCX_WARN_UNUSED_ENV_VARS"}
    env.update(extra)
    return env


def probe() -> dict:
    """What UCX, the environment and dask's config of this process say (run in workers, nannies, scheduler)."""
    import dask
    import ucxx
    from distributed_ucxx import ucxx as comm

    config = ucxx.get_config()
    return {"initialised": comm.ucxx is not None,
            "ucx": {k: config.get(k) for k in ("TLS", "SOCKADDR_TLS_PRIORITY", "NET_DEVICES", "MAX_RNDV_RAILS",
                                               "MEMTYPE_REG_WHOLE_ALLOC_TYPES")},
            "env": {k: v for k, v in os.environ.items() if k.startswith("UCX_")},
            "flags": {k: dask.config.get(f"distributed-ucxx.{k}", None) for k in UCX_FLAG_KEYS},
            "connect_timeout": dask.config.get("distributed.comm.timeouts.connect")}


async def connect_to_nobody() -> tuple[str, float]:
    """Connect over UCX to a port nobody listens on: distributed retries until its connect timeout."""
    from distributed.comm import connect

    start = time.monotonic()
    try:
        await connect("ucx://127.0.0.1:9")
    except OSError as e:
        return str(e), time.monotonic() - start
    return "connected?", time.monotonic() - start


def assert_process_got_its_plan(got: dict, plan: dict) -> None:
    assert got["initialised"], "UCX was not initialised in this process"
    ucx_vars = {k: v for k, v in plan["env"].items() if k.startswith("UCX_")}
    assert ucx_vars, plan
    for name, value in ucx_vars.items():
        assert got["env"].get(name) == value, name
        assert got["ucx"][name[len("UCX_"):]] == value, name  # UCX itself runs with it
    for key in UCX_FLAG_KEYS:
        assert got["flags"][key] == plan["config"].get(f"distributed-ucxx.{key}"), key


@pytest.fixture
def client_over_tcp(monkeypatch):
    """UCX in this (client) process: TCP only, it moves no GPU data."""
    monkeypatch.setenv("UCX_TLS", "tcp")
    monkeypatch.setenv("UCX_WARN_UNUSED_ENV_VARS", "n")


@pytest.mark.ucx_client
def test_ucx_processes_run_with_the_transports_their_plan_says(cluster, client_over_tcp):
    """Probed CPU host, no UCX_* exported: gpudask plans tcp (no GPU) and every process runs UCX that way."""
    env = ucx_env(DASK_GPUDASK__TRANSPORT__CONNECT_TIMEOUT="5s")
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    expected = info_json("--protocol", "ucx", "--nworkers", "2", env=env)  # while the workers start
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(2, timeout=180)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        got = client.run(probe)
        nannies = client.run(probe, nanny=True)
        scheduler = client.run_on_scheduler(probe)
        a, b = sorted(workers)
        x = client.submit(lambda: bytes(10**6), workers=[a], pure=False)
        assert client.submit(len, x, workers=[b], pure=False).result() == 10**6  # data moved over UCX
        refused = client.run(connect_to_nobody, workers=[a])[a]

    assert sorted(w["gpudask"]["plan"]["index"] for w in workers.values()) == [0, 1]
    for addr, w in workers.items():
        plan = json.loads(json.dumps(w["gpudask"]["plan"]))  # msgpack made tuples of its lists
        assert addr.startswith("ucx://") and w["gpudask"]["protocol"] == "ucx"
        want = expected["workers"][plan["index"]]
        for field in ("env", "config", "interface", "ucx_transports"):
            assert plan[field] == want[field], (addr, field)
        assert plan["env"]["UCX_TLS"] == "tcp" and plan["ucx_transports"] == ["tcp"]
        assert {"plugin": "nvlink", "decision": "skipped", "why": "no GPU visible"} in plan["reasons"]
        assert_process_got_its_plan(got[addr], plan)
        assert got[addr]["ucx"]["TLS"] == "tcp" and got[addr]["connect_timeout"] == "5s"
    for nanny in nannies.values():
        assert_process_got_its_plan(nanny, expected["nanny"])
        assert nanny["flags"]["create-cuda-context"] is False
    assert_process_got_its_plan(scheduler, expected["scheduler"])
    # the connect timeout really bounds UCX connects: distributed gave up after 5 s, not its default 30 s
    message, seconds = refused
    assert "Timed out trying to connect to ucx://127.0.0.1:9 after 5 s" in message
    assert 4 < seconds < 25


@pytest.mark.ucx_client
def test_ucx_tls_all_exported_starts_every_process_and_computes(cluster, client_over_tcp):
    """dask-cuda's automatic mode exports UCX_TLS=all: on a host without an InfiniBand port gpudask
    must not add rdmacm (UCX then had no component to listen with and the nanny died)."""
    env = ucx_env(UCX_TLS="all")
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(2, timeout=180)
        a, b = sorted(client.scheduler_info(n_workers=-1)["workers"])
        x = client.submit(lambda: bytes(10**6), workers=[a], pure=False)
        assert client.submit(len, x, workers=[b], pure=False).result() == 10**6
        nannies = client.run(probe, nanny=True)
        got = client.run(probe)
    for view in (*nannies.values(), *got.values()):
        assert view["ucx"]["TLS"] == "all" and view["ucx"]["SOCKADDR_TLS_PRIORITY"] != "rdmacm"
        assert view["flags"]["rdmacm"] in (False, None)


@pytest.mark.ucx_client
def test_ucx_auto_runs_ucx_with_its_own_choice(cluster, client_over_tcp):
    env = ucx_env(DASK_GPUDASK__TRANSPORT__MODE="ucx-auto")
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nthreads", "1", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(1, timeout=180)
        (addr, w), = client.scheduler_info()["workers"].items()
        got = client.run(probe)[addr]
        assert client.submit(sum, [1, 2], pure=False).result() == 3
    assert w["gpudask"]["plan"]["env"]["UCX_TLS"] == "^cuda"  # no GPU: UCX picks among all but CUDA transports
    assert_process_got_its_plan(got, w["gpudask"]["plan"])


RECORDER = textwrap.dedent('''
    """Records what gpudask applied, in the worker process before listen() and in the nanny after it."""
    import json, multiprocessing, os, pathlib

    OUT = pathlib.Path(os.environ["GPUDASK_TEST_RECORD_DIR"])


    def snapshot():
        import dask
        return {"env": {k: v for k, v in os.environ.items() if k.startswith("UCX_") or k == "CUDA_VISIBLE_DEVICES"},
                "config": {k: dask.config.get(k, None) for k in
                           ["distributed-ucxx." + f for f in ("tcp", "cuda-copy", "nvlink", "infiniband", "rdmacm",
                                                              "create-cuda-context")]},
                "index": os.environ.get("GPUDASK_WORKER_INDEX")}


    if multiprocessing.current_process().name == "Dask Worker process (from Nanny)":
        # imported right after gpudask, before listen(): UCX would now be asked for cuda_copy,
        # and distributed-ucxx would create a CUDA context, which this machine cannot. So the
        # worker stops here (until the test ends the processes) and its siblings carry on.
        (OUT / f"worker-{os.getpid()}.json").write_text(json.dumps(snapshot()))
        import time
        time.sleep(600)


    def dask_setup(server):  # --preload-nanny: after the nanny's listen(), i.e. after UCX initialised there
        import ucxx
        data = snapshot()
        data["ucx_tls"] = ucxx.get_config()["TLS"]
        (OUT / "nanny.json").write_text(json.dumps(data))
''')


def test_described_gpu_host_workers_get_their_plan_but_cuda_and_the_nanny_none(cluster, client_over_tcp, tmp_path):
    """GPUDASK_FACTS describes a 4-GPU NVLink workstation: `gpudask info` plans UCX_TLS with cuda_copy and
    cuda_ipc for the workers; the worker processes get that plan (recorded at import, before listen()) but
    for the CUDA part, which this CPU machine cannot open (docs/facts.md), while the nanny process really
    initialises UCX without any CUDA transport."""
    facts = host("partial-nvlink.json")
    record = tmp_path / "record"
    record.mkdir()
    recorder = tmp_path / "gpudask_record.py"
    recorder.write_text(RECORDER)
    env = ucx_env(GPUDASK_FACTS=facts, GPUDASK_TEST_RECORD_DIR=str(record))
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=ucx_env(UCX_TLS="tcp"))
    worker = cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--preload", str(recorder),
                            "--preload-nanny", str(recorder), "--nworkers", "2", env=env)
    expected = info_json("--protocol", "ucx", "--nworkers", "2", env=env)  # while the workers start
    deadline = time.time() + 180
    while len(list(record.glob("worker-*.json"))) < 2 or not (record / "nanny.json").exists():
        assert time.time() < deadline and worker.poll() is None, cluster.log("worker")
        time.sleep(0.2)
    workers = [json.loads(p.read_text()) for p in record.glob("worker-*.json")]
    nanny = json.loads((record / "nanny.json").read_text())

    plans = expected["workers"]
    assert [p["env"]["UCX_TLS"] for p in plans] == ["tcp,cuda_copy,cuda_ipc"] * 2
    recorded = sorted(workers, key=lambda w: w["env"]["CUDA_VISIBLE_DEVICES"])
    cuda_flags = ("distributed-ucxx.cuda-copy", "distributed-ucxx.nvlink", "distributed-ucxx.create-cuda-context")
    for got, plan in zip(recorded, plans):
        ucx_vars = {k: v for k, v in plan["env"].items() if k.startswith("UCX_") or k == "CUDA_VISIBLE_DEVICES"}
        ucx_vars["UCX_TLS"] = "tcp"  # the plan's tcp,cuda_copy,cuda_ipc without its CUDA part
        assert {k: got["env"].get(k) for k in ucx_vars} == ucx_vars
        assert all(plan["config"][k] is True and got["config"][k] is False for k in cuda_flags)
        assert got["config"] == {k: plan["config"][k] for k in got["config"] if k not in cuda_flags} | {
            k: False for k in cuda_flags}
    assert nanny["ucx_tls"] == expected["nanny"]["env"]["UCX_TLS"] == "tcp"
    assert nanny["config"]["distributed-ucxx.create-cuda-context"] is False
    assert nanny["config"] == {k: expected["nanny"]["config"][k] for k in nanny["config"]}


def test_client_gets_its_plan_from_initialize():
    """gpudask.initialize() in a user's process applies the client plan before the first UCX connect."""
    code = textwrap.dedent("""
        import json, os, dask, gpudask
        s = gpudask.initialize(protocol="ucx")
        print(json.dumps({"plan": s.plan.to_dict(), "env": {k: v for k, v in os.environ.items() if k.startswith("UCX_")},
                          "flags": {k: v for k, v in dask.config.get("distributed-ucxx").items()}}))
    """)
    env = ucx_env(GPUDASK_FACTS=host("hgx-4gpu-2ib.json"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    plan = got["plan"]
    # planned for the described host: rc,tcp,cuda_copy,cuda_ipc; this process (a CPU, no InfiniBand) runs, and
    # its plan says, the plan without the described hardware (docs/facts.md)
    assert info_json("--protocol", "ucx", env=env)["client"]["env"]["UCX_TLS"] == "rc,tcp,cuda_copy,cuda_ipc"
    assert plan["role"] == "client" and plan["env"]["UCX_TLS"] == "tcp"
    assert {"no GPU in UCX here", "no InfiniBand in UCX here"} <= {r["decision"] for r in plan["reasons"]}
    for name, value in plan["env"].items():
        if name.startswith("UCX_"):
            assert got["env"][name] == value, name
    assert "UCX_NET_DEVICES" not in got["env"] and "UCX_SOCKADDR_TLS_PRIORITY" not in got["env"]
    for key, value in plan["config"].items():
        if key.startswith("distributed-ucxx.") and key.count(".") == 1:
            assert got["flags"][key.split(".", 1)[1]] == value, key
    assert got["flags"]["create-cuda-context"] is False


@pytest.mark.gpu
def test_two_workers_sharing_the_gpu_move_data_over_cuda_ipc(cluster, client_over_tcp):
    """On a real GPU: two workers on one GPU, with only --preload gpudask, use cuda_ipc (plan and UCX agree)
    and move a 1 GB CuPy array end to end faster than 30 GB/s -- a rate TCP through host memory cannot reach,
    so it shows cuda_ipc carried the data (the figure is printed)."""
    pytest.importorskip("cupy")
    assert real_gpu_count() >= 1
    env = ucx_env(CUDA_VISIBLE_DEVICES="0")  # one GPU shared, whatever the machine has
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    with cluster.client(timeout=120) as client:
        client.wait_for_workers(2, timeout=180)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        tls = client.run(lambda: __import__("ucxx").get_config()["TLS"])
        from distributed import wait
        from distributed.diagnostics.nvml import has_cuda_context

        nanny_contexts = client.run(lambda: has_cuda_context().has_context, nanny=True)
        a, b = sorted(workers)

        def make(seed):
            import cupy

            x = cupy.full(2**30 // 8, float(seed))  # 1 GiB of float64
            cupy.cuda.runtime.deviceSynchronize()
            return x

        def receive(x):
            import cupy

            cupy.cuda.runtime.deviceSynchronize()
            return x.nbytes

        rates = []
        for seed in range(4):
            x = client.submit(make, seed, workers=[a], pure=False)
            wait(x, timeout=120)  # made on worker a; the timing below is the transfer to b
            start = time.perf_counter()
            nbytes = client.submit(receive, x, workers=[b], pure=False).result(timeout=120)
            rates.append(nbytes / (time.perf_counter() - start) / 1e9)
            del x
    print(f"\n1 GiB CuPy array worker to worker over ucx:// (shared GPU): "
          f"{', '.join(f'{r:.1f}' for r in rates)} GB/s (best {max(rates):.1f})")
    for w in workers.values():
        plan = w["gpudask"]["plan"]
        assert "cuda_ipc" in plan["ucx_transports"] and "cuda_ipc" in plan["env"]["UCX_TLS"].split(",")
        assert any(r["decision"] == "UCX transport cuda_ipc" and "shared by workers 0, 1" in r["why"]
                   for r in plan["reasons"])
    assert all("cuda_ipc" in t.split(",") for t in tls.values()), tls
    assert not any(nanny_contexts.values()), "the nanny process holds a CUDA context"
    assert max(rates) > 30, rates


@pytest.mark.process
@pytest.mark.ucx_client
def test_ucx_processes_are_quiet_but_a_users_misspelt_variable_is_reported(cluster):
    """UCX warned in every process about UCX_MEMTYPE_CACHE (set by ucxx itself); a user's own
    misspelt UCX_* variable is still reported -- by gpudask, with UCX's own suggestion."""
    env = {k: v for k, v in base_env().items() if not k.startswith("UCX_")}
    env["UCX_TSL"] = "tcp"
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nworkers", "1", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(1, timeout=90)
    logs = cluster.log("scheduler") + cluster.log("worker")
    assert "unused environment variable: UCX_MEMTYPE_CACHE" not in logs
    assert "UCX_TSL=tcp is not a variable UCX uses here (did you mean UCX_TLS?): UCX ignores it" in \
        cluster.log("scheduler")

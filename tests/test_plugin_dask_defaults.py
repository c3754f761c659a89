"""The built-in `gpu-dask-defaults` plugin: task-based rechunk/shuffle where GPU data is built."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import cloudpickle
import dask.config
import pytest
from conftest import base_env, host

from gpudask.config import Settings
from gpudask.errors import GpudaskError
from gpudask.facts import facts_from_dict, load_facts
from gpudask.plugin.manager import PluginManager
from gpudask.plan import PlanInputs, build_plan
from gpudask.plugins.dask_defaults import plugin

RECHUNK, SHUFFLE = "array.rechunk.method", "dataframe.shuffle.method"


def make(facts="h200-single.json", config=None, env=None, protocol="tcp"):
    env = dict(env or {})
    cfg: dict = {}
    dask.config.set(dict(config or {}), config=cfg)  # dotted keys into cfg, the global config untouched
    dask.config.update(cfg, dask.config.collect_env(env), priority="new")
    m = PluginManager()
    m.register(plugin)
    settings = Settings(m.config_options(), config=cfg, environ=env)
    facts_obj = load_facts(host(facts)) if isinstance(facts, str) else facts
    return build_plan(PlanInputs(facts_obj, settings, m, env, cfg), protocol, None)



def described(tmp_path, base="h200-single.json", **packages):
    data = json.loads(pathlib.Path(host(base)).read_text())
    data["packages"].update(packages)
    return facts_from_dict(data, str(tmp_path / "host.json"))


def reasons(plan, plugin_name="gpu-dask-defaults"):
    return [r for r in plan.reasons if r.plugin == plugin_name]


def test_gpu_workers_and_the_client_rechunk_with_tasks():
    h = make("hgx-4gpu-2ib.json")
    for p in (h.client, *h.workers):
        assert p.config[RECHUNK] == "tasks", p.role
        (r,) = [r for r in reasons(p) if r.decision.startswith(RECHUNK)]
        assert "P2P rechunk fails on CuPy-backed arrays" in r.why
    assert "graph is built here" in reasons(h.client)[0].why
    assert RECHUNK not in h.scheduler.config and RECHUNK not in h.nanny.config


def test_a_method_the_user_chose_wins_and_the_reason_says_so():
    h = make(config={RECHUNK: "p2p"})
    w = h.workers[0]
    assert RECHUNK not in w.config
    (r,) = reasons(w)
    assert r.decision == "array.rechunk.method kept at 'p2p'" and "explicit settings win" in r.why


def test_a_method_from_the_environment_wins():
    h = make(env={"DASK_ARRAY__RECHUNK__METHOD": "p2p"})
    assert RECHUNK not in h.client.config and RECHUNK not in h.workers[0].config


def test_no_gpu_host_keeps_dask_defaults():
    h = make("no-gpu.json")
    assert RECHUNK not in h.workers[0].config and RECHUNK not in h.client.config
    assert reasons(h.workers[0])[0].decision == "skipped"
    assert reasons(h.client)[0].decision == "skipped"


def test_a_client_without_gpu_but_with_cupy_builds_cupy_graphs(tmp_path):
    h = make(described(tmp_path, "no-gpu.json", cupy="14.2.0"))
    assert h.client.config[RECHUNK] == "tasks" and "cupy installed" in reasons(h.client)[0].why
    assert RECHUNK not in h.workers[0].config


def test_cudf_installed_means_task_shuffle(tmp_path):
    h = make(described(tmp_path, cudf="26.10.0"))
    for p in (h.client, h.workers[0]):
        assert p.config[SHUFFLE] == "tasks"
        assert any("does not support cuDF" in r.why for r in reasons(p))
    assert SHUFFLE not in make().workers[0].config  # no cuDF: pandas shuffles keep P2P
    h = make(described(tmp_path, cudf="26.10.0"), config={SHUFFLE: "p2p"})
    assert SHUFFLE not in h.workers[0].config and h.workers[0].config[RECHUNK] == "tasks"


@pytest.mark.process
def test_gpudask_info_shows_the_reason():
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--reasons", "--facts",
                          host("h200-single.json")], capture_output=True, text=True, timeout=120, env=base_env())
    assert out.returncode == 0, out.stderr
    assert "[gpu-dask-defaults] array.rechunk.method='tasks' -- P2P rechunk fails on CuPy-backed arrays" in out.stdout


CLIENT = """
import dask, gpudask
from dask.array.rechunk import _choose_rechunk_method
from distributed import Client
gpudask.initialize()
with Client(processes=False, n_workers=1, dashboard_address=None):
    # a rechunk large enough that dask would pick P2P whenever a client exists
    old, new = ((1,) * 400, (400,)), ((400,), (1,) * 400)
    print(dask.config.get("array.rechunk.method"), _choose_rechunk_method(old, new))
"""


@pytest.mark.process
@pytest.mark.parametrize("user, expected", [(None, "tasks tasks"), ("p2p", "p2p p2p")])
def test_initialized_client_builds_task_rechunks(user, expected):
    env = base_env(GPUDASK_FACTS=host("h200-single.json"))
    if user:
        env["DASK_ARRAY__RECHUNK__METHOD"] = user
    out = subprocess.run([sys.executable, "-c", CLIENT], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == expected


@pytest.mark.process
def test_described_gpu_worker_process_gets_the_setting(cluster):
    env = base_env(GPUDASK_FACTS=host("h200-single.json"))
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--nthreads", "1", env=env)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        (value,) = client.run(lambda: __import__("dask").config.get(RECHUNK)).values()
        (nanny_value,) = client.run(lambda: __import__("dask").config.get(RECHUNK), nanny=True).values()
    assert value == "tasks" and nanny_value is None


# ------------------------------------------------------------------ a plain client rechunking with P2P
P2P_CLIENT = """
import sys, warnings
import dask, dask.array as da, numpy as np
from distributed import Client, wait
assert "gpudask" not in sys.modules
seen = []
warnings.simplefilter("always")
warnings.showwarning = lambda msg, *a, **k: seen.append(str(msg))
ours = lambda: [w for w in seen if w.startswith("gpudask:")]

def rechunked(client):
    side = 400
    x = da.arange(side * side, chunks=side * side // 8, dtype="int64").reshape(side, side)
    x = x.rechunk((side, side // 8)).persist()
    wait(x)
    y = x.rechunk((side // 8, side))   # the method is chosen here, in the client
    out = client.compute(y).result(timeout=60)  # a warning comes before the result, on the same stream
    assert (out == np.arange(side * side).reshape(side, side)).all()
    return y.name.split("-")[1]

with Client(scheduler_file=sys.argv[1], timeout=60) as client:
    client.wait_for_workers(1, timeout=120)
    print("PLAIN", rechunked(client), rechunked(client), len(ours()), flush=True)  # two rechunks, one warning
with dask.config.set({"array.rechunk.method": "tasks"}), Client(scheduler_file=sys.argv[1], timeout=60) as client:
    before = len(ours())
    print("TASKS", rechunked(client), len(ours()) - before, flush=True)
for line in ours():
    print("WARNING", line)
assert "gpudask" not in sys.modules
"""


@pytest.mark.process
def test_a_plain_client_rechunking_with_p2p_is_warned_once_while_gpu_workers_are_connected(cluster, tmp_path):
    """A scheduler with --preload gpudask, a worker on a described 2-GPU host (tcp), and a client that does not
    import gpudask: its P2P rechunk of NumPy chunks runs (P2P works on NumPy) and it gets one warning naming the
    fix, however many P2P rechunks it sends; a client with method tasks gets none."""
    cluster.scheduler("--preload", "gpudask", env=base_env())
    cluster.worker("--preload", "gpudask", "--nthreads", "1",
                   env=base_env(GPUDASK_FACTS=host("workstation-2gpu-pcie.json")))
    script = tmp_path / "p2p_client.py"
    script.write_text(P2P_CLIENT)
    run = subprocess.run([sys.executable, str(script), str(cluster.scheduler_file)], capture_output=True,
                         text=True, env=base_env(), timeout=240, cwd=str(tmp_path))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out + cluster.log("scheduler")
    assert "PLAIN p2p p2p 1" in run.stdout and "TASKS merge 0" in run.stdout, out
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("WARNING ")]
    assert "P2P rechunk fails on CuPy-backed arrays" in line and "the workers have GPUs (tcp://" in line
    assert 'dask.config.set({"array.rechunk.method": "tasks"})' in line and "DASK_ARRAY__RECHUNK__METHOD=tasks" in line
    assert "gpudask.initialize()" in line
    assert "told client" in cluster.log("scheduler")


def test_p2p_rechunk_graphs_are_told_by_their_transfer_keys():
    from gpudask.plugins.dask_defaults.p2p import p2p_rechunk, worker_has_gpus

    assert p2p_rechunk([("rechunk-transfer-abc", 0, 1), "x"]) and p2p_rechunk(["rechunk-transfer-abc"])
    assert not p2p_rechunk([("rechunk-merge-abc", 0), ("rechunk-p2p-abc", 0), "shuffle-barrier-abc", (), None])
    gpu = json.loads(pathlib.Path(host("h200-single.json")).read_text())
    cpu = json.loads(pathlib.Path(host("no-gpu.json")).read_text())
    assert worker_has_gpus({"gpudask": {"facts": gpu}}) and not worker_has_gpus({"gpudask": {"facts": cpu}})
    assert not worker_has_gpus({}) and not worker_has_gpus(None) and not worker_has_gpus({"gpudask": {"facts": 1}})


# -- distributed's offload threshold, made to take effect in GPU workers ----------------------------
def test_offload_threshold_is_planned_for_gpu_workers_over_ucx_only():
    from conftest import plan_on

    h = plan_on(host("h200-single.json"), "ucx", 2, **{"gpudask.comm.offload-threshold": "false"})
    assert [w.config.get("distributed.comm.offload") for w in h.workers] == [False, False]
    assert "distributed.comm.offload" not in h.scheduler.config and "distributed.comm.offload" not in h.client.config
    h = plan_on(host("h200-single.json"), "ucx", 1, **{"gpudask.comm.offload-threshold": "512MiB"})
    assert h.workers[0].config["distributed.comm.offload"] == 512 * 2**20
    h = plan_on(host("h200-single.json"), "ucx", 1)  # default: 2 GiB, every GPU pull up to 2 GiB inline
    assert h.workers[0].config["distributed.comm.offload"] == 2 * 2**30
    h = plan_on(host("h200-single.json"), "ucx", 1, **{"gpudask.comm.offload-threshold": None})
    assert "distributed.comm.offload" not in h.workers[0].config  # null: distributed's own
    h = plan_on(host("h200-single.json"), "tcp", 1, **{"gpudask.comm.offload-threshold": False})
    assert "distributed.comm.offload" not in h.workers[0].config
    assert any(r.decision == "gpudask.comm.offload-threshold not applied" for r in h.workers[0].reasons)


@pytest.mark.parametrize("value", ["lots", -1, 0, True, "1e30 PB"])
def test_a_bad_offload_threshold_is_one_line(value):
    from conftest import plan_on

    with pytest.raises(GpudaskError) as e:
        plan_on(host("h200-single.json"), "ucx", 1, **{"gpudask.comm.offload-threshold": value})
    assert "gpudask.comm.offload-threshold" in str(e.value) and "\n" not in str(e.value)


def _offload_threshold():
    import distributed.comm.utils

    return distributed.comm.utils.OFFLOAD_THRESHOLD


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # run in the workers, which cannot import this module


@pytest.mark.process
@pytest.mark.ucx_client
def test_the_planned_offload_threshold_takes_effect_in_worker_processes(cluster):
    """distributed reads distributed.comm.offload when it is imported -- before a worker's plan
    applies: the config alone never took effect (docs/benchmarks.md)."""
    env = base_env(GPUDASK_FACTS=host("h200-single.json"), UCX_TLS="tcp",
                   DASK_GPUDASK__COMM__OFFLOAD_THRESHOLD="false")
    cluster.scheduler("--preload", "gpudask", env=env, protocol="ucx")
    cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=120)
        got = client.run(_offload_threshold)
        workers = client.scheduler_info()["workers"]
    assert set(got.values()) == {False}
    for w in workers.values():
        applied = w["gpudask"]["applied"]["plugins"]["gpu-dask-defaults"]
        assert applied["distributed.comm.utils.OFFLOAD_THRESHOLD"] == {"planned": False, "actual": False}
        assert not w["gpudask"]["mismatches"]

"""The three ways in: ``--preload gpudask`` (scheduler, worker, nanny) with options from the
environment and ``gpudask.toml``; ``LocalGPUCluster`` / ``cluster_kwargs``; and
``client.register_plugin`` on a running stock cluster (no preload), with the NannyPlugin
restart path.  Real ``dask scheduler`` / ``dask worker`` processes on loopback; GPUs come
from described hosts (``GPUDASK_FACTS``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import cloudpickle
import pytest
from conftest import base_env, host

import gpudask
from gpudask.apply import running
from gpudask.apply import server_plugins as distributed_plugins
from gpudask.plan import ProcessPlan

# functions sent to the scheduler / workers are defined here: send them by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TWO_GPUS = host("workstation-2gpu-pcie.json")
ROTATED = {0: "0,1", 1: "1,0"}


def info_json(*args: str, env: dict[str, str] | None = None, cwd: str | None = None) -> dict:
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--json", *args], capture_output=True,
                         text=True, timeout=120, env=env or base_env(), cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _scheduler_session(dask_scheduler=None):
    from gpudask.apply import process as session

    s = session.current()
    return None if s is None else {"role": s.role, "applied": s.applied,
                                   "plugins": [p["name"] for p in s.host.plugins]}


def _published(client) -> dict[int, dict]:
    workers = client.scheduler_info(n_workers=-1)["workers"]
    return {w["gpudask"]["plan"]["index"]: json.loads(json.dumps(w["gpudask"])) for w in workers.values()
            if w.get("gpudask")}


def _env(names=("CUDA_VISIBLE_DEVICES", "GPUDASK_WORKER_INDEX", "RAPIDS_NO_INITIALIZE")):
    return {k: os.environ.get(k) for k in names}


# ---------------------------------------------------------------------- 1. preload
@pytest.mark.process
def test_preload_scheduler_and_worker_take_options_from_gpudask_toml_and_environment(cluster, tmp_path):
    """gpudask.toml in the working directory of both processes; DASK_GPUDASK__* in the
    worker's environment wins over the file."""
    (tmp_path / "gpudask.toml").write_text(textwrap.dedent("""\
        [plugins]
        disable = ["infiniband"]

        [rmm]
        pool-size = "1GB"
        maximum-pool-size = "8GB"
        """))
    cluster.scheduler("--preload", "gpudask", cwd=str(tmp_path))
    env = base_env(GPUDASK_FACTS=TWO_GPUS, DASK_GPUDASK__RMM__POOL_SIZE="2GB")
    cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env, cwd=str(tmp_path))
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        scheduler = client.run_on_scheduler(_scheduler_session)
        published = _published(client)
        real_env = client.run(_env)
        # the WorkerPlugin on preloaded workers: nothing left to do, nothing needs a restart
        client.register_plugin(gpudask.WorkerPlugin())
        status = distributed_plugins.status(client)
    assert scheduler["role"] == "scheduler" and scheduler["applied"]
    assert "infiniband" not in scheduler["plugins"] and "rmm" in scheduler["plugins"]
    for i in (0, 1):
        p = published[i]
        assert "infiniband" not in [x["name"] for x in p["plugins"]]
        memory = p["plan"]["sections"]["rmm"]
        assert memory["initial_pool_size"] == 2 * 10**9  # the environment wins over gpudask.toml
        assert memory["maximum_pool_size"] == 8 * 10**9  # from gpudask.toml
        why = " ".join(r["why"] for r in p["plan"]["reasons"] if r["plugin"] == "rmm")
        assert "$DASK_GPUDASK__RMM__POOL_SIZE" in why and "gpudask.toml" in why
        assert p["memory"]["rmm"]["applied"] is False  # a described host: no real pool
    assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in real_env.values()) == ["0,1", "1,0"]
    assert all(s["preloaded"] and s["needs_restart"] == [] for s in status.values())


@pytest.mark.process
def test_preload_nanny_takes_options_from_the_file_named_by_gpudask_config(cluster, tmp_path):
    """`--preload-nanny gpudask` only (the workers do not import gpudask): the nannies put
    each worker's planned environment into its process, planned with $GPUDASK_CONFIG."""
    config = tmp_path / "conf" / "site.toml"
    config.parent.mkdir()
    config.write_text('[plugins]\ndisable = ["cuda-context"]\n')
    default = info_json("--facts", TWO_GPUS)
    assert default["workers"][0]["env"].get("RAPIDS_NO_INITIALIZE") == "1"  # what the file turns off
    expected = info_json("--facts", TWO_GPUS, env=base_env(GPUDASK_CONFIG=str(config)))["workers"]
    cluster.scheduler()
    cluster.worker("--preload-nanny", "gpudask", "--nworkers", "2",
                   env=base_env(GPUDASK_FACTS=TWO_GPUS, GPUDASK_CONFIG=str(config)))
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        real_env = client.run(_env)
        gpudask_imported = client.run(lambda: "gpudask" in sys.modules)
        published = client.scheduler_info(n_workers=-1)["workers"]
    by_index = {published[a]["gpudask"]["plan"]["index"]: e for a, e in real_env.items()}
    assert set(by_index) == {0, 1}
    for i, e in by_index.items():
        assert e["CUDA_VISIBLE_DEVICES"] == ROTATED[i] == expected[i]["env"]["CUDA_VISIBLE_DEVICES"]
        assert e["RAPIDS_NO_INITIALIZE"] is None  # cuda-context disabled by the file
    assert all(gpudask_imported.values())  # the nanny added gpudask to its worker's preloads
    assert "gpudask 0.1.0 (nanny, protocol tcp): plugins gpu-pinning(10)" in cluster.log("worker")
    assert "cuda-context" not in cluster.log("worker").split("(nanny, protocol tcp): plugins ")[1].splitlines()[0]


@pytest.mark.process
def test_preload_argv_is_left_to_the_users_own_click_preload(cluster, tmp_path):
    """gpudask takes dask-cuda's worker options after ``--preload gpudask`` (at import time,
    before distributed parses them: tests/test_dask_cuda_options.py), and refuses another
    option in one line.  distributed allows one click-configurable preload per server: when
    another preload is listed and no argument is one of gpudask's, the arguments (and the
    slot) stay the user's own."""
    mine = tmp_path / "mysetup.py"
    mine.write_text(textwrap.dedent("""\
        import click

        @click.command()
        @click.option("--greeting", default="none")
        def dask_setup(worker, greeting):
            worker.greeting = greeting
        """))
    cluster.scheduler()
    bad = subprocess.run([sys.executable, "-m", "dask", "worker", "--scheduler-file", cluster.scheduler_file,
                          "--preload", "gpudask", "--gpudask-pool-size", "1GB"],
                         capture_output=True, text=True, timeout=120, env=base_env(), cwd=str(tmp_path))
    assert bad.returncode != 0
    assert "Error: gpudask: --gpudask-pool-size: not an option of dask worker --preload gpudask" in bad.stderr
    assert "Traceback" not in bad.stderr
    # the scheduler address is given as an argument: with --scheduler-file, click would take
    # the first preload argument for the (optional) scheduler address
    cluster.spawn("worker", [sys.executable, "-m", "dask", "worker", cluster.address, "--host", "127.0.0.1",
                              "--no-dashboard", "--death-timeout", "60", "--preload", "gpudask",
                              "--preload", str(mine), "--greeting", "hello"],
                   base_env(GPUDASK_FACTS=TWO_GPUS, DASK_GPUDASK__RMM__POOL_SIZE="1GB"))
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        (greeting,) = client.run(lambda dask_worker: dask_worker.greeting).values()
        (published,) = _published(client).values()
    assert greeting == "hello"
    assert published["plan"]["sections"]["rmm"]["initial_pool_size"] == 10**9


# ------------------------------------------------------ 1b. LocalGPUCluster / cluster_kwargs
LOCAL_SCRIPT = """
import json, os, sys

def env():
    return {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "GPUDASK_WORKER_INDEX", "GPUDASK_GROUP")}

def describe(client):
    workers = client.scheduler_info(n_workers=-1)["workers"]
    real = client.run(env)
    return [{"name": w["name"], "resources": w.get("resources"), "nthreads": w["nthreads"],
             "index": w["gpudask"]["plan"]["index"], "plan_cvd": w["gpudask"]["plan"]["cuda_visible_devices"],
             "env": real[a]} for a, w in sorted(workers.items(), key=lambda kv: str(kv[1]["name"]))]

if __name__ == "__main__":
    import gpudask  # TOP-LEVEL: moved to the top of the script
    from distributed import Client, LocalCluster

    out = {}
    with gpudask.LocalGPUCluster(dashboard_address=None) as cluster, Client(cluster) as client:
        out["local_gpu_cluster"] = describe(client)
        out["scheduler_preloaded"] = client.run_on_scheduler(
            lambda dask_scheduler: "gpudask" in [p.name for p in dask_scheduler.preloads])
        cluster.scale(3)
        client.wait_for_workers(3, timeout=60)
        out["scaled"] = describe(client)
    kwargs = gpudask.cluster_kwargs()
    out["kwargs"] = kwargs
    with LocalCluster(dashboard_address=None, **kwargs) as cluster, Client(cluster) as client:
        out["cluster_kwargs"] = describe(client)
    out["client_session"] = gpudask.initialize().role
    print("RESULT " + json.dumps(out))
"""


@pytest.mark.process
@pytest.mark.parametrize("where", ["main-block", "top-level"])
def test_local_gpu_cluster_and_cluster_kwargs_give_one_worker_per_gpu(tmp_path, where):
    """The layout docs/usage.md shows (import at the top: spawned workers re-import the
    script as __mp_main__, so gpudask is first imported there) and the main-block one."""
    script = tmp_path / "local.py"
    text = LOCAL_SCRIPT
    if where == "top-level":
        text = "import gpudask\n" + text.replace("    import gpudask  # TOP-LEVEL: moved to the top of the script\n", "")
    script.write_text(text)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                         env=base_env(GPUDASK_FACTS=TWO_GPUS), cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.split("RESULT ", 1)[1])

    workers = result["local_gpu_cluster"]
    assert [w["name"] for w in workers] == [0, 1]  # n_workers: one per (described) GPU
    assert sorted(w["index"] for w in workers) == [0, 1]  # each claimed its own number
    for w in workers:
        assert w["env"]["CUDA_VISIBLE_DEVICES"] == w["plan_cvd"] == ROTATED[w["index"]]
        assert w["resources"] == {"GPU": 1} and w["nthreads"] == 1
    assert len({w["env"]["GPUDASK_GROUP"] for w in workers}) == 1
    assert result["scheduler_preloaded"]
    scaled = sorted(result["scaled"], key=lambda w: w["index"])
    assert [w["index"] for w in scaled] == [0, 1, 2]
    assert scaled[2]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"  # shared round-robin

    kwargs = result["kwargs"]
    assert kwargs["n_workers"] == 2 and kwargs["threads_per_worker"] == 1 and kwargs["processes"] is True
    assert kwargs["preload"] == ["gpudask"] and kwargs["scheduler_kwargs"] == {"preload": ["gpudask"]}
    assert "env" not in kwargs  # the plan travels in a file named by the client's environment
    plain = result["cluster_kwargs"]
    assert sorted(w["index"] for w in plain) == [0, 1]  # each claimed a number of its group
    for w in plain:
        assert w["env"]["CUDA_VISIBLE_DEVICES"] == ROTATED[w["index"]] and w["resources"] == {"GPU": 1}
    assert result["client_session"] == "client"


@pytest.mark.process
def test_cluster_kwargs_merges_user_arguments_and_refuses_threads(tmp_path):
    code = textwrap.dedent("""\
        import json, gpudask
        from gpudask.errors import ConfigError
        kw = gpudask.cluster_kwargs(n_workers=3, protocol="tcp://", preload=["mine.py"], env={"A": 1},
                                    scheduler_kwargs={"preload": "s.py", "idle_timeout": "1h"}, threads_per_worker=4)
        try:
            gpudask.cluster_kwargs(processes=False)
            refused = None
        except ConfigError as e:
            refused = str(e)
        print(json.dumps({"kw": kw, "refused": refused}))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=base_env(), cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    kw = data["kw"]
    assert kw["n_workers"] == 3 and kw["threads_per_worker"] == 4 and kw["protocol"] == "tcp"
    assert kw["preload"] == ["gpudask", "mine.py"]  # gpudask first: pinning before a user preload touches CUDA
    assert kw["scheduler_kwargs"] == {"preload": ["gpudask", "s.py"], "idle_timeout": "1h"}
    assert kw["env"] == {"A": "1"}
    assert data["refused"].startswith("processes=False is not valid with gpudask")


# --------------------------------------------------- 2. register_plugin on a running cluster
def _check_state(dask_scheduler=None):
    return {a: {"has_gpudask": "gpudask" in ws.extra, "check": ws.extra.get("gpudask-check", {}).get("status"),
                "codes": [f.get("code") for f in ws.extra.get("gpudask-check", {}).get("findings", [])]}
            for a, ws in dask_scheduler.workers.items()}


@pytest.mark.process
def test_register_plugin_on_a_stock_cluster_reports_restart_then_nanny_plugin_applies_it(cluster):
    cluster.scheduler()  # no preload anywhere
    cluster.worker("--nworkers", "2", env=base_env(GPUDASK_FACTS=TWO_GPUS, GPUDASK_GROUP=f"stock-{os.getpid()}"))
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        before = client.run(_env)
        client.register_plugin(gpudask.SchedulerPlugin())
        client.register_plugin(gpudask.WorkerPlugin())
        status = distributed_plugins.status(client)
        needs = distributed_plugins.needs_restart(client)
        resources = {a: w["resources"] for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
        metadata = client.get_metadata(["gpudask"])
        checked = client.run_on_scheduler(_check_state)
        after_register = client.run(_env)

        # the NannyPlugin: nothing changes until the restart the user asks for
        client.register_plugin(gpudask.NannyPlugin())
        assert client.run(_env) == after_register
        # unpickling the plugin imported gpudask in the running `dask worker` process: too late
        # to apply the nanny-host plan there, so nothing was applied
        nanny_env = client.run(lambda: {k: os.environ.get(k) for k in ("GPUDASK_PROTOCOL", "GPUDASK_SHADOWED")},
                               nanny=True)
        assert all(v == {"GPUDASK_PROTOCOL": None, "GPUDASK_SHADOWED": None} for v in nanny_env.values())
        client.restart()
        client.wait_for_workers(2, timeout=60)
        restarted_env = client.run(_env)
        published = _published(client)
        status_after = distributed_plugins.status(client)

    # before: stock workers, nothing planned in their environment
    assert all(e["CUDA_VISIBLE_DEVICES"] is None for e in before.values())
    # registered late: the GPU and the environment need a new process, and say so
    assert sorted(s["index"] for s in status.values()) == [0, 1]
    for address, s in status.items():
        assert not s["preloaded"]
        items = {i["what"]: i for i in needs[address]}
        cvd = items["CUDA_VISIBLE_DEVICES"]
        assert (cvd["planned"], cvd["actual"], cvd["plugin"]) == (ROTATED[s["index"]], None, "gpu-pinning")
        assert "new worker process" in cvd["why"]
        assert any(a.startswith("array.rechunk.method=") for a in s["applied"])  # late config applied
        assert "resource GPU=1" in s["applied"] and "gpudask_server_setup hooks" in s["applied"]
        assert any("client.restart()" in n for n in s["notes"])
        assert resources[address] == {"GPU": 1}
        late = metadata["workers"][address]["late"]
        assert json.loads(json.dumps(late["needs_restart"])) == json.loads(json.dumps(s["needs_restart"]))
        # published like a preloaded worker: the scheduler check compared it
        assert checked[address]["has_gpudask"] and checked[address]["check"] is not None
        assert "no-gpudask" not in checked[address]["codes"]
    assert metadata["scheduler"]["late"]["preloaded"] is False
    assert after_register == before  # nothing half-applied to the running processes
    assert "WARNING - gpudask: worker " in cluster.log("worker") and "needs a restart: CUDA_VISIBLE_DEVICES" \
        in cluster.log("worker")
    # the late import in the nanny-host process applied nothing at import time
    assert "gpudask 0.1.0 (nanny" not in cluster.log("worker")

    # after client.restart(): the nannies started workers with their plan, gpudask preloaded
    assert sorted(e["CUDA_VISIBLE_DEVICES"] for e in restarted_env.values()) == sorted(ROTATED.values())
    assert sorted(published) == [0, 1] and all(p["role"] == "worker" for p in published.values())
    assert all(s["preloaded"] and s["needs_restart"] == [] for s in status_after.values())


@pytest.mark.process
def test_register_helper_with_restart_applies_everything_at_once(cluster):
    cluster.scheduler()
    cluster.worker("--nworkers", "1", env=base_env(GPUDASK_FACTS=TWO_GPUS, GPUDASK_GROUP=f"restart-{os.getpid()}"))
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        status = distributed_plugins.register(client, restart=True)
        client.wait_for_workers(1, timeout=60)
        (env,) = client.run(_env).values()
        (published,) = _published(client).values()
    (s,) = status.values()
    assert s["preloaded"] and s["needs_restart"] == []
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["RAPIDS_NO_INITIALIZE"] == "1"
    assert published["plan"]["index"] == 0


# ------------------------------------------------------------------ units
def test_compare_sorts_late_config_from_what_needs_a_restart(monkeypatch):
    import dask

    plan = ProcessPlan("worker", index=1)
    plan.acting_plugin = "gpu-pinning"
    plan.set_gpu("GPU-1", 1, "1,0", "one GPU per worker")
    plan.acting_plugin = "tcp"
    plan.set_env("UCX_TLS", "tcp,cuda_copy", "transports")
    plan.set_config("distributed-ucxx.nvlink", True, "nvlink")
    plan.set_config("array.rechunk.method", "tasks", "p2p fails on cupy")
    plan.set_env("GPUDASK_WORKER_INDEX", "1", "bookkeeping")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # already right: not reported
    monkeypatch.delenv("UCX_TLS", raising=False)

    class Ctx:
        facts = type("F", (), {"described": True, "net_interfaces": {}})()

    with dask.config.set({"array.rechunk.method": "p2p"}):
        needs, late = running.missing_in_running_process(plan, Ctx())
    assert [(i["what"], i["planned"], i["actual"], i["plugin"]) for i in needs] == [
        ("UCX_TLS", "tcp,cuda_copy", None, "tcp"), ("distributed-ucxx.nvlink", True, None, "tcp")]
    assert late == {"array.rechunk.method": "tasks"}


def test_config_a_plugin_declares_read_at_start_needs_a_restart_and_goes_with_the_plugin(monkeypatch):
    """rmm's keys (distributed.rmm.*) are read by distributed-ucxx when UCX starts: the rmm
    plugin says so (config_read_at_start), the core does not know them."""
    import dask

    from gpudask.plugin.manager import PluginManager

    plan = ProcessPlan("scheduler")
    plan.acting_plugin = "rmm"
    plan.set_config("distributed.rmm.pool-size", "4GB", "set by you")
    with dask.config.set({"distributed.rmm.pool-size": None}):
        assert "distributed.rmm." not in running.CORE_READ_AT_START
        loaded = running.read_at_start(PluginManager.from_environment())
        needs, late = running.missing_in_running_process(plan, None, None, loaded)
        assert [(i["what"], i["plugin"]) for i in needs] == [("distributed.rmm.pool-size", "rmm")] and late == {}
        monkeypatch.setenv("GPUDASK_DISABLE_PLUGINS", "rmm")
        without = running.read_at_start(PluginManager.from_environment())
        assert without == running.CORE_READ_AT_START
        assert running.missing_in_running_process(plan, None, None, without) == (
            [], {"distributed.rmm.pool-size": "4GB"})


@pytest.mark.parametrize("bad", ["distributed.rmm.", ("",), (1,), {"a": 1}])
def test_config_read_at_start_of_the_wrong_shape_is_refused_at_registration(bad):
    import types

    from gpudask.errors import PluginError
    from gpudask.plugin.manager import PluginManager

    plugin = types.SimpleNamespace(name="odd", priority=300, config_read_at_start=bad)
    with pytest.raises(PluginError, match="config_read_at_start must be a tuple of dask config key prefixes"):
        PluginManager().register(plugin)


@pytest.mark.parametrize("bad", [("jit_unspill",), {"jit_unspill": 1}, {"": "x"}])
def test_dask_cuda_refused_of_the_wrong_shape_is_refused_at_registration(bad):
    import types

    from gpudask.errors import PluginError
    from gpudask.plugin.manager import PluginManager

    plugin = types.SimpleNamespace(name="odd", priority=300, dask_cuda_refused=bad)
    with pytest.raises(PluginError, match="dask_cuda_refused must be a dict"):
        PluginManager().register(plugin)


def test_lazy_names_resolve_to_the_plugin_classes():
    assert gpudask.WorkerPlugin is distributed_plugins.WorkerPlugin
    assert gpudask.NannyPlugin().restart is False and gpudask.NannyPlugin(restart=True).restart is True
    assert gpudask.SchedulerPlugin.name == "gpudask"


def test_memory_waits_for_the_planned_gpu(monkeypatch):
    """A late memory setup is built only when CUDA's device 0 is the worker's planned GPU."""
    from types import SimpleNamespace

    gpus = [SimpleNamespace(index=0, uuid="GPU-a"), SimpleNamespace(index=1, uuid="GPU-b")]
    ctx = SimpleNamespace(facts=SimpleNamespace(gpus=gpus))
    worker1 = SimpleNamespace(cuda_visible_devices="1,0")
    worker0 = SimpleNamespace(cuda_visible_devices="0,1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert running.gpu_matches(worker0, ctx) and not running.gpu_matches(worker1, ctx)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert running.gpu_matches(worker1, ctx) and not running.gpu_matches(worker0, ctx)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not running.gpu_matches(worker0, ctx)

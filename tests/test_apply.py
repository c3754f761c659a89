"""The apply stage, judged from outside: real `dask scheduler` / `dask worker` processes and
scripts laid out the way users write them, on described hosts (``GPUDASK_FACTS``)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import base_env, host, third_party_plugin as _third_party_plugin

TWO_GPUS = host("workstation-2gpu-pcie.json")


RAISING = """
    import os
    from gpudask import hookimpl

    name = "bad"
    priority = 500

    def _boom(plan):
        if plan.role == os.environ["BAD_ROLE"]:
            raise RuntimeError("boom")

    @hookimpl
    def {hook}(ctx, plan, {extra}):
        _boom(plan)
    """
RAISING_PRELOAD = RAISING.format(hook="gpudask_server_setup", extra="server")


@pytest.mark.process
@pytest.mark.parametrize("hook", ["gpudask_context_init", "gpudask_setup_memory", "gpudask_server_setup"])
def test_a_plugin_failing_in_a_worker_stops_dask_worker_with_one_line(cluster, tmp_path, hook):
    body = RAISING.format(hook=hook, extra="server" if hook == "gpudask_server_setup" else "").replace(", )", ")")
    env = base_env(GPUDASK_FACTS=TWO_GPUS, BAD_ROLE="worker", **_third_party_plugin(tmp_path, body))
    cluster.scheduler(env=base_env(GPUDASK_FACTS=TWO_GPUS, BAD_ROLE="none", **_third_party_plugin(tmp_path, body)))
    proc = cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)
    assert proc.wait(timeout=90) != 0  # never a worker that registers half-configured
    log = cluster.log("worker")
    line = f"gpudask plugin 'bad' (from badplug) failed in {hook}: RuntimeError: boom"
    # its last word: after it only distributed's lines (about shutting down, and at times the
    # other worker process's "Creating preload: gpudask" as it starts while the nanny closes,
    # or a WARNING that a worker's exit status was read twice), and at times the same one line
    # from the other worker process, which failed in the same hook a moment later or was
    # stopped by the nanny's SIGTERM while its hook ran (an INFO line saying so)
    errors = [x for x in log.splitlines() if x.startswith("Error:")]
    assert errors == [f"Error: gpudask: {line}"]
    after = log.splitlines()[log.splitlines().index(errors[0]) + 1:]
    assert not [x for x in after if "gpudask" in x and not x.endswith(line) and " INFO " not in x], log
    # gpudask's own INFO lines (its logger); distributed's INFO lines may name the preload
    assert not [x for x in after if " INFO " in x and " - distributed.gpudask - " in x
                and "stopped by SIG" not in x], log
    assert "Traceback" not in log and "Failed to start preload" not in log
    with cluster.client() as client:
        assert client.scheduler_info()["workers"] == {}


@pytest.mark.process
def test_a_plugin_failing_in_the_scheduler_stops_it_with_one_line(tmp_path):
    env = base_env(BAD_ROLE="scheduler", **_third_party_plugin(tmp_path, RAISING_PRELOAD))
    out = subprocess.run([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                          "--no-dashboard", "--preload", "gpudask"], env=env, capture_output=True, text=True,
                         timeout=60, cwd=str(tmp_path))
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line or "Traceback" in line]
    assert len(errors) == 1 and errors[0].endswith("gpudask: gpudask plugin 'bad' (from badplug) failed in "
                                                   "gpudask_server_setup: RuntimeError: boom")


@pytest.mark.process
def test_a_preload_that_changes_the_gpu_after_gpudask_is_reported_as_not_applied(cluster, tmp_path):
    (tmp_path / "repin.py").write_text("import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '7'\n")
    env = base_env(GPUDASK_FACTS=TWO_GPUS, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path),
                                                                                   os.environ.get("PYTHONPATH")])))
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--preload", "repin", "--nworkers", "2", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        workers = client.scheduler_info(n_workers=-1)["workers"]
    for w in workers.values():
        (m,) = w["gpudask"]["mismatches"]
        assert (m["key"], m["actual"], m["plugin"]) == ("CUDA_VISIBLE_DEVICES", "7", "gpu-pinning")
        assert m["planned"] == w["gpudask"]["plan"]["cuda_visible_devices"]
        assert w["gpudask"]["applied"]["env"]["CUDA_VISIBLE_DEVICES"] == "7"  # read from the live process


SCALE = """
import json, os, time
import gpudask
from distributed import Client, LocalCluster

def cvd():
    return os.environ.get("CUDA_VISIBLE_DEVICES")

if __name__ == "__main__":
    with LocalCluster(dashboard_address=None, **gpudask.cluster_kwargs()) as cluster, Client(cluster) as client:
        out = [sorted(client.run(cvd).values())]
        for n in (1, 2):
            cluster.scale(n)
            client.wait_for_workers(n, timeout=60)
            while len(client.scheduler_info()["workers"]) != n:
                client.wait_for_workers(n, timeout=60)
            out.append(sorted(client.run(cvd).values()))
        client.restart()
        out.append(sorted(client.run(cvd).values()))
        # let the cluster's own copy of the workers catch up with the restart before closing:
        # distributed's SpecCluster raises KeyError at close when a worker's "remove" reaches it
        # for an address it never listed (a race under load, dask/distributed#5407)
        for _ in range(100):
            if set(cluster.scheduler_info["workers"]) == set(client.scheduler_info()["workers"]):
                break
            time.sleep(0.1)
        print("RESULT " + json.dumps(out), flush=True)
"""

# the script's result is printed before the cluster closes: when the close still loses that race
# (distributed's KeyError, seen once on a loaded CI machine after the wait above), the result stands
# and the close's error is told apart from gpudask's
CLOSE_RACE = "in _update_worker_status"


@pytest.mark.process
def test_scale_down_and_up_and_restart_keep_one_worker_per_gpu(tmp_path):
    (tmp_path / "scale.py").write_text(SCALE)
    out = subprocess.run([sys.executable, "scale.py"], capture_output=True, text=True, timeout=240,
                         env=base_env(GPUDASK_FACTS=TWO_GPUS), cwd=str(tmp_path))
    raced = out.returncode != 0 and "RESULT " in out.stdout and CLOSE_RACE in out.stderr \
        and out.stderr.rstrip().splitlines()[-1].startswith("KeyError: ")
    assert out.returncode == 0 or raced, out.stderr[-3000:]
    start, one, two, restarted = json.loads(out.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert start == two == restarted == ["0,1", "1,0"]
    assert one[0] in ("0,1", "1,0")
    assert "beyond" not in out.stderr and "share" not in out.stderr


EXPLICIT_CONFIG = """
import asyncio, json
import dask.config
from distributed import Scheduler

async def main():
    with dask.config.set({"distributed.worker.memory.target": 0.8}):
        async with Scheduler(preload=["gpudask"], dashboard_address=":0", port=0) as s:
            return dask.config.get("distributed.worker.memory.target")

print("RESULT " + json.dumps(asyncio.run(main())))
"""


@pytest.mark.process
def test_explicit_dask_config_wins_over_gpudask_reading_the_environment(tmp_path):
    (tmp_path / "explicit.py").write_text(EXPLICIT_CONFIG)
    out = subprocess.run([sys.executable, "explicit.py"], capture_output=True, text=True, timeout=120,
                         env=base_env(DASK_DISTRIBUTED__WORKER__MEMORY__TARGET="0.5"), cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.split("RESULT ", 1)[1]) == 0.8


QUIET = """
import json, os
from distributed import Client, LocalCluster

def env():
    return sorted(k for k in os.environ if k.startswith("GPUDASK_"))

if __name__ == "__main__":
    with LocalCluster(n_workers=1, dashboard_address=None) as cluster, Client(cluster) as client:
        print("RESULT " + json.dumps([client.run(env), client.run(lambda: __import__("gpudask") and 1)]))
"""


@pytest.mark.process
def test_on_a_cpu_host_gpudask_preloaded_everywhere_says_nothing_and_sets_nothing(tmp_path):
    (tmp_path / "quiet.py").write_text(QUIET)
    preload = '["gpudask"]'
    env = base_env(GPUDASK_FACTS=host("no-gpu.json"), DASK_DISTRIBUTED__SCHEDULER__PRELOAD=preload,
                   DASK_DISTRIBUTED__WORKER__PRELOAD=preload, DASK_DISTRIBUTED__NANNY__PRELOAD=preload)
    out = subprocess.run([sys.executable, "quiet.py"], capture_output=True, text=True, timeout=120, env=env,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    variables, imported = json.loads(out.stdout.split("RESULT ", 1)[1])
    assert list(imported.values()) == [1]
    # the test's own GPUDASK_FACTS (and the session's autoload switch) are the only ones:
    # gpudask exported nothing of its own
    assert list(variables.values()) == [["GPUDASK_DISABLE_PLUGIN_AUTOLOAD", "GPUDASK_FACTS"]]
    assert "gpudask" not in out.stderr


def test_slot_folders_and_plan_files_of_dead_processes_are_reclaimed(tmp_path):
    from gpudask.apply.hostfile import reclaim_stale

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f"pid-{dead}").mkdir()
    (tmp_path / f"pid-{dead}" / "slot-0.lock").write_text("")
    (tmp_path / f"plan-{dead}.json").write_text("{}")
    (tmp_path / f"pid-{os.getpid()}").mkdir()
    removed = reclaim_stale(tmp_path)
    assert sorted(removed) == sorted([f"pid-{dead}", f"plan-{dead}.json"])
    assert [p.name for p in tmp_path.iterdir()] == [f"pid-{os.getpid()}"]


@pytest.mark.process
def test_dask_worker_says_when_gpus_stay_idle(cluster):
    cluster.scheduler()
    cluster.worker("--preload", "gpudask", env=base_env(GPUDASK_FACTS=host("hgx-4gpu-2ib.json")))
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
    assert ("dask worker starts 1 worker(s) on a host with 4 visible GPU(s): 3 GPU(s) stay idle; pass --nworkers 4 "
            "for one worker per GPU") in cluster.log("worker")


METADATA = """
import json
from distributed import Client, LocalCluster
import gpudask

if __name__ == "__main__":
    with LocalCluster(n_workers=1, dashboard_address=None) as cluster, Client(cluster) as client:
        client.register_plugin(gpudask.SchedulerPlugin())
        before = client.get_metadata(["gpudask", "scheduler"], default=None)
        client.restart()
        after = client.get_metadata(["gpudask", "scheduler"], default=None)
    print("RESULT " + json.dumps([before is not None, after == before]))
"""


@pytest.mark.process
def test_scheduler_metadata_survives_client_restart(tmp_path):
    (tmp_path / "meta.py").write_text(METADATA)
    out = subprocess.run([sys.executable, "meta.py"], capture_output=True, text=True, timeout=120, env=base_env(),
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.split("RESULT ", 1)[1]) == [True, True]


@pytest.mark.process
def test_gpudask_transport_interface_applies_to_dask_scheduler_too(tmp_path):
    """Documented for scheduler, nanny and workers; it was applied to workers only."""
    sf = tmp_path / "s.json"
    env = base_env(DASK_GPUDASK__TRANSPORT__INTERFACE="lo")
    proc = subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--port", "0", "--no-dashboard",
                             "--scheduler-file", str(sf), "--preload", "gpudask"], env=env, cwd=str(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = __import__("time").time() + 60
        while not sf.exists() and __import__("time").time() < deadline:
            __import__("time").sleep(0.1)
        address = json.loads(sf.read_text())["address"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert address.startswith("tcp://127.0.0.1:"), address  # lo, not the machine's own address


READ_BACK = """
    from gpudask.pluginapi import hookimpl

    name = "readback"
    priority = 500

    @hookimpl
    def gpudask_applied_state(ctx, plan):
        if plan.role == "worker":
            return {"threads": {"planned": 4, "actual": 2}, "fine": {"planned": 1, "actual": 1}}
    """


@pytest.mark.process
def test_a_plugins_read_back_becomes_a_not_applied_finding_and_a_status_row(cluster, tmp_path):
    env = base_env(GPUDASK_FACTS=TWO_GPUS, **_third_party_plugin(tmp_path, READ_BACK, name="readback"))
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        (w,) = client.scheduler_info(n_workers=-1)["workers"].values()
    (m,) = w["gpudask"]["mismatches"]
    assert (m["key"], m["planned"], m["actual"], m["plugin"]) == ("threads", 4, 2, "readback")
    assert any(f["code"] == "not-applied" and f["severity"] == "error" and "threads is 2, planned 4" in f["message"]
               for f in w["gpudask-check"]["findings"])
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "status", "--scheduler-file", cluster.scheduler_file],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1 and "1 mismatch(es)" in out.stdout
    assert "threads is 2, planned 4 (plugin readback)" in out.stdout


@pytest.mark.process
def test_a_scheduler_listening_on_several_protocols_starts_with_gpudask(tmp_path):
    """distributed's test_dask_scheduler.py::test_multiple_protocols, preloaded."""
    sf = tmp_path / "s.json"
    proc = subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--protocol=tcp,ws", "--port=0,0",
                             "--no-dashboard", "--scheduler-file", str(sf), "--preload", "gpudask"], env=base_env(),
                            cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = __import__("time").time() + 60
        while not sf.exists() and proc.poll() is None and __import__("time").time() < deadline:
            __import__("time").sleep(0.1)
        assert sf.exists(), proc.stderr.read() if proc.poll() is not None else "no scheduler file"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.process
@pytest.mark.ucx_client
def test_a_worker_started_before_the_scheduler_file_exists_plans_for_the_schedulers_protocol(cluster):
    """The usual job script starts `dask scheduler --scheduler-file F` and `dask worker
    --scheduler-file F` together: distributed waits for F and takes the scheduler's protocol,
    and so must the plan (it planned tcp for a ucx scheduler when F came late)."""
    import time

    cli = cluster.worker("--preload", "gpudask", "--nworkers", "2", "--nthreads", "1",
                         env=base_env(GPUDASK_FACTS=TWO_GPUS, UCX_TLS="tcp"))
    deadline = time.time() + 60
    while "Import preload module: gpudask" not in cluster.log("worker"):
        assert cli.poll() is None and time.time() < deadline, cluster.log("worker")
        time.sleep(0.1)
    assert not os.path.exists(cluster.scheduler_file)  # gpudask is imported before the file exists
    cluster.scheduler(protocol="ucx", env=base_env(UCX_TLS="tcp"))
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=90)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        live = client.run(lambda: os.environ.get("UCX_WARN_UNUSED_ENV_VARS"))
    assert all(address.startswith("ucx://") for address in workers)
    assert all(w["gpudask"]["plan"]["ucx_transports"] for w in workers.values())  # planned for UCX
    assert set(live.values()) == {"n"}  # and applied: gpudask's UCX-only setting is in each worker
    assert "(nanny, protocol ucx, planned while the scheduler started)" in cluster.log("worker")

"""Plugins and inputs that used to hang a process (issue 24, Hangs)."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request

import pytest
from conftest import base_env, host, third_party_plugin

TWO_GPUS = host("workstation-2gpu-pcie.json")


SLEEPY_CHECK = """
    import time
    from gpudask.pluginapi import hookimpl

    name = "sleepy"
    priority = 500

    @hookimpl
    def gpudask_scheduler_check(ctx, reference, subject):
        time.sleep(30)
        return []
    """


def _until(predicate, what: str, limit: float = 30.0):
    """Poll ``predicate`` until it returns something true (a bound on a wait, not a timing claim)."""
    deadline = time.monotonic() + limit
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.2)


@pytest.mark.process
def test_a_slow_scheduler_check_plugin_does_not_freeze_the_scheduler(cluster, tmp_path):
    env = base_env(GPUDASK_FACTS=TWO_GPUS, DASK_GPUDASK__SCHEDULER_CHECK__TIMEOUT="1",
                   **third_party_plugin(tmp_path, SLEEPY_CHECK, "sleepy"))
    cluster.scheduler("--preload", "gpudask", "--dashboard", "--dashboard-address", "127.0.0.1:0", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)
    with cluster.client() as client:
        # both workers register although each one's check sleeps 30 s in the scheduler
        client.wait_for_workers(2, timeout=20)
        port = client.scheduler_info()["services"]["dashboard"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            assert r.read() == b"ok"  # the event loop answers while the checks sleep
        assert client.run_on_scheduler(lambda: 42) == 42

        def timeouts():
            workers = client.scheduler_info(n_workers=-1)["workers"]
            found = [f for w in workers.values() for f in (w.get("gpudask-check") or {}).get("findings", [])
                     if f["code"] == "check-timeout"]
            return found if len(found) == 2 else None

        found = _until(timeouts, "a check-timeout finding for each worker")
        report = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["gpudask-check"].report())
    for f in found:
        assert f["severity"] == "warning" and f["plugin"] == "sleepy"
        assert "plugin 'sleepy'" in f["message"] and "gpudask_scheduler_check" in f["message"]
        assert "did not finish within 1 s (gpudask.scheduler-check.timeout)" in f["message"]
    assert report["status"] == "warning"
    log = cluster.log("scheduler")
    assert "Event loop was unresponsive" not in log, log
    assert "plugin 'sleepy'" in log


# -- facts files that never end ------------------------------------------------------
def test_a_facts_fifo_is_refused_without_blocking(tmp_path):
    from gpudask.errors import FactsError
    from gpudask.facts import load_facts

    fifo = tmp_path / "facts.fifo"
    os.mkfifo(fifo)
    with pytest.raises(FactsError) as e:
        load_facts(fifo)  # before: open() blocked forever waiting for a writer
    assert str(e.value) == f"{fifo}: not a regular file (a FIFO); a facts file must be a regular JSON file"


def test_dev_zero_as_facts_is_refused_without_reading_it(tmp_path):
    from gpudask.errors import FactsError
    from gpudask.facts import load_facts

    with pytest.raises(FactsError) as e:
        load_facts("/dev/zero")  # before: read 2.7 GB, then MemoryError
    assert str(e.value) == "/dev/zero: not a regular file (a character device); a facts file must be a regular " \
                           "JSON file"


def test_a_facts_file_over_the_size_limit_is_refused(tmp_path):
    from gpudask.errors import FactsError
    from gpudask.facts import loader

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(loader.MAX_FACTS_BYTES + 1)  # sparse: nothing written, nothing read
    with pytest.raises(FactsError) as e:
        loader.load_facts(big)
    assert str(e.value) == (f"{big}: {loader.MAX_FACTS_BYTES + 1} bytes, more than a facts file may hold "
                            "(16 MiB); a facts file describes one host in a few kilobytes")


@pytest.mark.process
@pytest.mark.parametrize("how", ["--facts", "GPUDASK_FACTS"])
@pytest.mark.parametrize("what", ["fifo", "/dev/zero"])
def test_gpudask_info_with_a_facts_fifo_or_device_says_one_line(tmp_path, how, what):
    import subprocess
    import sys

    path = str(tmp_path / "facts.fifo") if what == "fifo" else what
    if what == "fifo":
        os.mkfifo(path)
    argv = [sys.executable, "-m", "gpudask.cli", "info"] + (["--facts", path] if how == "--facts" else [])
    env = base_env(**({"GPUDASK_FACTS": path} if how == "GPUDASK_FACTS" else {}))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=str(tmp_path))
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a regular file" in lines[0] and path in lines[0], out.stderr
    assert "Traceback" not in out.stderr and "MemoryError" not in out.stderr
    json.dumps(lines)  # plain text


# -- a plugin sleeping in gpudask_plan_process ----------------------------------------
def test_a_slow_plan_hook_is_warned_naming_plugin_hook_and_seconds(monkeypatch):
    import types

    from gpudask import hookimpl
    from gpudask.plan import planner
    from gpudask.bootstrap import plan_host

    calls = []

    def plan_process(ctx, plan):
        calls.append((plan.role, plan.index))
        if plan.role == "worker" and plan.index == 0:
            time.sleep(0.06)

    slow = types.SimpleNamespace(name="slowplan", priority=500, gpudask_plan_process=hookimpl(plan_process))
    monkeypatch.setattr(planner, "SLOW_PLAN_HOOK_S", 0.05)
    host_plan = plan_host("tcp", 2, facts_path=TWO_GPUS, extra_plugins=[slow])
    # one call per process of the host: scheduler, nanny, client and the two workers
    assert sorted(calls, key=str) == sorted([("scheduler", None), ("nanny", None), ("client", None),
                                             ("worker", 0), ("worker", 1)], key=str)
    (warning,) = [w for w in host_plan.warnings if "slowplan" in w]
    assert warning.startswith("plugin 'slowplan' took 0.")
    assert " s in gpudask_plan_process (5 call(s), the longest 0." in warning and "cannot be stopped" in warning
    assert not [w for w in host_plan.warnings if "took" in w and "slowplan" not in w]  # the fast ones: no word


SLOW_PLAN = """
    import os, time
    from gpudask.pluginapi import hookimpl

    name = "slowplan"
    priority = 500

    @hookimpl
    def gpudask_plan_process(ctx, plan):
        with open(os.environ["SLOWPLAN_LOG"], "a") as f:
            f.write(f"{os.getpid()} {plan.role} {plan.index}\\n")
        if plan.role == "worker" and plan.index == 0:
            time.sleep(1.2)
    """


@pytest.mark.process
def test_dask_worker_calls_a_slow_plan_hook_once_per_process_and_says_so(cluster, tmp_path):
    calls = tmp_path / "calls.log"
    env = base_env(GPUDASK_FACTS=TWO_GPUS, SLOWPLAN_LOG=str(calls),
                   **third_party_plugin(tmp_path, SLOW_PLAN, "slowplan"))
    cluster.scheduler(env=base_env())  # a scheduler without gpudask: only the dask worker plans
    proc = cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
    lines = [line.split() for line in calls.read_text().splitlines()]
    # the dask worker process (nanny host) plans the host once: 5 calls for 2 workers; the
    # worker processes take their plan from it and call no plan hook
    assert {pid for pid, _, _ in lines} == {str(proc.pid)}
    assert sorted((role, index) for _, role, index in lines) == [
        ("client", "None"), ("nanny", "None"), ("scheduler", "None"), ("worker", "0"), ("worker", "1")]
    log = cluster.log("worker")
    warnings = [line for line in log.splitlines() if "plugin 'slowplan' took" in line]
    assert warnings, log  # said by the nanny host (and repeated by each worker with the host's warnings)
    assert re.search(r"took \d+\.\d s in gpudask_plan_process \(5 call\(s\), the longest \d+\.\d s\)", warnings[0])
    assert " WARNING " in warnings[0]


def test_idle_check_threads_end_and_a_later_check_starts_one_again(monkeypatch):
    """distributed's own tests fail on a thread left behind by a closed scheduler: the check
    threads end once idle, and the next check still runs."""
    import threading
    import time

    from gpudask.checks import jobs

    monkeypatch.setattr(jobs, "IDLE_S", 0.05)
    pool = jobs.Threads(2)
    assert [f.result(timeout=5) for f in [pool.submit(lambda i=i: i * 2) for i in range(5)]] == [0, 2, 4, 6, 8]
    deadline = time.monotonic() + 5
    while pool.threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.threads == []
    assert not [t for t in threading.enumerate() if t.name.startswith("gpudask-check-") and t.is_alive()
                and t not in jobs.POOL.threads]
    assert pool.submit(lambda: "again").result(timeout=5) == "again"

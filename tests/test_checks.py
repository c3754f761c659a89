"""The scheduler check: the runner (SchedulerPlugin), the scheduler-parity plugin, the client side.

Hook-level tests run in-process; cluster tests run real `dask scheduler` / `dask worker`
processes with a different GPUDASK_FACTS per process (GPU-less schedulers, workers and
clients next to described H200s, other drivers and packages), over TCP and over UCX with
UCX_TLS=tcp.
"""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from conftest import base_env, host, sections_with

import gpudask
from gpudask import hookimpl
from gpudask.checks import Finding, SchedulerCheck, evaluate_worker, local_side, run_hooks, side_from_published


# ----------------------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def _restore_global_state():
    """plan_host registers every plugin's defaults in the global dask config: undo it."""
    import copy

    import dask.config

    import logging

    config, defaults = copy.deepcopy(dask.config.config), list(dask.config.defaults)
    log = logging.getLogger("gpudask")
    handlers, propagate, level = list(log.handlers), log.propagate, log.level
    yield
    dask.config.config.clear()
    dask.config.config.update(config)
    dask.config.defaults[:] = defaults
    log.handlers[:], log.propagate = handlers, propagate  # an in-process scheduler sets up gpudask's log
    log.setLevel(level)


def facts_file(tmp_path: pathlib.Path, base: str, label: str, packages: dict | None = None, **changes) -> str:
    """A described host derived from tests/hosts/<base>."""
    data = json.loads(pathlib.Path(host(base)).read_text())
    data.update(changes)
    data["packages"] = {**data["packages"], **(packages or {})}
    path = tmp_path / f"{label}.json"
    path.write_text(json.dumps(data))
    return str(path)


def no_gpu_ucx(tmp_path) -> str:
    """A GPU-less scheduler host that can still run ucx:// (distributed-ucxx installed)."""
    return facts_file(tmp_path, "no-gpu.json", "no-gpu-ucx", {"ucxx": "0.52.0", "distributed-ucxx": "0.52.0"},
                      sections=sections_with("no-gpu.json", ucx_info={"transports": ["self", "tcp"]}))


def side(role: str, facts_path: str, protocol: str = "tcp", address: str | None = None) -> dict:
    published = {"facts": json.loads(pathlib.Path(facts_path).read_text()), "protocol": protocol, "version": "0.1.0"}
    return side_from_published(published, role, address)


def codes(findings) -> set[str]:
    return {f.code if isinstance(f, Finding) else f["code"] for f in findings}


def by_code(findings, code: str) -> list:
    return [f for f in findings if (f.code if isinstance(f, Finding) else f["code"]) == code]


def planned(protocol: str = "tcp", extra=()):
    from gpudask.apply.process import plan_host

    host_plan = plan_host(protocol, facts_path=host("h200-single.json"), extra_plugins=extra)
    return host_plan.ctx.manager, host_plan.ctx


def wait_for(predicate, timeout: float = 90, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def gpudask_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudask.cli", *args], capture_output=True, text=True, timeout=120,
                          env=env or base_env())


class CudfOnScheduler:
    """A third-party check, as a plugin object (in-process)."""

    name = "cudf-on-scheduler"
    priority = 900

    @hookimpl
    def gpudask_scheduler_check(self, reference, subject):
        if not subject:
            return []
        ours = reference["facts"]["packages"].get("cudf")
        theirs = subject["facts"]["packages"].get("cudf")
        if theirs and not ours:
            return [Finding("warning", "cudf-missing",
                            f"cudf on the {subject['role']} ({theirs}) but not on the {reference['role']}")]
        return []


# ---------------------------------------------------------------------- in-process: data
def test_finding_checks_its_severity_and_round_trips():
    f = Finding("error", "x", "boom", details={"a": [1, 2]})
    assert Finding.from_dict(f.to_dict()) == f
    with pytest.raises(ValueError, match="severity"):
        Finding("fatal", "x", "boom")
    # untrusted dicts are read defensively
    assert Finding.from_dict({"severity": "nonsense", "message": 3}).severity == "warning"


def test_gpudask_check_is_the_client_function_and_the_runner_pickles():
    import gpudask.checks

    assert gpudask.check is gpudask.checks.check and callable(gpudask.check)
    plugin = SchedulerCheck(action="refuse")
    import pickle

    again = pickle.loads(pickle.dumps(plugin))
    assert again.action_override == "refuse" and again.scheduler is None
    with pytest.raises(gpudask.GpudaskError, match="warn | error | refuse"):
        SchedulerCheck(action="explode")


def test_the_action_setting_is_validated():
    import dask.config

    from gpudask.config import CORE_OPTIONS, Settings
    from gpudask.errors import ConfigError

    name = "DASK_GPUDASK__SCHEDULER_CHECK__ACTION"
    for value, expected in (("refuse", "refuse"), ("kill", None)):
        environ = {name: value}
        settings = Settings(CORE_OPTIONS, config=dask.config.collect_env(environ), environ=environ)
        if expected:
            setting = settings.get("gpudask.scheduler-check.action")
            assert setting.value == expected and setting.source == f"${name}"
        else:
            with pytest.raises(ConfigError, match="gpudask.scheduler-check.action = 'kill' .* warn | error | refuse"):
                settings.get("gpudask.scheduler-check.action")
    assert Settings(CORE_OPTIONS, config={}, environ={})["gpudask.scheduler-check.action"] == "warn"


# ------------------------------------------------------------------ in-process: parity
GPU_ONLY = ("cupy", "rmm", "cudf", "dask-cudf", "numba")


@pytest.mark.parametrize("protocol", ["tcp", "ucx"])
def test_gpu_less_scheduler_is_a_supported_shape(tmp_path, protocol):
    """No GPU and no GPU libraries on the scheduler: an info finding, not a problem (the
    gpu-graph-data plugin reads graphs there without making their GPU objects)."""
    manager, ctx = planned()
    findings = run_hooks(manager, ctx, side("scheduler", no_gpu_ucx(tmp_path), protocol),
                         side("worker", host("h200-single.json"), protocol), "tcp://w:1", "scheduler")
    assert all(f.severity == "info" for f in findings), [f.line() for f in findings]
    (f,) = by_code(findings, "scheduler-no-gpu")
    assert f.plugin == "scheduler-parity" and f.subject == "tcp://w:1"
    assert f.message.startswith("the scheduler has no GPU visible while the worker has 1 GPU(s) (NVIDIA H200): "
                                "a supported shape")
    assert "no cupy and no CUDA context" in f.message
    if protocol == "ucx":  # what the relay does, and what clients do for scatters
        assert "relays the GPU results a client gathers through it as host bytes" in f.message
        assert "plain clients scatter with direct=True" in f.message
    else:
        assert "relays" not in f.message
    # cupy, rmm and numba are on the worker only: the scheduler does without them
    assert by_code(findings, "package-missing") == []


def test_the_scheduler_does_without_gpu_libraries_only(tmp_path):
    """GPU libraries missing on the scheduler are fine; ucxx (for ucx://) is not, and a worker
    missing a GPU library still is a finding."""
    manager, ctx = planned("ucx")
    h200 = host("h200-single.json")
    findings = run_hooks(manager, ctx, side("scheduler", host("no-gpu.json"), "ucx"), side("worker", h200, "ucx"),
                         "ucx://w:1", "scheduler")
    missing = {f.details["package"]: f for f in by_code(findings, "package-missing")}
    assert set(missing) == {"ucxx", "distributed-ucxx"} and not set(missing) & set(GPU_ONLY)
    assert missing["ucxx"].severity == "warning"
    assert missing["ucxx"].message == ("ucxx is installed on the worker (0.52.0) but not on the scheduler: the ucx:// "
                                       "protocol is not available there")
    no_cupy = facts_file(tmp_path, "h200-single.json", "no-cupy", {"cupy": None})
    findings = run_hooks(manager, ctx, side("scheduler", h200, "ucx"), side("worker", no_cupy, "ucx"),
                         "ucx://w:1", "scheduler")
    (cupy,) = by_code(findings, "package-missing")
    assert cupy.severity == "warning" and cupy.details == {"package": "cupy", "scheduler": "14.2.0", "worker": None}
    assert cupy.message.startswith("cupy is installed on the scheduler (14.2.0) but not on the worker")


def test_driver_cuda_and_packages_mismatch_name_both_sides(tmp_path):
    old = facts_file(tmp_path, "h200-single.json", "old-driver", {"rmm": None, "numba": "0.60.0"},
                     driver_version="550.54.15", cuda_driver_version=12040)
    no_cupy = facts_file(tmp_path, "h200-single.json", "no-cupy", {"cupy": None})
    manager, ctx = planned("ucx")
    findings = run_hooks(manager, ctx, side("scheduler", old, "ucx"), side("worker", no_cupy, "ucx"),
                         "ucx://w:1", "scheduler")
    assert all(f.severity != "error" for f in findings)
    (driver,) = by_code(findings, "driver-mismatch")
    assert "the scheduler has 550.54.15, the worker has 580.159.04" in driver.message
    (cuda,) = by_code(findings, "cuda-mismatch")
    assert "the scheduler has CUDA 12.4, the worker has CUDA 13.0" in cuda.message
    (numba,) = by_code(findings, "package-mismatch")
    assert "numba differs: the scheduler has 0.60.0, the worker has 0.62.1" in numba.message
    # cupy missing on the worker is named; rmm missing on the scheduler is not (it does without)
    assert [f.details["package"] for f in by_code(findings, "package-missing")] == ["cupy"]


def test_matching_processes_have_no_findings():
    manager, ctx = planned("ucx")
    h200 = host("h200-single.json")
    assert run_hooks(manager, ctx, side("scheduler", h200, "ucx"), side("worker", h200, "ucx"), "w", "s") == []


def test_a_worker_without_a_gpu_and_the_client_are_named_by_role(tmp_path):
    manager, ctx = planned("ucx")
    h200, cpu = host("h200-single.json"), no_gpu_ucx(tmp_path)
    (f,) = by_code(run_hooks(manager, ctx, side("scheduler", h200, "ucx"), side("worker", cpu, "ucx"), "w", "s"),
                   "worker-no-gpu")
    assert f.severity == "warning" and "GPU tasks scheduled on this worker will fail" in f.message
    (f,) = by_code(run_hooks(manager, ctx, side("worker", h200, "ucx"), side("client", cpu, "ucx"), "client", "w"),
                   "client-no-gpu")
    assert f.severity == "error" and f.message.startswith("the client has no GPU visible while the worker has")


@pytest.mark.parametrize("junk", [
    "junk", 42, None, [1, 2], {"facts": "x"}, {"no": "facts"},
    {"facts": {"schema": 2, "gpus": "many"}},
    {"facts": {"schema": 2}},
    {"facts": json.loads(pathlib.Path(host("h200-single.json")).read_text()), "protocol": 7},
    {"facts": {1: 2}},
    {"facts": {"deep": [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}},
    {"facts": "x" * 100000},
    {"facts": b"bytes"},
    {"facts": float("nan")},
])
def test_malformed_worker_data_is_reported_never_raised(junk):
    manager, ctx = planned()
    s = side("scheduler", host("h200-single.json"))
    findings, worker_side = evaluate_worker(manager, ctx, s, "tcp://w:1", {"gpudask": junk})
    assert worker_side is None
    (f,) = findings
    assert f.code == "malformed-facts" and f.severity == "warning" and f.subject == "tcp://w:1"
    assert "malformed gpudask data" in f.message


def test_a_worker_without_gpudask_is_reported():
    manager, ctx = planned()
    for extra in ({}, {"other": 1}, "not even a dict"):
        (f,) = evaluate_worker(manager, ctx, side("scheduler", host("h200-single.json")), "tcp://w:1", extra)[0]
        assert f.code == "no-gpudask" and "--preload gpudask" in f.message


def test_third_party_plugin_adds_findings_through_the_hook(tmp_path):
    from gpudask.plugin.manager import PluginManager

    manager = PluginManager.from_environment(extra=[CudfOnScheduler()])
    assert "cudf-on-scheduler" in manager.names()
    with_cudf = facts_file(tmp_path, "h200-single.json", "cudf", {"cudf": "25.10.0"})
    findings = run_hooks(manager, None, side("scheduler", host("h200-single.json")), side("worker", with_cudf),
                         "tcp://w:1", "scheduler")
    (f,) = by_code(findings, "cudf-missing")
    assert f.plugin == "cudf-on-scheduler" and f.message == "cudf on the worker (25.10.0) but not on the scheduler"
    # the built-in check does not: the scheduler needs no cudf (gpu-graph-data)
    assert by_code(findings, "package-missing") == []
    # a worker without cudf next to a client with it: both plugins say it, each in its own words
    findings = run_hooks(manager, None, side("worker", host("h200-single.json")), side("client", with_cudf),
                         "client", "tcp://w:1")
    (f,) = by_code(findings, "cudf-missing")
    assert f.plugin == "cudf-on-scheduler" and f.message == "cudf on the client (25.10.0) but not on the worker"
    (builtin,) = by_code(findings, "package-missing")
    assert builtin.plugin == "scheduler-parity" and builtin.details["package"] == "cudf"


def test_a_failing_or_misbehaving_plugin_becomes_a_finding():
    from gpudask.plugin.manager import PluginManager

    class Broken:
        name, priority = "broken", 1

        @hookimpl
        def gpudask_scheduler_check(self, subject):
            raise RuntimeError("oops")

    class Sloppy:
        name, priority = "sloppy", 1

        @hookimpl
        def gpudask_scheduler_check(self):
            import types

            return [types.SimpleNamespace(plugin=None)]

    class Careless:
        name, priority = "careless", 1

        @hookimpl
        def gpudask_scheduler_check(self):
            return ["not a finding"]

    s = side("scheduler", host("h200-single.json"))
    for plugin, text in ((Broken(), "RuntimeError: oops"), (Sloppy(), "returned SimpleNamespace, not a gpudask"),
                         (Careless(), "returned str, not a gpudask")):
        manager = PluginManager()
        manager.register(plugin)
        (f,) = run_hooks(manager, None, s, s, "w", "scheduler")
        assert f.code == "plugin-failed" and text in f.message


def test_install_on_a_running_scheduler_starts_once_and_checks_connected_workers(monkeypatch):
    """What a plugin registered late does through the preload hook (in-process servers)."""
    import asyncio

    from distributed import Scheduler, Worker

    from gpudask.checks import PLUGIN_NAME, install

    monkeypatch.setenv("GPUDASK_FACTS", host("h200-single.json"))
    manager, ctx = planned()

    async def main():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address=":0") as scheduler:
            async with Worker(scheduler.address, host="127.0.0.1", nthreads=1):
                me = local_side(ctx.facts, "scheduler", scheduler.address, "tcp")
                plugin = install(scheduler, manager, ctx, me)
                assert install(scheduler, manager, ctx, me) is plugin and scheduler.plugins[PLUGIN_NAME] is plugin
                assert plugin.manager is manager and plugin.side is me  # no planning of its own
                for _ in range(300):
                    if plugin.results:
                        break
                    await asyncio.sleep(0.05)
                await plugin.start(scheduler)  # a second start (e.g. by gpudask.SchedulerPlugin) is a no-op
                (entry,) = plugin.results.values()
                assert codes(entry["findings"]) == {"no-gpudask"}
                events = [e for _, e in scheduler.get_events("gpudask")]
                assert [e["action"] for e in events] == ["scheduler-check"]
                report = plugin.handle_report()
                assert report["installed"] and report["status"] == "warning"

    asyncio.run(main())


@pytest.mark.process
@pytest.mark.parametrize("target, says", [
    (["banana"], "gpudask: error: 'banana' is not a scheduler address (missing port number in address 'banana'); "
                 "accepted: tcp://HOST:PORT, ucx://HOST:PORT, HOST:PORT, or --scheduler-file FILE"),
    (["tcp://127.0.0.1:1"], "gpudask: error: cannot reach the scheduler at tcp://127.0.0.1:1: nothing is listening "
                            "there (connection refused)"),
    (["--scheduler-file", "not-json.txt"], "gpudask: error: cannot read the scheduler's address from not-json.txt"),
])
def test_check_of_a_bad_address_fails_within_its_timeout_with_one_line(tmp_path, target, says):
    """Never the hang of a half-made Client at exit, nor its traceback."""
    (tmp_path / "not-json.txt").write_text("banana")
    timeout = 10
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "check", *target, "--timeout", str(timeout)],
                         capture_output=True, text=True, timeout=120, env=base_env(), cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith(says), line
    assert out.stdout == ""
    # a refused connection is retried for --timeout; the old failure then waited 2 x --timeout more
    assert elapsed < 2 * timeout, elapsed


# ------------------------------------------------------------------------- clusters
def scheduler_env(facts: str, **extra: str) -> dict:
    return base_env(GPUDASK_FACTS=facts, **extra)


@pytest.mark.process
def test_tcp_worker_without_a_gpu_warns_in_log_events_scheduler_info_and_check(cluster, tmp_path, monkeypatch):
    cluster.scheduler("--preload", "gpudask", env=scheduler_env(host("h200-single.json"),
                                                                DASK_GPUDASK__SCHEDULER_CHECK__ACTION="warn"))
    cluster.worker("--preload", "gpudask", env=scheduler_env(no_gpu_ucx(tmp_path)))
    monkeypatch.setenv("GPUDASK_FACTS", no_gpu_ucx(tmp_path))  # the client is GPU-less too
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=120)
        (address,) = client.scheduler_info()["workers"]
        events = wait_for(lambda: [e for _, e in client.get_events("gpudask") if e.get("worker") == address],
                          what="the scheduler-check event")
        assert events[0]["action"] == "scheduler-check" and events[0]["status"] == "warning"
        assert events[0]["policy"] == "warn" and "worker-no-gpu" in codes(events[0]["findings"])
        entry = client.scheduler_info()["workers"][address]["gpudask-check"]
        assert entry["status"] == "warning" and "worker-no-gpu" in codes(entry["findings"])
        assert client.submit(sum, [1, 2]).result() == 3  # warn only: the worker stays

        report = gpudask.check(client)
    assert report["installed"] and report["action"] == "warn" and report["status"] == "warning"
    assert report["workers"][address]["gpudask"] is True
    (f,) = [f for f in report["findings"] if f["code"] == "worker-no-gpu"]
    assert f["subject"] == address and f["reference"] == "scheduler" and f["severity"] == "warning"
    # the client is compared too: GPU-less next to a GPU scheduler
    (c,) = by_code(report["client"]["findings"], "client-no-gpu")
    assert c["subject"] == "client" and c["reference"] == "scheduler" and c["severity"] == "warning"
    log = cluster.log("scheduler")
    assert "gpudask.check - WARNING - gpudask check: warning: " + address in log
    assert "the worker has no GPU visible while the scheduler has 1 GPU(s) (NVIDIA H200)" in log

    out = gpudask_cli("check", "--scheduler-file", cluster.scheduler_file)
    assert out.returncode == 0, out.stdout + out.stderr  # warnings only
    assert "the worker has no GPU visible" in out.stdout
    assert "action warn" in out.stdout and address in out.stdout


@pytest.mark.process
@pytest.mark.ucx_client
def test_ucx_gpu_less_scheduler_is_supported_and_the_error_policy_tells_every_client_of_a_mismatch(
        cluster, tmp_path, monkeypatch):
    """A GPU-less UCX scheduler with ``action: error`` and a GPU worker that has another dask:
    the version mismatch is told to every client, the GPU-less scheduler only reported (info);
    the GPU-less client next to the GPU worker over UCX is the error."""
    monkeypatch.setenv("UCX_TLS", "tcp")
    env = dict(UCX_TLS="tcp", DASK_GPUDASK__SCHEDULER_CHECK__ACTION="error")
    cluster.scheduler("--preload", "gpudask", env=scheduler_env(no_gpu_ucx(tmp_path), **env), protocol="ucx")
    assert cluster.address.startswith("ucx://")
    other_dask = facts_file(tmp_path, "h200-single.json", "other-dask", {"dask": "2026.7.0"})
    client_facts = no_gpu_ucx(tmp_path)
    monkeypatch.setenv("GPUDASK_FACTS", client_facts)
    with cluster.client() as client:
        told = []
        client.subscribe_topic("gpudask", told.append)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cluster.worker("--preload", "gpudask", env=scheduler_env(other_dask, **env))
            client.wait_for_workers(1, timeout=120)
            wait_for(lambda: [w for w in caught if "gpudask scheduler check" in str(w.message)],
                     what="the client-side warning")
        # the scheduler's view, read again: a worker the nanny restarts (seen once, on a loaded CI
        # machine) is absent for a moment; its log says why when it never comes back
        try:
            wait_for(lambda: client.scheduler_info()["workers"], timeout=60, what="the worker in scheduler_info")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{cluster.log('worker')[-3000:]}") from None
        (address,) = client.scheduler_info()["workers"]
        assert address.startswith("ucx://")
        (warned,) = [str(w.message) for w in caught if "gpudask scheduler check" in str(w.message)]
        assert "dask differs: the scheduler has 2026.8.0, the worker has 2026.7.0" in warned
        assert "no GPU visible" not in warned  # the supported shape is no problem to tell
        wait_for(lambda: told, what="the subscribed gpudask event")
        assert told[0][1]["status"] == "warning" and told[0][1]["policy"] == "error"
        report = gpudask.check(client)
    worker = report["workers"][address]
    assert worker["status"] == "warning" and {"scheduler-no-gpu", "package-mismatch"} <= codes(worker["findings"])
    (f,) = by_code(worker["findings"], "scheduler-no-gpu")
    assert f["severity"] == "info" and "a supported shape" in f["message"]
    (c,) = by_code(report["client"]["findings"], "client-no-gpu")
    assert c["severity"] == "error" and c["reference"] == address
    assert report["status"] == "error" and report["action"] == "error"
    out = gpudask_cli("check", cluster.address, "--json", env=base_env(UCX_TLS="tcp", GPUDASK_FACTS=client_facts))
    assert out.returncode == 1, out.stdout + out.stderr  # an error finding
    cli = json.loads(out.stdout)
    assert cli["status"] == "error" and cli["workers"][address]["status"] == "warning"
    assert "client-no-gpu" in codes(cli["client"]["findings"])


@pytest.mark.process
@pytest.mark.ucx_client
def test_gpu_processes_without_cuda_ipc_are_staged_through_host_memory_and_the_check_says_so(cluster, monkeypatch):
    """UCX_TLS without cuda_ipc on a GPU host: the check was ok while every transfer between the worker,
    the scheduler and a client on that host went through host memory (850x slower at 1 GiB).  (tcp only
    here: a CPU machine cannot start UCX with cuda transports; the GPU run covers tcp,cuda_copy.)"""
    env = dict(UCX_TLS="tcp")
    gpu_host = host("h200-single.json")
    monkeypatch.setenv("UCX_TLS", "tcp")
    cluster.scheduler("--preload", "gpudask", env=scheduler_env(gpu_host, **env), protocol="ucx")
    cluster.worker("--preload", "gpudask", env=scheduler_env(gpu_host, **env))
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=120)
        (address,) = client.scheduler_info()["workers"]
        report = gpudask.check(client)
    staged = [f for f in report["findings"] if f["code"] == "staged-through-host"]
    assert {f["subject"] for f in staged} == {address}
    messages = " ".join(f["message"] for f in staged)
    assert "the worker: UCX_TLS=tcp leaves out cuda_ipc" in messages
    assert "the scheduler, on the same host: UCX_TLS=tcp leaves out cuda_ipc" in messages
    assert all(f["severity"] == "warning" and f["plugin"] == "nvlink" for f in staged)


@pytest.mark.process
def test_mismatched_driver_and_cupy_missing_on_a_worker(cluster, tmp_path, monkeypatch):
    sched = facts_file(tmp_path, "h200-single.json", "older", {"rmm": None},
                       driver_version="550.54.15", cuda_driver_version=12040)
    cluster.scheduler("--preload", "gpudask", env=scheduler_env(sched))
    no_cupy = facts_file(tmp_path, "h200-single.json", "no-cupy", {"cupy": None})
    cluster.worker("--preload", "gpudask", env=scheduler_env(no_cupy))
    monkeypatch.setenv("GPUDASK_FACTS", host("h200-single.json"))
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=120)
        report = gpudask.check(client)
    (address,) = report["workers"]
    worker = report["workers"][address]
    assert worker["status"] == "warning"
    assert {"driver-mismatch", "cuda-mismatch", "package-missing"} <= codes(worker["findings"])
    (driver,) = by_code(worker["findings"], "driver-mismatch")
    assert "the scheduler has 550.54.15, the worker has 580.159.04" in driver["message"]
    # cupy missing on the worker is named; rmm missing on the scheduler is not (it does without)
    (cupy,) = by_code(worker["findings"], "package-missing")
    assert cupy["details"] == {"package": "cupy", "scheduler": "14.2.0", "worker": None}
    assert not {"scheduler-no-gpu", "worker-no-gpu"} & codes(report["findings"])
    # the client (described as the worker's host) differs from the scheduler in the same way
    assert "driver-mismatch" in codes(by_code(report["client"]["findings"], "driver-mismatch"))
    assert report["status"] == "warning"


@pytest.mark.process
def test_refuse_closes_the_offending_worker_with_the_finding_as_reason(cluster, tmp_path):
    """A GPU-less scheduler refusing mismatches: the GPU worker stays (a supported shape, an
    info finding); the worker with another dask is refused."""
    cpu = no_gpu_ucx(tmp_path)
    other_dask = facts_file(tmp_path, "no-gpu-ucx.json", "other-dask", {"dask": "2026.7.0"})
    cluster.scheduler("--preload", "gpudask", env=scheduler_env(cpu, DASK_GPUDASK__SCHEDULER_CHECK__ACTION="refuse"))
    cluster.worker("--preload", "gpudask", "--name", "gpu", env=scheduler_env(host("h200-single.json")), label="gpu")
    bad = cluster.worker("--preload", "gpudask", "--name", "other-dask", env=scheduler_env(other_dask),
                         label="other-dask")
    with cluster.client() as client:
        # the mismatching worker's process ends by itself (its nanny is told not to restart it)
        bad.wait(timeout=120)
        client.wait_for_workers(1, timeout=120)
        names = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}
        assert list(names) == ["gpu"]
        report = gpudask.check(client)
        events = [e for _, e in client.get_events("gpudask") if e.get("action") == "refuse-worker"]
    assert report["action"] == "refuse"
    kept = report["workers"][names["gpu"]]
    assert kept["status"] == "info" and codes(kept["findings"]) == {"scheduler-no-gpu"}
    (address,) = report["refused"]
    assert codes(report["refused"][address]["findings"]) == {"package-mismatch"}
    assert len(events) == 1 and events[0]["worker"] == address
    assert "gpudask scheduler check refused this worker" in cluster.log("other-dask")
    assert "dask differs: the scheduler has 2026.8.0, the worker has 2026.7.0" in cluster.log("other-dask")
    assert "closing worker " + address in cluster.log("scheduler")


JUNK_PRELOAD = '''
def dask_setup(worker):
    worker.startup_information["gpudask"] = lambda w: {"version": 3, "protocol": ["tcp"],
                                                      "facts": {"schema": 2, "gpus": "lots", "packages": [1]}}
'''

def third_party_module() -> str:
    """The in-process check above, as the source of an importable module (the scheduler
    unpickles it by reference, so it must be importable there)."""
    return ("from gpudask import hookimpl\nfrom gpudask.findings import Finding\n\n\n"
            + textwrap.dedent(inspect.getsource(CudfOnScheduler)))


@pytest.mark.process
def test_registered_late_it_checks_connected_workers_and_survives_junk(cluster, tmp_path, monkeypatch):
    """No preload on the scheduler; a client registers the check after three workers joined:
    a gpudask worker (with cudf), a stock worker, and one whose preload publishes junk."""
    (tmp_path / "junk_preload.py").write_text(JUNK_PRELOAD)
    (tmp_path / "third_party_check.py").write_text(third_party_module())
    path_env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    cluster.scheduler(env=scheduler_env(no_gpu_ucx(tmp_path), **path_env))
    with_cudf = facts_file(tmp_path, "h200-single.json", "cudf", {"cudf": "25.10.0"})
    cluster.worker("--preload", "gpudask", "--name", "gpudask", env=scheduler_env(with_cudf), label="w-gpudask")
    cluster.worker("--name", "stock", env=base_env(), label="w-stock")
    cluster.worker("--preload", str(tmp_path / "junk_preload.py"), "--name", "junk", env=base_env(**path_env),
                   label="w-junk")
    monkeypatch.syspath_prepend(str(tmp_path))
    from third_party_check import CudfOnScheduler as Shipped

    with cluster.client() as client:
        client.wait_for_workers(3, timeout=120)
        before = gpudask.check(client)  # nothing installed: a one-off report, nothing enforced
        assert before["installed"] is False and len(before["workers"]) == 3
        assert client.get_events("gpudask") == ()

        client.register_plugin(SchedulerCheck(extra_plugins=[Shipped()]))
        def checks():
            found = [e for _, e in client.get_events("gpudask") if e.get("action") == "scheduler-check"]
            return found if len(found) >= 3 else None

        events = wait_for(checks, what="three checks")
        names = {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}
        report = gpudask.check(client)
        assert client.submit(sum, [1, 2]).result() == 3  # the scheduler is fine
        # registering again (idempotent) changes nothing
        client.register_plugin(SchedulerCheck())
        assert len(client.get_events("gpudask")) == len(events)
    assert report["installed"] and len(events) == 3
    by_name = {names[a]: w for a, w in report["workers"].items()}
    assert codes(by_name["stock"]["findings"]) == {"no-gpudask"} and by_name["stock"]["gpudask"] is False
    assert codes(by_name["junk"]["findings"]) == {"malformed-facts"}
    assert "key 'gpus' must be a list" in by_name["junk"]["findings"][0]["message"]
    gpu = by_name["gpudask"]["findings"]
    assert {"scheduler-no-gpu", "cudf-missing"} <= codes(gpu)
    # the built-in check does not miss cudf on the scheduler (it needs none); the third party does
    assert "package-missing" not in codes(gpu)
    assert {f["severity"] for f in by_code(gpu, "scheduler-no-gpu")} == {"info"}
    (third,) = by_code(gpu, "cudf-missing")
    assert third["plugin"] == "cudf-on-scheduler" and third["severity"] == "warning"
    assert "gpudask check: scheduler " in cluster.log("scheduler")

    # the client side runs third-party plugins too (this client has cudf, the scheduler not)
    monkeypatch.setenv("GPUDASK_FACTS", with_cudf)
    with cluster.client() as client:
        mine = gpudask.check(client, extra_plugins=[CudfOnScheduler()])["client"]["findings"]
    (f,) = by_code(mine, "cudf-missing")
    assert f["plugin"] == "cudf-on-scheduler" and f["subject"] == "client" and f["reference"] == "scheduler"
    assert f["message"] == "cudf on the client (25.10.0) but not on the scheduler"


# ------------------------------------------------------------------------------- GPU
@pytest.mark.process
@pytest.mark.gpu
@pytest.mark.ucx_client
def test_gpu_less_ucx_scheduler_works_and_the_check_says_it_is_supported(cluster):
    """On a GPU machine: the scheduler started with CUDA_VISIBLE_DEVICES="" over UCX, a GPU worker
    (both gpudask-preloaded), this process a plain client.  The seed example (a CuPy-backed
    dask.array persisted, a slice gathered through the scheduler), a sum, and a CuPy argument
    to submit give the right CuPy results; the check reports the shape as supported (info), no
    error, and the scheduler's log has no CUDA failure."""
    import operator

    import cupy
    import dask.array as da

    env = {k: v for k, v in base_env().items() if not k.startswith("UCX_") or k == "UCX_WARN_UNUSED_ENV_VARS"}
    cluster.scheduler("--preload", "gpudask", env=dict(env, CUDA_VISIBLE_DEVICES=""), protocol="ucx")
    cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(1, timeout=120)
        x = da.arange(1000, chunks=100, like=cupy.arange(10))
        z = (x * 2).persist()
        head = client.compute(z[:10]).result(timeout=60)  # gathered through the scheduler
        total = client.compute(x.sum()).result(timeout=60)
        tripled = client.submit(operator.mul, cupy.arange(5), 3).result(timeout=60)
        report = gpudask.check(client)
    log = cluster.log("scheduler")
    assert isinstance(head, cupy.ndarray) and head.get().tolist() == list(range(0, 20, 2)), log[-3000:]
    assert int(total) == 499500
    assert isinstance(tripled, cupy.ndarray) and tripled.get().tolist() == [0, 3, 6, 9, 12]
    assert [f for f in report["findings"] if f["severity"] == "error"] == [], report["findings"]
    ((address, worker),) = report["workers"].items()
    (f,) = by_code(worker["findings"], "scheduler-no-gpu")
    assert f["severity"] == "info" and "a supported shape" in f["message"] and f["subject"] == address
    assert "cudaErrorNoDevice" not in log and "Couldn't gather" not in log


@pytest.mark.process
def test_check_and_status_with_nothing_listening_answer_at_once_in_the_same_words():
    lines = {}
    for command in ("check", "status"):
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "gpudask.cli", command, "tcp://127.0.0.1:9"], capture_output=True,
                             text=True, timeout=120, env=base_env())
        assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
        assert time.monotonic() - started < 15  # not the 30 s of --timeout: a refusal is final
        (lines[command],) = out.stderr.splitlines()
    assert lines["check"] == lines["status"] == ("gpudask: error: cannot reach the scheduler at tcp://127.0.0.1:9: "
                                                 "nothing is listening there (connection refused)")

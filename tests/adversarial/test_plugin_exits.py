"""A plugin that calls ``sys.exit()`` or never returns, in any hook or in its module body
(issue 32): it never ends or freezes a scheduler, a worker or a command; it is a
plugin-failed finding, or one line naming the plugin and its hook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import base_env, host, third_party_plugin

TWO_GPUS = host("workstation-2gpu-pcie.json")

EXITER = """
    import os, sys, time
    from gpudask.pluginapi import hookimpl

    name = "exiter"
    priority = 500
    WHERE, ROLE = os.environ.get("EXIT_IN", ""), os.environ.get("EXIT_ROLE", "")

    def act(hook, role=None):
        if WHERE == hook and ROLE in ("", role):
            if os.environ.get("EXIT_HOW") == "hang":
                print(f"exiter: hanging in {hook}", file=sys.stderr, flush=True)  # the test waits for this line
                time.sleep(600)
            sys.exit(int(os.environ.get("EXIT_CODE", "0")))

    act("import")

    @hookimpl
    def gpudask_config_options():
        act("gpudask_config_options")
        return []

    @hookimpl
    def gpudask_plan_process(ctx, plan):
        act("gpudask_plan_process", plan.role)

    @hookimpl
    def gpudask_server_setup(ctx, plan, server):
        act("gpudask_server_setup", plan.role)

    @hookimpl
    def gpudask_applied_state(ctx, plan):
        act("gpudask_applied_state", plan.role)

    @hookimpl
    def gpudask_scheduler_check(ctx, reference, subject):
        act("gpudask_scheduler_check")
        return []

    @hookimpl
    def gpudask_report_rows(plan, published):
        act("gpudask_report_rows")
    """


def _env(tmp_path, **extra: str) -> dict[str, str]:
    return base_env(GPUDASK_FACTS=TWO_GPUS, **third_party_plugin(tmp_path, EXITER, "exiter"), **extra)


def _cli(tmp_path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudask.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=str(tmp_path), env=_env(tmp_path, **extra))


@pytest.mark.process
@pytest.mark.parametrize("command,where", [("info", "import"), ("info", "gpudask_config_options"),
                                           ("info", "gpudask_plan_process"), ("plugins", "import")])
def test_sys_exit_in_a_plugin_is_one_line_naming_it_in_every_command(tmp_path, where, command):
    out = _cli(tmp_path, command, EXIT_IN=where, EXIT_CODE="0" if where != "import" else "3")
    text = out.stdout + out.stderr
    # before: rc 3 (or 0) and no word at all
    assert out.returncode == (2 if command == "info" else 1), text  # `plugins` lists it as broken
    assert "Traceback" not in text, text
    (line,) = [x for x in text.splitlines() if "exiter" in x]
    assert f"plugin 'exiter' (from exiterplug) failed in {where}: SystemExit(" in line, line
    assert "a plugin may not end the process" in line, line
    if command == "info":
        assert out.stderr.strip() == line.strip() and not out.stdout, text


@pytest.mark.process
def test_sys_exit_in_the_scheduler_check_and_the_report_rows_leaves_the_scheduler_running(cluster, tmp_path):
    env = _env(tmp_path, EXIT_IN="gpudask_scheduler_check")
    cluster.scheduler("--preload", "gpudask", "--dashboard", "--dashboard-address", "127.0.0.1:0", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)  # before: "SystemExit: 0", the scheduler gone

        def findings():
            (w,) = client.scheduler_info(n_workers=-1)["workers"].values()
            return [f for f in (w.get("gpudask-check") or {}).get("findings", []) if f["code"] == "plugin-failed"]

        deadline = time.monotonic() + 30
        while not findings() and time.monotonic() < deadline:
            time.sleep(0.2)
        (finding,) = findings()
        assert finding["plugin"] == "exiter" and "SystemExit(0)" in finding["message"]
        port = client.scheduler_info()["services"]["dashboard"]
    assert cluster.procs[0].poll() is None


@pytest.mark.process
def test_sys_exit_in_report_rows_is_a_left_out_column_not_the_end_of_the_scheduler(cluster, tmp_path):
    env = _env(tmp_path, EXIT_IN="gpudask_report_rows")
    cluster.scheduler("--preload", "gpudask", "--dashboard", "--dashboard-address", "127.0.0.1:0", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        port = client.scheduler_info()["services"]["dashboard"]
        # before: one unauthenticated GET ended the scheduler
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/gpudask/json", timeout=30) as r:
            text = r.read().decode()
        assert "plugin exiter's report rows left out" in text and "SystemExit(0)" in text
        assert client.run_on_scheduler(lambda: 42) == 42
    assert cluster.procs[0].poll() is None


@pytest.mark.process
@pytest.mark.parametrize("role,hook", [("scheduler", "gpudask_server_setup"), ("worker", "gpudask_server_setup"),
                                       ("worker", "gpudask_applied_state"), ("worker", "import")])
def test_sys_exit_in_a_servers_setup_hook_stops_it_with_one_line(cluster, tmp_path, role, hook):
    env = _env(tmp_path, EXIT_IN=hook, EXIT_ROLE=role if hook != "import" else "")
    if role == "scheduler":
        proc = cluster.spawn("scheduler", ["dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                                           "--no-dashboard", "--preload", "gpudask"], env=env)
        log = "scheduler"
    else:
        cluster.scheduler(env=base_env())
        proc = cluster.worker("--preload", "gpudask", "--nworkers", "1", "--no-nanny", env=env)
        log = "worker"
    # before: "Task exception was never retrieved" and a server half set up
    assert proc.wait(timeout=60) != 0
    text = cluster.log(log)
    assert f"plugin 'exiter' (from exiterplug) failed in {hook}: SystemExit(0)" in text, text[-3000:]
    assert "Traceback" not in text and "never retrieved" not in text, text[-3000:]


@pytest.mark.process
def test_a_server_setup_hook_that_never_returns_is_bounded_and_sigterm_still_stops_it(cluster, tmp_path):
    env = _env(tmp_path, EXIT_IN="gpudask_server_setup", EXIT_ROLE="scheduler", EXIT_HOW="hang",
               DASK_GPUDASK__PLUGINS__HOOK_TIMEOUT="2")
    argv = ["dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--preload", "gpudask"]
    proc = cluster.spawn("bounded", argv, env=env)
    assert proc.wait(timeout=60) != 0  # before: a scheduler stuck for ever
    text = cluster.log("bounded")
    assert ("plugin 'exiter' (from exiterplug) failed in gpudask_server_setup: did not finish within 2 s "
            "(gpudask.plugins.hook-timeout)") in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    # a hang well inside the bound: SIGTERM ends it (before: ignored for 6 minutes)
    env["DASK_GPUDASK__PLUGINS__HOOK_TIMEOUT"] = "300"
    proc = cluster.spawn("stopped", argv, env=env)
    deadline = time.monotonic() + 60
    while "gpudask_server_setup" not in _stack_hint(cluster, proc) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) != 0
    text = cluster.log("stopped")
    assert "failed in gpudask_server_setup: stopped by SIGTERM after" in text, text[-3000:]


def _stack_hint(cluster, proc) -> str:
    """Whether the hook is running yet: the plugin says so on stderr as it starts hanging (a SIGTERM
    sent before that is distributed's own graceful close, which waits for the preload's setup)."""
    text = cluster.log("stopped")
    return "gpudask_server_setup" if "exiter: hanging in gpudask_server_setup" in text or proc.poll() is not None else ""

"""Wrong types and values from a plugin are refused where they are made (issue 32): one line
naming the plugin and its hook, never a traceback in ``gpudask info``, ``dask scheduler``
or the worker, and never a worker that cannot register."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import base_env, host, third_party_plugin

TWO_GPUS = host("workstation-2gpu-pcie.json")

WRONG = """
    import math, os
    from gpudask.pluginapi import hookimpl

    name = "wrong"
    priority = 500
    CASE = os.environ.get("WRONG", "")

    @hookimpl
    def gpudask_config_options():
        return 5 if CASE == "options" else []

    @hookimpl
    def gpudask_plan_process(ctx, plan):
        if plan.role != "worker":
            return
        if CASE == "env-name":
            plan.set_env("A=B", "x", "a name with '='")
        elif CASE == "env-nul":
            plan.set_env("GOOD", "x\\0y", "a value with NUL")
        elif CASE == "config-nan":
            plan.set_config("distributed.worker.memory.target", math.nan, "NaN")
        elif CASE == "section-huge":
            plan.set_section({"size": 10**400}, "huge")

    @hookimpl
    def gpudask_setup_memory(ctx, plan):
        if CASE == "memory-huge":
            return {"pool": 2**64}

    @hookimpl
    def gpudask_applied_state(ctx, plan):
        if CASE == "applied-huge" and plan.role == "worker":
            return {"pool": {"planned": 1, "actual": 10**400}}
    """

PLAN_CASES = {
    "options": ("gpudask_config_options", "returned a int (5); expected a list of gpudask.pluginapi.Option"),
    "env-name": ("gpudask_plan_process", "environment variable name 'A=B' refused; accepted: a non-empty string "
                 "without '=' or NUL"),
    "env-nul": ("gpudask_plan_process", "value of environment variable GOOD refused"),
    "config-nan": ("gpudask_plan_process", "dask config distributed.worker.memory.target: nan, which is not a JSON "
                   "number; accepted: None, booleans"),
    "section-huge": ("gpudask_plan_process", "plan section 'wrong': an integer out of range"),
}


def _env(tmp_path, case: str) -> dict[str, str]:
    return base_env(GPUDASK_FACTS=TWO_GPUS, WRONG=case, **third_party_plugin(tmp_path, WRONG, "wrong"))


@pytest.mark.process
@pytest.mark.parametrize("case", sorted(PLAN_CASES))
def test_gpudask_info_refuses_a_wrong_value_in_one_line_naming_the_plugin(tmp_path, case):
    hook, message = PLAN_CASES[case]
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info"], capture_output=True, text=True, timeout=60,
                         cwd=str(tmp_path), env=_env(tmp_path, case))
    # before: a traceback (options), or a plan that passed and a worker killed by os.environ
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"gpudask: error: gpudask plugin 'wrong' (from wrongplug) failed in {hook}: "), line
    assert message in line, line


@pytest.mark.process
@pytest.mark.parametrize("case,hook", [("memory-huge", "gpudask_setup_memory"),
                                       ("applied-huge", "gpudask_applied_state"),
                                       ("env-nul", "gpudask_plan_process")])
def test_a_worker_with_a_value_it_cannot_publish_stops_with_one_line(cluster, tmp_path, case, hook):
    env = _env(tmp_path, case)
    cluster.scheduler(env=base_env())
    proc = cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env)
    # before: "Failed to Serialize ... OverflowError" (190 lines) and a worker that never registers
    assert proc.wait(timeout=120) != 0
    log = cluster.log("worker")
    assert f"gpudask plugin 'wrong' (from wrongplug) failed in {hook}: " in log, log[-3000:]
    assert "Traceback" not in log and "OverflowError" not in log, log[-3000:]


@pytest.mark.process
def test_dask_scheduler_with_config_options_returning_5_exits_with_one_line(cluster, tmp_path):
    proc = cluster.spawn("scheduler", [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port",
                                       "0", "--no-dashboard", "--preload", "gpudask"], env=_env(tmp_path, "options"))
    assert proc.wait(timeout=60) != 0
    log = cluster.log("scheduler")
    lines = [x for x in log.splitlines() if x.strip() and " - INFO - " not in x]
    assert len(lines) == 1 and "failed in gpudask_config_options: returned a int (5)" in lines[0], log

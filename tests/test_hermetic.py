"""gpudask's own tests are hermetic: a third-party plugin installed beside gpudask (as
docs/plugin-authoring.md says to install one) leaves them green.

The test session turns autoload off (``tests/conftest.py``: ``GPUDASK_DISABLE_PLUGIN_AUTOLOAD=1``,
carried to the processes the tests start by :func:`gpudask.testing.processes.clean_env`); a test
that installs a plugin of its own loads it by name (``GPUDASK_LOAD_PLUGINS``)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import base_env, third_party_plugin

ROOT = pathlib.Path(__file__).parent.parent

# a plugin that changes every plan, every report and the settings
NOISY = '''
from gpudask.pluginapi import Option, hookimpl, parse_bool

name = "noisy"
priority = 5


@hookimpl
def gpudask_config_options():
    return [Option("gpudask.noisy.on", True, "noisy", parse_bool, "true or false")]


@hookimpl
def gpudask_plan_process(ctx, plan):
    plan.set_env("UCX_RNDV_THRESH", "8192", "noisy: always")
    plan.set_section({"loud": True}, "noisy: always")


@hookimpl
def gpudask_report_rows(plan, published):
    return [{"column": "noisy", "summary": "loud"}]
'''


def test_the_session_loads_no_installed_third_party_plugin_and_its_processes_neither():
    from gpudask.testing.processes import clean_env

    assert os.environ["GPUDASK_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert clean_env()["GPUDASK_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert "GPUDASK_HOST_PLAN" not in clean_env({"GPUDASK_HOST_PLAN": "x"})


@pytest.mark.process
def test_gpudask_own_tests_stay_green_with_a_third_party_plugin_installed(tmp_path):
    env = base_env(**third_party_plugin(tmp_path, NOISY, name="noisy"))
    for name in ("GPUDASK_LOAD_PLUGINS", "GPUDASK_DISABLE_PLUGIN_AUTOLOAD"):
        env.pop(name, None)  # installed as pip would install it, in a user's environment that autoloads
    listed = subprocess.run([sys.executable, "-m", "gpudask.cli", "plugins"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "noisy" in listed.stdout, listed.stdout + listed.stderr
    # the golden plans and the report tables: what a plugin in every plan would change first
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "not process and not gpu",
                          "tests/test_golden_plans.py", "tests/test_cli_output.py", "tests/test_plan_sections.py"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout

"""A gpudask command's stdout is its report: against a ``ucx://`` scheduler nothing of UCX's
(which logs to stdout from C unless told otherwise) or distributed's reaches it, so ``--json``
parses.  Real `dask scheduler` / `dask worker` processes over UCX on TCP; the commands run in
an environment without the tests' own ``UCX_WARN_UNUSED_ENV_VARS=n``, as a user's shell."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import base_env

pytest.importorskip("distributed_ucxx")

# UCX's log lines ("[1796221525.39] [host:9912:0] parser.c:2355 UCX WARN ...") and
# distributed's ("2026-12-02 14:20:01,123 - distributed.worker - INFO - ...")
LOG_LINE = re.compile(r"UCXX?\s+(WARN|ERROR|INFO|DIAG|DEBUG)|\bparser\.c:|- distributed\.\S+ - [A-Z]+ -")


def _user_env() -> dict[str, str]:
    """A user's shell: no UCX_* variable set (the tests' base_env quiets UCX; a user's does not)."""
    return {k: v for k, v in base_env().items() if not k.startswith("UCX_")}


def _gpudask(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudask.cli", *args], capture_output=True, text=True,
                          timeout=180, env=_user_env())


@pytest.mark.process
def test_check_probe_and_status_over_ucx_print_only_their_report_on_stdout(cluster):
    env = _user_env()
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    where = ("--scheduler-file", cluster.scheduler_file)
    # `gpudask status` answers once both workers are there: wait for them through it
    for _ in range(60):
        listed = _gpudask("status", *where, "--json")
        if listed.stdout.strip() and len(json.loads(listed.stdout)["workers"]) == 2:
            break
    else:
        pytest.fail(f"two workers never joined:\n{listed.stderr}\n{cluster.log('worker')}")

    # the loop's last `status --json` parsed whole: the other commands, in both forms
    for command in (("check",), ("status",), ("check", "--probe", "--payload", "1MiB")):
        if command != ("status",):
            as_json = _gpudask(*command, *where, "--json")
            assert as_json.returncode in (0, 1), as_json.stderr  # 1: a finding, still a report
            report = json.loads(as_json.stdout)  # the whole of stdout is the JSON document
            assert isinstance(report, dict) and report, command
        text = _gpudask(*command, *where)
        assert text.returncode in (0, 1), text.stderr
        assert text.stdout.strip(), command
        assert [line for line in text.stdout.splitlines() if LOG_LINE.search(line)] == [], command
        assert "ucx://" in text.stdout, (command, text.stdout)  # it did talk to the UCX scheduler


def test_ucx_is_sent_to_stderr_and_quiet_but_a_users_own_settings_win():
    from gpudask.cli.connect import ucx_output_to_stderr

    env: dict[str, str] = {}
    ucx_output_to_stderr(env)
    assert env == {"UCX_LOG_FILE": "stderr", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    mine = {"UCX_LOG_FILE": "/tmp/ucx.log", "UCX_WARN_UNUSED_ENV_VARS": "y"}
    ucx_output_to_stderr(mine)
    assert mine == {"UCX_LOG_FILE": "/tmp/ucx.log", "UCX_WARN_UNUSED_ENV_VARS": "y"}

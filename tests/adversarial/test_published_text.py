"""A worker's published strings never reach a terminal or a log raw (issue 40): escape
sequences are shown escaped (``\\x1b``) by ``gpudask check`` / ``gpudask status`` and in the
scheduler's log, a newline never starts a forged log line, and a worker that publishes
``"bounded": true`` is bounded all the same."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import base_env, host

from gpudask.checks import published as bounds

TWO_GPUS = host("workstation-2gpu-pcie.json")

FORGED_LINE = "2026-12-02 10:00:00,000 - distributed.scheduler - INFO - Forged: scheduler closing"

# a worker of its own: plain `dask worker` whose preload publishes what it likes under "gpudask"
FORGER = f"""
FORGED_LINE = {FORGED_LINE!r}


def dask_setup(worker):
    published = {{
        "version": "1\\x1b]0;owned\\x07",
        "role": "worker",
        "protocol": "tcp",
        "bounded": True,  # "already bounded": before, the scheduler believed it
        "facts": {{"schema": 2, "hostname": "h\\x1b[2J"}},
        "plan": {{"role": "worker", "index": 0, "env": {{"UCX_TLS": "y" * 1_000_000}}}},
        "mismatches": [{{"process": "worker 0\\n" + FORGED_LINE, "key": "\\x1b[31mkey\\x1b[0m\\n" + FORGED_LINE,
                        "planned": 1, "actual": 2, "plugin": "p\\x1b[5m\\n" + FORGED_LINE}}],
    }}
    worker.startup_information["gpudask"] = lambda _worker: published
"""


def _forged_lines(text: str) -> list[str]:
    """Lines that begin with the worker's forged text (it may appear escaped inside a line)."""
    return [line for line in text.splitlines() if line.lstrip().startswith(FORGED_LINE[:30])]


@pytest.fixture
def forged(cluster, tmp_path):
    (tmp_path / "forger.py").write_text(FORGER)
    env = base_env(GPUDASK_FACTS=TWO_GPUS)
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--nworkers", "1", "--preload", str(tmp_path / "forger.py"), env=env)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        import time

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            (w,) = client.scheduler_info(n_workers=-1)["workers"].values()
            if w.get("gpudask-check"):
                break
            time.sleep(0.2)
        yield cluster, client, env


@pytest.mark.process
def test_a_worker_publishing_bounded_true_is_bounded_all_the_same(forged):
    cluster, client, _ = forged
    (w,) = client.scheduler_info(n_workers=-1)["workers"].values()
    # before: the scheduler skipped the bounds and handed the 1 MB string to every reader
    assert len(w["gpudask"]["plan"]["env"]["UCX_TLS"]) <= bounds.MAX_STR, len(w["gpudask"]["plan"]["env"]["UCX_TLS"])


@pytest.mark.process
def test_a_workers_escape_sequences_and_newlines_never_reach_the_scheduler_log_raw(forged):
    cluster, client, _ = forged
    findings = client.scheduler_info(n_workers=-1)["workers"]
    (w,) = findings.values()
    assert any(f["code"] == "not-applied" for f in w["gpudask-check"]["findings"]), w["gpudask-check"]
    log = cluster.log("scheduler")
    assert "not in effect" in log or "did not take effect" in log, log[-3000:]
    # before: the worker's newline started a line of its own that reads as the scheduler's
    assert not _forged_lines(log), _forged_lines(log)
    assert "\x1b" not in log and "\\x1b[31mkey" in log, log[-3000:]


@pytest.mark.process
@pytest.mark.parametrize("command", ["check", "status"])
def test_a_workers_escape_sequences_never_reach_the_operators_terminal(forged, command):
    cluster, _, env = forged
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", command, "--scheduler-file", cluster.scheduler_file],
                         capture_output=True, text=True, timeout=120, env=env)
    text = out.stdout + out.stderr
    assert out.returncode in (0, 1), text[-3000:]
    # before (check): the escape sequences went to the terminal as they were, and a newline
    # in a finding started a line of the worker's own
    assert "\x1b" not in text and "\x07" not in text, ascii(text[-3000:])
    assert not _forged_lines(text), _forged_lines(text)
    assert "\\x1b" in text, text[-3000:]


# ---------------------------------------------------------------- in one process
def test_bound_published_trusts_no_mark_in_the_data():
    out = bounds.bound_published({"bounded": True, "plan": {"env": {"UCX_TLS": "y" * 100_000}}})
    # before: "bounded": true made it return the worker's data as it was
    assert len(out["plan"]["env"]["UCX_TLS"]) <= bounds.MAX_STR
    assert bounds.bound_published(out) == out  # bounded data passes through unchanged


def test_a_finding_is_one_line_whatever_its_fields_hold():
    from gpudask.findings import Finding

    line = Finding("error", "x", "m\n" + FORGED_LINE + "\x1b[2J", plugin="p\r\n", subject="w\x07").line()
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\x07" not in line
    assert line == f"error: w\\x07 vs ?: [p\\r\\n] m\\n{FORGED_LINE}\\x1b[2J".replace(" vs ?", "")


def test_a_page_build_that_raises_systemexit_is_a_problem_line_not_the_event_loops_end():
    import asyncio
    import json

    from gpudask.dashboard.serve import Builder

    def build(_snap):
        raise SystemExit(0)

    async def main():
        return await Builder().get(object(), lambda _s: {}, build)

    # before: the SystemExit was handed to the event loop and raised there
    body = json.loads(asyncio.run(main()))
    assert body["problem"].startswith("the page's data could not be built: SystemExit(0)"), body

"""``gpudask status`` and ``gpudask check``: what they print about a running cluster, and how
they are told where the scheduler is.  Real `dask scheduler` / `dask worker` processes on
loopback, GPU hosts described by ``GPUDASK_FACTS``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import base_env, host, third_party_plugin as _third_party_plugin

from gpudask.cli.report import table
from gpudask.cli.status import LEGEND, escaped, format_status, worker_row

TWO_GPUS = host("workstation-2gpu-pcie.json")
ESC_TITLE = "\x1b]0;PWNED\x07"


def _gpudask(*args: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudask.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.process
def test_status_shows_the_pool_the_plugin_published_and_no_alarm_on_healthy_workers(cluster):
    """The pool column reads what the memory plugin published (on a described host: planned,
    and why it is not in place); healthy workers carry no '!' and no 'None'."""
    env = base_env(GPUDASK_FACTS=TWO_GPUS, DASK_GPUDASK__RMM__POOL_SIZE="1GiB")
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=90)
    as_json = _gpudask("status", "--scheduler-file", cluster.scheduler_file, "--json", env=env)
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)["workers"]
    assert [r["index"] for r in rows] != [None, None] and len(rows) == 2
    for r in rows:
        assert r["columns"]["pool"]["planned"] == 2**30, r["columns"]["pool"]
        assert "described" in r["columns"]["pool"]["note"], r["columns"]["pool"]  # the plugin said why no pool was built
        assert r["mismatches"] == [] and r["problems"] == []
    text = _gpudask("status", cluster.address, env={**env, "COLUMNS": "200"})
    assert text.returncode == 0, text.stderr
    table_rows = [line for line in text.stdout.splitlines() if line.startswith("tcp://")]
    assert len(table_rows) == 2
    for line in table_rows:
        assert "!" not in line and "None" not in line, line
    # what both workers share (the pool, planned but not in place here) is said once, above the table
    assert text.stdout.count("1.0 GiB (not in place: host described") == 1, text.stdout
    assert LEGEND in text.stdout  # COLUMNS=200: on one line


READ_BACK_ESCAPES = f"""
    from gpudask.pluginapi import hookimpl

    name = "escapes"
    priority = 500

    @hookimpl
    def gpudask_applied_state(ctx, plan):
        if plan.role == "worker":
            return {{"title": {{"planned": "fine", "actual": {ESC_TITLE!r}}}}}
    """


@pytest.mark.process
def test_status_prints_worker_published_strings_escaped_and_check_takes_the_same_scheduler_options(cluster,
                                                                                                   tmp_path):
    env = base_env(GPUDASK_FACTS=TWO_GPUS, **_third_party_plugin(tmp_path, READ_BACK_ESCAPES, name="escapes"))
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=90)
    for how in (["--scheduler-file", cluster.scheduler_file], ["--address", cluster.address], [cluster.address]):
        out = _gpudask("status", *how, env=env)
        assert out.returncode == 1, (how, out.stderr)  # the mismatch
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout
        assert "title is '\\x1b]0;PWNED\\x07', planned 'fine' (plugin escapes)" in out.stdout
        checked = _gpudask("check", *how, "--json", env=env)
        assert checked.returncode == 1, (how, checked.stderr)  # not-applied is an error finding
        assert json.loads(checked.stdout)["scheduler"]["address"] == cluster.address


@pytest.mark.parametrize("command", ["status", "check"])
def test_status_and_check_refuse_two_schedulers_in_one_line(command, tmp_path):
    sf = tmp_path / "s.json"
    sf.write_text(json.dumps({"address": "tcp://127.0.0.1:1"}))
    for args in (["tcp://127.0.0.1:1", "--address", "tcp://127.0.0.1:2"],
                 ["--address", "tcp://127.0.0.1:1", "--scheduler-file", str(sf)], []):
        out = _gpudask(command, *args, env=base_env(), timeout=60)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith("gpudask: error: ") and "--scheduler-file FILE" in line, line
        assert "Traceback" not in out.stderr


def test_escaped_shows_control_characters_and_cuts_long_values():
    assert escaped(ESC_TITLE) == "\\x1b]0;PWNED\\x07"
    assert escaped("a\nb\u202e") == "a\\nb\\u202e"
    assert len(escaped("x" * 10_000)) == 120 and escaped("x" * 10_000).endswith("…")


@pytest.mark.parametrize("published, problem", [
    ({"plan": "not a dict"}, "plan is a str, not a mapping"),
    ({"plan": {"index": 0}, "applied": [1, 2]}, "applied is a list, not a mapping"),
    ({"plan": {"index": 0}, "mismatches": {"key": "x"}}, "mismatches is a dict, not a list"),
    ({"plan": {"index": 0}, "mismatches": ["oops", {"planned": 1}]}, "mismatches[0] is not a mapping"),
    ({"plan": {"index": 0, "cpu_affinity": "0-3"}}, "plan.cpu_affinity '0-3' is not a list of CPU numbers"),
    ({"plan": {"index": 0}, "applied": {"cpu_affinity": [0, "one", -1]}}, "applied.cpu_affinity"),
    ({"plan": {"index": "zero"}}, "plan.index is a str, not an integer"),
    ("a string", "gpudask is a str, not a mapping"),
])
def test_status_gives_one_line_per_malformed_field_never_a_traceback(published, problem):
    row = worker_row("tcp://w:1", {"gpudask": published})
    assert any(problem in p for p in row["problems"]), row["problems"]
    text = format_status({"scheduler": "tcp://s:1", "workers": [row]}, lambda h, r: table(h, r, None))
    warnings = [line for line in text.splitlines() if line.startswith("warning: tcp://w:1 published a malformed")]
    assert len(warnings) == len(row["problems"]) >= 1
    assert any(problem in w for w in warnings)


def test_a_planned_value_not_set_reads_not_set_and_a_difference_without_mismatch_has_no_alarm():
    published = {"plan": {"index": 0, "cpu_affinity": None, "multiprocessing_method": None,
                          "cuda_visible_devices": "0,1"},
                 "applied": {"cpu_affinity": [0, 1], "multiprocessing_method": "spawn",
                             "env": {"CUDA_VISIBLE_DEVICES": "1,0"}},
                 "mismatches": [{"process": "worker 0", "key": "CUDA_VISIBLE_DEVICES", "planned": "0,1",
                                 "actual": "1,0", "plugin": "gpu-pinning"}]}
    text = format_status({"scheduler": "tcp://s:1", "workers": [worker_row("tcp://w:1", {"gpudask": published})]},
                         lambda h, r: table(h, r, None))
    row = next(line for line in text.splitlines() if line.startswith("tcp://w:1"))
    assert "not set (0-1)" in row and "not set (spawn)" in row and "None" not in row
    assert "0,1 -> 1,0!" in row and row.count("!") == 1

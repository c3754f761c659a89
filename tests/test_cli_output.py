"""What a person reads: short `gpudask info`, tables that fit the terminal, the command lines."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

ROOT = pathlib.Path(__file__).parent.parent
HGX = ["--facts", "tests/hosts/hgx-4gpu-2ib.json", "--protocol", "ucx", "--nworkers", "4"]


@pytest.fixture
def cli(monkeypatch):
    """Run ``gpudask ARGS`` in-process from the repository root, with a terminal COLUMNS wide."""
    from gpudask.cli import main

    for name in list(os.environ):
        if name.startswith(("UCX_", "DASK_", "RAPIDS_")) or name == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(name)
    monkeypatch.chdir(ROOT)

    def run(*args: str, columns: int = 80) -> str:
        result = CliRunner(env={"COLUMNS": str(columns)}).invoke(main, list(args), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    return run


@pytest.mark.parametrize("columns", [80, 1000])
def test_info_fits_40_lines_for_a_4_gpu_host(cli, columns):
    lines = cli("info", *HGX, columns=columns).splitlines()
    # 42: the scheduler's and client's UCX_CUDA_IPC_CACHE=n (and its wrap at 80 columns) are real rows
    assert len(lines) <= 42, "\n".join(lines)
    assert max(map(len, lines)) <= columns


def test_info_summary_shows_workers_changes_and_the_command_lines(cli):
    out = cli("info", *HGX, columns=1000)
    plan = json.loads(cli("info", *HGX, "--json"))
    lines = out.splitlines()
    for w in plan["workers"]:  # one row per worker: its GPU and its own devices
        row = next(line.split() for line in lines if line.startswith(f"{w['index']} "))
        assert row[:3] == [str(w["index"]), str(w["gpu_index"]), w["cuda_visible_devices"]]
        assert w["env"]["UCX_NET_DEVICES"] in row and w["interface"] in row
    # the nanny host's own transports; the scheduler relays GPU frames with the workers' CUDA transports
    assert "UCX_TLS=rc,tcp " in out and "all but nanny" in out
    assert plan["scheduler"]["env"]["UCX_TLS"] == "rc,tcp,cuda_copy,cuda_ipc"
    assert "resource GPU=1" in out and "memory pool 39.8 GiB" in out
    # a value equal to stock dask's is not a change: the plan sets the RMM pool keys to None
    assert plan["scheduler"]["config"]["distributed.rmm.pool-size"] is None
    assert "distributed.rmm.pool-size" not in out
    assert "  dask scheduler --protocol ucx --preload gpudask" in lines
    assert "  dask worker ucx://SCHEDULER:8786 --nworkers 4 --nthreads 1 --preload gpudask" in lines


def test_info_warns_about_gpus_fewer_workers_leave_idle(cli):
    """dask-cuda starts one worker per GPU: fewer is said, as more is."""
    out = cli("info", "--facts", "tests/hosts/hgx-4gpu-2ib.json", "--nworkers", "1", columns=200)
    assert ("warning: 1 worker(s) on a host with 4 visible GPU(s): 3 GPU(s) stay idle; --nworkers 4 gives one "
            "worker per GPU") in out
    assert "stay idle" not in cli("info", "--facts", "tests/hosts/hgx-4gpu-2ib.json")
    assert "stay idle" not in cli("info", "--facts", "tests/hosts/no-gpu.json", "--nworkers", "1")


def test_info_reasons_gives_every_decision(cli):
    full = cli("info", *HGX, "--reasons", columns=1000)
    assert cli("info", *HGX, "-v", columns=1000) == full
    plan = json.loads(cli("info", *HGX, "--json"))
    lines = full.splitlines()
    for process in [plan["scheduler"], plan["nanny"], plan["client"], *plan["workers"]]:
        for r in process["reasons"]:
            # said once: under the processes that share it, or as the rule every worker applies
            # to its own GPU, or for the scheduler and the client together
            literal = f"  [{r['plugin']}] {r['decision']} -- {r['why']}"
            number = str(process["index"]) if process["role"] == "worker" else None
            saying = [line for line in lines if says(line, literal, number)]
            assert len(saying) == 1, (literal, saying)
    assert any(line.startswith("every worker (4)") for line in lines)


def says(line: str, literal: str, number: str | None) -> bool:
    """Whether a line of `info --reasons` says ``literal`` (one decision with its reason):
    word for word, or among decisions that share the reason (``a, b -- why``); as a templated
    rule (``N``: the worker's number, ``…``: its own value; a GPU UUID shortened around ``…``);
    with ``scheduler/client`` for either; or as another process's decision ("as worker 0's")."""
    import re

    head, _, rest = line.partition("] ")
    decisions, _, why = rest.partition(" -- ")
    for decision in [decisions, *decisions.split(", ")]:
        one = f"{head}] {decision} -- {why}"
        if one == literal or (number is None and why.startswith("as worker ") and literal.startswith(f"{head}] {decision} -- ")):
            return True
        pattern = re.escape(one).replace("…", ".+?")
        if number is not None:
            pattern = re.sub(r"(?<![A-Za-z_])N(?![A-Za-z_])", number, pattern)
        pattern = re.sub(r"((?:scheduler|nanny|client)(?:/(?:scheduler|nanny|client))+)",
                         lambda m: "(?:" + m.group(1).replace("/", "|") + ")", pattern)
        if pattern != re.escape(one) and re.fullmatch(pattern, literal):
            return True
    return False



def test_info_command_line_follows_protocol_nworkers_and_interface(cli):
    out = cli("info", "--facts", "tests/hosts/no-gpu.json", "--nworkers", "3", "--interface", "eth1")
    assert "  dask worker tcp://SCHEDULER:8786 --nworkers 3 --preload gpudask --interface eth1" in out.splitlines()
    assert "no GPU visible" in out


def test_an_environment_variable_the_user_set_is_not_a_change(cli, monkeypatch):
    monkeypatch.setenv("UCX_SOCKADDR_TLS_PRIORITY", "rdmacm")  # the value infiniband would set
    assert "UCX_SOCKADDR_TLS_PRIORITY" not in cli("info", *HGX, columns=1000)
    monkeypatch.delenv("UCX_SOCKADDR_TLS_PRIORITY")
    assert "UCX_SOCKADDR_TLS_PRIORITY=rdmacm" in cli("info", *HGX, columns=1000)


def test_config_table_fits_80_columns_and_keeps_every_value(cli):
    out = cli("config", columns=80)
    assert max(map(len, out.splitlines())) <= 80
    rows = json.loads(cli("config", "--json"))
    packages = next(r for r in rows if r["key"] == "gpudask.scheduler-parity.packages")["value"]
    assert len(json.dumps(packages)) > 80  # so it had to wrap
    for row in rows:
        assert row["key"] in out
    for name in packages:
        assert f'"{name}"' in out


def test_table_wraps_long_cells_in_the_widest_column_without_losing_text():
    from gpudask.cli.report import table

    message = ("worker tcp://10.0.0.7:40123 runs distributed 2025.9.1 but the scheduler runs 2025.11.0: "
               "pin the same version on every host")
    rows = [["error", "tcp://10.0.0.7:40123", "scheduler", "scheduler-parity", message],
            ["info", "client", "-", "gpudask", "ok"]]
    out = table(["severity", "process", "compared with", "plugin", "finding"], rows, width=80)
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80
    assert len(lines) > 4  # the finding wrapped onto more lines
    rule = next(i for i, line in enumerate(lines) if set(line) <= {"-", " "})
    column = lines[rule].rindex(" ") + 1  # where the finding column starts
    # every character of the finding is there, in order, reading its column top to bottom
    finding = "".join(line[column:] for line in lines[rule + 1:-1]).replace(" ", "")
    assert finding == message.replace(" ", "")
    assert table(["a"], [["x" * 200]], width=None) == "a\n" + "-" * 200 + "\n" + "x" * 200


def test_table_with_a_column_narrower_than_the_minimum_still_wraps():
    """A 4-character column next to a long one, in too narrow a terminal (gpudask bench's
    "unit" column): the long cell wraps, nothing is lost, no KeyError."""
    from gpudask.cli.report import table

    text = table(["figure", "unit", "a"], [["transfer 1MB (end to end)", "s", "0.1 / 0.2 " * 8]], width=60)
    assert max(len(line) for line in text.splitlines()) <= 60
    assert text.count("0.1 / 0.2") == 8


def test_table_without_a_terminal_keeps_whole_lines(monkeypatch):
    from gpudask import textwidth
    from gpudask.cli import report

    monkeypatch.setattr(textwidth.shutil, "get_terminal_size", lambda fallback: os.terminal_size(fallback))
    assert report.terminal_width() is None
    assert len(report.table(["k", "v"], [["a", "y" * 300]]).splitlines()[-1]) > 300


@pytest.mark.process
def test_piped_info_keeps_whole_lines():
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS" and not k.startswith(("UCX_", "DASK_"))}
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", *HGX], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "PTXCOMPILER_CHECK_NUMBA_CODEGEN_PATCH_NEEDED=0" in out.stdout  # not wrapped
    assert len(out.stdout.splitlines()) <= 40


@pytest.mark.process
def test_plugins_lists_a_plugin_that_cannot_be_imported_as_broken_and_exits_1(tmp_path):
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    (site / "brokenplug-0.1.dist-info").mkdir(parents=True)
    (site / "brokenplug-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\n"
                                                              "Version: 0.1\n")
    (site / "brokenplug-0.1.dist-info" / "entry_points.txt").write_text("[gpudask]\nbroken = brokenplug\n")
    (site / "brokenplug.py").write_text("import no_such_module_here\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "GPUDASK_LOAD_PLUGINS": "broken"}  # the session's autoload is off: loaded by name
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "plugins", "--json"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 1
    listed = {p["name"]: p for p in json.loads(out.stdout)}
    assert "rmm" in listed and listed["rmm"]["source"] == "builtin"  # the others still listed
    assert listed["broken"]["source"] == "broken" and "No module named 'no_such_module_here'" in \
        listed["broken"]["error"]


def test_config_shows_a_value_as_the_user_wrote_it_then_what_gpudask_made_of_it(cli, monkeypatch):
    monkeypatch.setenv("DASK_GPUDASK__RMM__POOL_SIZE", "40GiB")
    import dask.config

    dask.config.refresh()
    try:
        out = cli("config", columns=100)
        row = next(line for line in out.splitlines() if line.startswith("gpudask.rmm.pool-size "))
        assert row.split() == ["gpudask.rmm.pool-size", "40GiB", "(42949672960)", "$DASK_GPUDASK__RMM__POOL_SIZE"]
        rows = json.loads(cli("config", "--json"))
        setting = next(r for r in rows if r["key"] == "gpudask.rmm.pool-size")
        assert (setting["value"], setting["given"]) == (42949672960, "40GiB")
        assert all(r["given"] is None or r["given"] != r["value"] for r in rows)  # only where spelled otherwise
    finally:
        monkeypatch.delenv("DASK_GPUDASK__RMM__POOL_SIZE")
        dask.config.refresh()


def test_the_demos_table_on_a_cpu_host_over_ucx_does_not_contradict_itself():
    """A plugin that decided something is not also listed as skipped; no row promises a pool on
    a host without a GPU; one plugin's decisions for one reason are one row."""
    from gpudask.bootstrap import plan_host
    from gpudask.cli.demo import _decisions

    host = plan_host("ucx", 2, facts_path=str(ROOT / "tests/hosts/no-gpu-ucx.json"))
    published = [{"plan": w.to_dict(), "plugins": host.plugins} for w in host.workers]
    out: list[str] = []
    _decisions(published, 2, out.append, out.append)
    text = "\n".join(out)
    rows = [line for line in text.splitlines()[3:] if line.startswith("all ")]
    decided = {row.split()[1].rstrip(",") for row in rows if " skipped " not in f" {row} "}
    skipped = {name.rstrip(",") for row in rows if " skipped " in f" {row} " for name in row.split("  ")[1].split()}
    assert rows and not decided & skipped, text
    assert "builds this worker's pool" not in text and "no GPU visible: no pool" in text
    pool_rows = [row for row in rows if "rmm.pool-size=None" in row]
    assert len(pool_rows) == 1 and "distributed-ucxx.rmm.pool-size=None, distributed.rmm.pool-size=None" in text

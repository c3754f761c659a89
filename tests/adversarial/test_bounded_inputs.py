"""Inputs that ran without bound or ended in a traceback (issue 40, items 3 and 4): a YAML
alias bomb, deep nesting, 5000-digit integers and ``1e400GB`` in config files; facts files
of 10 000 GPUs, deep nesting, lone surrogates, duplicate UUIDs or writable by others; a
scheduler file that is ``/dev/zero``, a FIFO or a ``tls://`` address; output to a terminal
that cannot show a host's name.  Each is one line naming what was wrong and what is accepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import base_env, host

from gpudask.config import MAX_CONFIG_DEPTH, MAX_CONFIG_NODES, load_dask_config
from gpudask.errors import ConfigError


def _one_line(out: subprocess.CompletedProcess, *parts: str) -> str:
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "Traceback" not in text, text
    lines = [x for x in text.splitlines() if x.strip() and " - INFO - " not in x]  # distributed's own INFO
    assert len(lines) == 1, text
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def _gpudask(tmp_path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudask.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(tmp_path), env=base_env(**env))


# -- config files ---------------------------------------------------------------------
def _alias_bomb(levels: int = 9) -> str:
    """About 1 KB of YAML that expands to 9**9 (387 million) values."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "gpudask:\n  rmm:\n" + "".join(f"    {line}\n" for line in lines)


def _mapping_bomb(levels: int = 9) -> str:
    lines = ["m0: &m0 {" + ", ".join(f"k{j}: {j}" for j in range(9)) + "}"]
    lines += [f"m{i}: &m{i} {{" + ", ".join(f"k{j}: *m{i - 1}" for j in range(9)) + "}" for i in range(1, levels)]
    return "gpudask:\n  x:\n" + "".join(f"    {line}\n" for line in lines)


CONFIG_BOMBS = {
    "alias-bomb.yaml": (_alias_bomb(), f"more than {MAX_CONFIG_NODES} values once its aliases are expanded"),
    "mapping-bomb.yaml": (_mapping_bomb(), f"more than {MAX_CONFIG_NODES} values once its aliases are expanded"),
    "recursive.yaml": ("gpudask:\n  x: &a [1, *a]\n", "an alias inside the node it names"),
    "deep.yaml": ("gpudask: " + "[" * 5000 + "]" * 5000 + "\n", f"nested more than {MAX_CONFIG_DEPTH} deep"),
    "deep-mapping.yaml": ("gpudask: " + "{a: " * 100 + "1" + "}" * 100 + "\n", f"nested more than {MAX_CONFIG_DEPTH}"),
    "deep.toml": ("a = " + "[" * 5000 + "]" * 5000 + "\n", f"nested more than {MAX_CONFIG_DEPTH} deep"),
    "digits.toml": ("[rmm]\npool-size = " + "9" * 5000 + "\n", "not a valid TOML file (Exceeds the limit"),
    "digits.yaml": ("gpudask:\n  rmm:\n    pool-size: " + "9" * 5000 + "\n", "not valid YAML (Exceeds the limit"),
}


@pytest.mark.parametrize("name", sorted(CONFIG_BOMBS))
@pytest.mark.parametrize("way", ["GPUDASK_CONFIG", "--config"])
def test_a_config_file_that_expands_or_nests_without_bound_is_one_line(tmp_path, monkeypatch, name, way):
    """Before: the alias bombs ran until killed (the 1 KB file expands to 387 million values
    when dask's config merges it); deep nesting and 5000 digits were tracebacks."""
    text, message = CONFIG_BOMBS[name]
    path = tmp_path / name
    path.write_text(text)
    assert len(text) < 11000
    if way == "GPUDASK_CONFIG":
        monkeypatch.setenv("GPUDASK_CONFIG", str(path))
        expected_start = f"GPUDASK_CONFIG={path}: "
    else:
        expected_start = f"--config {path}: "
    with pytest.raises(ConfigError) as e:
        load_dask_config(path if way == "--config" else None)
    text = str(e.value)
    assert text.startswith(expected_start) and message in text and "\n" not in text, text


def test_yaml_aliases_a_config_file_may_use_still_load(tmp_path):
    (tmp_path / "anchors.yaml").write_text("gpudask:\n  rmm: &pool\n    pool-size: 4GB\n  spill:\n    x: *pool\n")
    load_dask_config(tmp_path / "anchors.yaml")
    import dask.config

    assert dask.config.get("gpudask.rmm.pool-size") == "4GB"


@pytest.mark.parametrize("value", ["1e400GB", "1e400GiB"])
def test_an_infinite_size_is_one_line(tmp_path, monkeypatch, value):
    """Before: OverflowError (cannot convert float infinity to integer), a 96-line traceback."""
    from gpudask.bootstrap import plan_host

    (tmp_path / "gpudask.toml").write_text(f'[rmm]\npool-size = "{value}"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUDASK_FACTS", host("workstation-2gpu-pcie.json"))
    with pytest.raises(ConfigError) as e:
        plan_host(protocol="tcp")
    text = str(e.value)
    assert text.startswith(f"gpudask.rmm.pool-size = '{value}' (from gpudask.toml") and "accepted: a size" in text


def test_a_value_too_long_to_show_is_cut_in_the_error_line(tmp_path, monkeypatch):
    from gpudask.bootstrap import plan_host

    monkeypatch.setenv("DASK_GPUDASK__RMM__POOL_SIZE", "x" * 100_000)
    monkeypatch.setenv("GPUDASK_FACTS", host("workstation-2gpu-pcie.json"))
    with pytest.raises(ConfigError) as e:
        plan_host(protocol="tcp")
    assert len(str(e.value)) < 1000 and "..." in str(e.value)


@pytest.mark.process
def test_dask_scheduler_with_an_infinite_size_exits_with_one_line(tmp_path):
    """The issue's case: `dask scheduler --preload gpudask` died with 97 lines."""
    (tmp_path / "gpudask.toml").write_text('[rmm]\npool-size = "1e400GB"\n')
    out = subprocess.run([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                          "--port", "0", "--no-dashboard", "--preload", "gpudask"], capture_output=True, text=True,
                         timeout=120, cwd=str(tmp_path), env=base_env())
    line = _one_line(out, "gpudask.rmm.pool-size = '1e400GB'", "accepted: a size")
    assert line.startswith("Error: gpudask: ")


# -- facts files ----------------------------------------------------------------------
def _facts_text(tmp_path, name: str, change) -> str:
    data = json.loads(open(host("workstation-2gpu-pcie.json")).read())
    text = change(data)
    path = tmp_path / name
    path.write_text(text if isinstance(text, str) else json.dumps(data))
    return str(path)


def _many_gpus(data):
    gpu = data["gpus"][0]
    data["gpus"] = [{**gpu, "index": i, "uuid": f"GPU-{i:08d}-0000-0000-0000-000000000000", "cpu_affinity": [0]}
                    for i in range(10_000)]


def _duplicate_uuid(data):
    data["gpus"][1]["uuid"] = data["gpus"][0]["uuid"]


def _lone_surrogate(data):
    data["hostname"] = "node-\ud800"
    return json.dumps(data)  # ensure_ascii: the file holds the escape "\ud800", as an attacker would write it


def _nested(depth: int):
    def change(data):
        return json.dumps(data)[:-1] + ', "sections": {"gds": ' + "[" * depth + "]" * depth + "}}"
    return change


def _digits(data):
    return json.dumps(data)[:-1] + ', "cpu_count": ' + "9" * 5000 + "}"


FACTS_CASES = {
    "10000-gpus": (_many_gpus, "key 'gpus' must be a list of at most 64 GPUs, got '10000 GPUs'"),
    "duplicate-uuid": (_duplicate_uuid, "key 'gpus[1].uuid' must be unique among the GPUs (gpus[0] has it)"),
    "lone-surrogate": (_lone_surrogate, "key 'hostname' must be a string of Unicode characters (no lone surrogates)"),
    "nested-20": (_nested(20), "must be nested at most 16 deep"),
    "nested-100000": (_nested(100_000), "nested deeper than a facts file may be"),
    "5000-digits": (_digits, "integers in a facts file are at most 2**53"),
}


@pytest.mark.parametrize("case", sorted(FACTS_CASES))
def test_a_facts_file_without_bound_is_one_line(tmp_path, case):
    """Before: 10 000 GPUs planned for minutes (killed), a duplicate UUID was accepted (two
    workers on one GPU), the others were tracebacks (UnicodeEncodeError, RecursionError, ValueError)."""
    from gpudask.errors import FactsError
    from gpudask.facts import load_facts

    change, message = FACTS_CASES[case]
    path = _facts_text(tmp_path, f"{case}.json", change)
    with pytest.raises(FactsError) as e:
        load_facts(path)
    text = str(e.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text and len(text) < 400, text


def test_facts_published_by_a_worker_are_bounded_the_same_way():
    """What a worker publishes goes through the same checks on the scheduler."""
    from gpudask.errors import FactsError
    from gpudask.facts import facts_from_dict

    data = json.loads(open(host("workstation-2gpu-pcie.json")).read())
    _many_gpus(data)
    with pytest.raises(FactsError, match="at most 64 GPUs"):
        facts_from_dict(data, "published")


@pytest.mark.parametrize("mode", [0o666, 0o646])
def test_a_facts_file_every_user_may_write_is_refused(tmp_path, mode):
    from gpudask.errors import FactsError
    from gpudask.facts import load_facts

    path = tmp_path / "host.json"
    path.write_text(open(host("workstation-2gpu-pcie.json")).read())
    path.chmod(mode)
    with pytest.raises(FactsError) as e:
        load_facts(path)
    assert f"every user can write it (mode {mode:04o})" in str(e.value) and "chmod go-w" in str(e.value)


def test_a_facts_file_its_group_may_write_is_a_warning(tmp_path, caplog):
    from gpudask.facts import load_facts

    path = tmp_path / "host.json"
    path.write_text(open(host("workstation-2gpu-pcie.json")).read())
    path.chmod(0o664)
    assert len(load_facts(path).gpus) == 2
    (line,) = [r.getMessage() for r in caplog.records if "facts file" in r.getMessage()]
    assert "its group can write it (mode 0664)" in line and "chmod g-w" in line


def test_a_facts_file_of_another_user_is_refused(tmp_path, other_user):
    from gpudask.errors import FactsError
    from gpudask.facts import load_facts

    path = tmp_path / "host.json"
    path.write_text(open(host("workstation-2gpu-pcie.json")).read())
    path.chmod(0o644)
    os.chown(path, *other_user)
    with pytest.raises(FactsError, match=r"owned by uid \d+ \(gpudask-adversary\), not by you"):
        load_facts(path)


# -- scheduler files, addresses and protocols --------------------------------------------
def _cli(*args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from gpudask.cli import main

    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output + (f"{type(result.exception).__name__}" if result.exception and not
                                               isinstance(result.exception, SystemExit) else "")


@pytest.mark.parametrize("command", ["status", "check"])
@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "directory-like", "not-json", "no-address", "deep"])
def test_a_scheduler_file_that_is_not_one_is_one_line(tmp_path, command, kind):
    """Before: /dev/zero was read until the kernel killed the command (24 GB), a FIFO blocked
    for ever, a JSON list or deep nesting were tracebacks."""
    if kind == "/dev/zero":
        path, message = "/dev/zero", "not a regular file (a FIFO, socket or device)"
    elif kind == "fifo":
        path, message = str(tmp_path / "fifo"), "not a regular file"
        os.mkfifo(path)
    elif kind == "directory-like":
        path, message = "/proc/self/fd/0", "not a regular file"
    else:
        path = str(tmp_path / "scheduler.json")
        text = {"not-json": "{", "no-address": "[1, 2]", "deep": "[" * 100_000}[kind]
        message = {"not-json": "not JSON", "no-address": "no string 'address' in it", "deep": "not JSON"}[kind]
        open(path, "w").write(text)
    code, out = _cli(command, "--scheduler-file", path, "--timeout", "5")
    lines = [x for x in out.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1, out
    assert lines[0].startswith("gpudask: error: ") and path in lines[0] and message in lines[0], out
    assert "accepted: the JSON file `dask scheduler --scheduler-file` writes" in lines[0]


def test_the_timeout_bounds_the_read_of_a_scheduler_file(tmp_path, monkeypatch):
    """A read that never returns (a hung network file system, stood in for by an open that
    blocks) ends at --timeout with one line."""
    import threading

    from gpudask.cli.connect import read_scheduler_file
    from gpudask.errors import GpudaskError

    path = tmp_path / "scheduler.json"
    path.write_text('{"address": "tcp://127.0.0.1:1"}')
    never = threading.Event()
    real_open = os.open

    def hung_open(name, *args, **kwargs):
        if os.fspath(name) == str(path):
            never.wait(30)
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr(os, "open", hung_open)
    try:
        with pytest.raises(GpudaskError, match=r"not read within 0.5 s \(--timeout\)"):
            read_scheduler_file(str(path), timeout=0.5)
    finally:
        never.set()
    monkeypatch.undo()
    assert read_scheduler_file(str(path), timeout=5) == "tcp://127.0.0.1:1"


@pytest.mark.parametrize("command", ["status", "check"])
def test_a_tls_scheduler_without_certificates_is_one_line(tmp_path, command):
    """Before: a TypeError traceback from distributed's TLS connector, then a hang at exit."""
    path = tmp_path / "scheduler.json"
    path.write_text(json.dumps({"address": "tls://127.0.0.1:1", "type": "Scheduler"}))
    code, out = _cli(command, "--scheduler-file", str(path), "--timeout", "5")
    lines = [x for x in out.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1, out
    assert "tls://127.0.0.1:1: a TLS scheduler, and no TLS settings for this client" in lines[0], out


@pytest.mark.parametrize("protocol", [5, b"tcp", "tls"])
def test_local_gpu_cluster_with_a_protocol_it_cannot_use_is_one_line(protocol):
    """Before: protocol=5 was AttributeError ('int' object has no attribute 'strip'), "tls"
    without certificates a traceback per process and RuntimeError: Cluster failed to start."""
    import gpudask
    from gpudask.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        gpudask.LocalGPUCluster(protocol=protocol)
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"protocol={protocol!r}") and "accepted:" in text, text


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
def test_output_to_a_terminal_that_cannot_show_a_name_is_escaped(tmp_path, encoding):
    """A host named in CJK on a Latin-1 terminal: before, a UnicodeEncodeError traceback in the
    middle of `gpudask info`."""
    data = json.loads(open(host("workstation-2gpu-pcie.json")).read())
    data["hostname"] = "höst-東京"
    (tmp_path / "host.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--facts", str(tmp_path / "host.json")],
                         capture_output=True, timeout=120, cwd=str(tmp_path),
                         env=base_env(PYTHONIOENCODING=encoding, LC_ALL="C", LANG="C"))
    text = (out.stdout + out.stderr).decode(encoding, "replace")
    assert out.returncode == 0 and "Traceback" not in text, text
    if encoding == "latin-1":  # (on an ASCII stream click writes UTF-8 bytes itself)
        assert "\\u6771\\u4eac" in text.splitlines()[0], text  # 東京, escaped

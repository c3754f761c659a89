"""Bad config files and variables: one line naming the file or variable, what was wrong and
what is accepted -- in ``gpudask info`` and in a real ``dask scheduler --preload gpudask``,
which exits non-zero instead of starting without a word or dying on a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import base_env

from gpudask.config import MAX_CONFIG_BYTES, load_dask_config
from gpudask.errors import ConfigError


def _info(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudask.cli", "info", *args], capture_output=True, text=True,
                          timeout=120, cwd=str(tmp_path), env=base_env(**env))


def _one_line(out: subprocess.CompletedProcess, *parts: str) -> None:
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "Traceback" not in text, text
    (line,) = [x for x in text.splitlines() if x.strip()]
    for part in parts:
        assert part in line, line


BAD = {
    "syntax.yaml": ("gpudask:\n  rmm: [1, 2\n", "not valid YAML at line 3 column 1"),
    "list.yaml": ("- 1\n- 2\n", "the top level is a list; accepted: a mapping of dask config namespaces"),
    "string.yml": ("just a string\n", "the top level is a string; accepted: a mapping"),
    "bad.toml": ("[gpudask\n", "not a valid TOML file"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_config_file_named_by_gpudask_config_is_one_line(tmp_path, monkeypatch, name):
    text, message = BAD[name]
    (tmp_path / name).write_text(text)
    monkeypatch.setenv("GPUDASK_CONFIG", str(tmp_path / name))
    with pytest.raises(ConfigError) as e:
        load_dask_config()
    assert str(e.value).startswith(f"GPUDASK_CONFIG={tmp_path / name}: ") and message in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_config_file_given_with_config_is_one_line(tmp_path, name):
    text, message = BAD[name]
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as e:
        load_dask_config(tmp_path / name)
    assert str(e.value).startswith(f"--config {tmp_path / name}: ") and message in str(e.value)


def test_gpudask_toml_that_is_a_directory_a_symlink_loop_a_fifo_or_too_large_is_refused(tmp_path, monkeypatch):
    (tmp_path / "gpudask.toml").mkdir()
    with pytest.raises(ConfigError, match=r"gpudask.toml: a directory, not a file; accepted: a regular TOML"):
        load_dask_config()
    (tmp_path / "gpudask.toml").rmdir()
    os.symlink("loop-b", tmp_path / "gpudask.toml")
    os.symlink("gpudask.toml", tmp_path / "loop-b")
    with pytest.raises(ConfigError, match=r"gpudask.toml: a symlink loop"):
        load_dask_config()
    os.mkfifo(tmp_path / "fifo.toml")  # reading it would block for ever
    monkeypatch.setenv("GPUDASK_CONFIG", str(tmp_path / "fifo.toml"))
    with pytest.raises(ConfigError, match=r"GPUDASK_CONFIG=.*fifo.toml: not a regular file"):
        load_dask_config()
    (tmp_path / "big.toml").write_text("# x\n" * (MAX_CONFIG_BYTES // 4 + 1))
    monkeypatch.setenv("GPUDASK_CONFIG", str(tmp_path / "big.toml"))
    with pytest.raises(ConfigError, match=rf"over the {MAX_CONFIG_BYTES}-byte limit"):
        load_dask_config()
    monkeypatch.setenv("GPUDASK_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match=r"missing.toml: no such file"):
        load_dask_config()


def test_dask_gpudask_given_a_list_is_refused(monkeypatch):
    monkeypatch.setenv("DASK_GPUDASK", "[1,2]")
    with pytest.raises(ConfigError) as e:
        load_dask_config()
    assert str(e.value).startswith("$DASK_GPUDASK = [1, 2] is not valid") and "accepted: a mapping" in str(e.value)


def test_an_empty_yaml_file_is_fine(tmp_path, monkeypatch):
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    monkeypatch.setenv("GPUDASK_CONFIG", str(tmp_path / "empty.yaml"))
    load_dask_config()


@pytest.mark.process
def test_gpudask_info_with_a_bad_config_prints_one_line(tmp_path):
    (tmp_path / "bad.yaml").write_text(BAD["syntax.yaml"][0])
    _one_line(_info(tmp_path, "--config", str(tmp_path / "bad.yaml")), "--config", "not valid YAML")
    _one_line(_info(tmp_path, DASK_GPUDASK="[1,2]"), "$DASK_GPUDASK", "accepted: a mapping")


@pytest.mark.process
@pytest.mark.parametrize("how", ["syntax", "list-variable", "directory"])
def test_dask_scheduler_with_a_bad_config_exits_with_one_line(tmp_path, how):
    env = base_env()
    if how == "syntax":
        (tmp_path / "bad.yaml").write_text(BAD["syntax.yaml"][0])
        env["GPUDASK_CONFIG"] = str(tmp_path / "bad.yaml")
        expected = f"GPUDASK_CONFIG={tmp_path / 'bad.yaml'}: not valid YAML"
    elif how == "list-variable":
        env["DASK_GPUDASK"] = "[1,2]"
        expected = "$DASK_GPUDASK = [1, 2] is not valid"
    else:
        (tmp_path / "gpudask.toml").mkdir()
        expected = "gpudask.toml: a directory, not a file"
    out = subprocess.run([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                          "--port", "0", "--no-dashboard", "--preload", "gpudask"], capture_output=True, text=True,
                         timeout=120, cwd=str(tmp_path), env=env)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert "Traceback" not in text, text
    lines = [x for x in text.splitlines() if x.strip() and " - INFO - " not in x]  # distributed's own INFO
    assert len(lines) == 1 and expected in lines[0] and lines[0].startswith("Error: gpudask: "), text

"""Config: dask namespace, gpudask.toml, environment, legacy keys, bad values, unknown keys."""

from __future__ import annotations

import subprocess
import sys

import dask
import pytest
from conftest import base_env

from gpudask.config import CORE_OPTIONS, Option, Settings, load_dask_config, parse_optional_bool, register_defaults
from gpudask.errors import ConfigError

TRANSPORT_FLAG = Option("gpudask.test.flag", None, "a test flag", parse_optional_bool, "true, false or null",
                        legacy=("distributed.comm.ucx.nvlink",))


def settings(*extra):
    options = [*CORE_OPTIONS, TRANSPORT_FLAG, *extra]
    register_defaults(options)
    return Settings(options)


def test_defaults_come_from_the_yaml_file():
    load_dask_config()
    s = settings()
    assert s.get("gpudask.plugins.disable").value == [] and s.get("gpudask.plugins.disable").source == "default"
    assert dask.config.get("gpudask.plugins.autoload") is True


def test_dask_env_variables_reach_gpudask_keys(monkeypatch):
    monkeypatch.setenv("DASK_GPUDASK__TEST__FLAG", "True")
    dask.config.refresh()
    try:
        setting = settings().get("gpudask.test.flag")
        assert setting.value is True and setting.source == "$DASK_GPUDASK__TEST__FLAG" and setting.explicit
    finally:
        monkeypatch.delenv("DASK_GPUDASK__TEST__FLAG")
        dask.config.refresh()


def test_toml_file_in_working_directory_is_merged(tmp_path):
    (tmp_path / "gpudask.toml").write_text('[plugins]\ndisable = ["rmm"]\n')
    load_dask_config()
    try:
        s = settings().get("gpudask.plugins.disable")
        assert s.value == ["rmm"] and s.source.startswith("gpudask.toml")
    finally:
        dask.config.refresh()


def test_toml_named_by_env_and_namespaced_tables(tmp_path, monkeypatch):
    path = tmp_path / "elsewhere.toml"
    path.write_text('[gpudask.plugins]\nenable = ["tcp"]\n[distributed.comm.ucx]\nnvlink = false\n')
    monkeypatch.setenv("GPUDASK_CONFIG", str(path))
    load_dask_config()
    try:
        s = settings()
        assert s["gpudask.plugins.enable"] == ["tcp"]
        flag = s.get("gpudask.test.flag")
        assert flag.value is False and flag.source == "legacy key distributed.comm.ucx.nvlink"
    finally:
        dask.config.refresh()


def test_environment_beats_toml(tmp_path, monkeypatch):
    (tmp_path / "gpudask.toml").write_text('[test]\nflag = false\n')
    monkeypatch.setenv("DASK_GPUDASK__TEST__FLAG", "true")
    load_dask_config()
    try:
        assert settings()["gpudask.test.flag"] is True
    finally:
        monkeypatch.delenv("DASK_GPUDASK__TEST__FLAG")
        dask.config.refresh()


def test_missing_config_file_named_by_env_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUDASK_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match=r"GPUDASK_CONFIG=.*nope.toml: no such file"):
        load_dask_config()


def test_broken_toml_names_the_file(tmp_path):
    (tmp_path / "gpudask.toml").write_text("[plugins\n")
    with pytest.raises(ConfigError, match=r"gpudask.toml: not a valid TOML file"):
        load_dask_config()


def test_legacy_key_is_used_only_when_gpudask_key_is_unset():
    with dask.config.set({"distributed.comm.ucx.nvlink": True}):
        s = settings().get("gpudask.test.flag")
        assert s.value is True and s.source == "legacy key distributed.comm.ucx.nvlink"
    with dask.config.set({"distributed.comm.ucx.nvlink": True, "gpudask.test.flag": False}):
        assert settings()["gpudask.test.flag"] is False


def test_bad_value_names_key_value_source_and_accepted_form():
    with dask.config.set({"gpudask.test.flag": "maybe"}):
        with pytest.raises(ConfigError) as info:
            settings().get("gpudask.test.flag")
    assert str(info.value) == ("gpudask.test.flag = 'maybe' (from dask config) is not valid; "
                               "accepted: true, false or null (auto)")


def test_unknown_keys_warn_with_did_you_mean():
    with dask.config.set({"gpudask.plugins.disabel": ["x"]}):
        msgs = settings().unknown_keys()
    assert msgs == ["unknown gpudask setting 'gpudask.plugins.disabel' (from dask config); "
                    "did you mean 'gpudask.plugins.disable'?"]


@pytest.mark.process
def test_cli_reports_a_bad_value_in_one_line(tmp_path):
    (tmp_path / "gpudask.toml").write_text('[plugins]\nautoload = "sometimes"\n')
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "gpudask.plugins.autoload = 'sometimes'" in lines[0]
    assert "gpudask.toml" in lines[0] and "accepted: true or false" in lines[0]


@pytest.mark.process
def test_config_command_lists_every_option_with_its_source(tmp_path):
    (tmp_path / "gpudask.toml").write_text('[plugins]\ndisable = ["nvlink"]\n')
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "config", "--json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    rows = {r["key"]: r for r in json.loads(out.stdout)}
    assert rows["gpudask.plugins.disable"]["value"] == ["nvlink"]
    assert rows["gpudask.plugins.disable"]["source"].startswith("gpudask.toml")
    assert all(r["doc"] for r in rows.values()), "every option carries a description"


def test_a_section_given_one_value_is_refused_with_its_keys():
    from conftest import host, plan_on

    with pytest.raises(ConfigError, match=r"gpudask.rmm = 5 \(from dask config\) is not valid: it is a section of "
                                          r"settings; accepted: its keys allocator, .*pool-size"):
        plan_on(host("h200-single.json"), "ucx", **{"gpudask.rmm": 5})


def test_an_unknown_protocol_is_refused_with_the_known_ones():
    from conftest import host, plan_on

    with pytest.raises(ConfigError, match=r"protocol 'foo' is not valid; accepted: .*tcp.*ucx"):
        plan_on(host("h200-single.json"), "foo")


TYPO = "unknown gpudask setting 'gpudask.rmm.poolsize' (from $DASK_GPUDASK__RMM__POOLSIZE); did you mean " \
       "'gpudask.rmm.pool-size'?"


@pytest.mark.process
def test_a_setting_typo_is_one_gpudask_warning_line_in_the_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env=base_env(DASK_GPUDASK__RMM__POOLSIZE="1GB"))
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [f"gpudask: warning: {TYPO}"]  # no UserWarning, no source line


@pytest.mark.process
def test_a_setting_typo_is_said_once_in_a_dask_worker_log(cluster):
    cluster.scheduler("--preload", "gpudask")
    cluster.worker("--preload", "gpudask", "--nworkers", "2", env=base_env(DASK_GPUDASK__RMM__POOLSIZE="1GB"))
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
    log = cluster.log("worker")
    assert log.count(TYPO) == 1 and f"gpudask: warning: {TYPO}" in log and "UserWarning" not in log, log

"""The plugin's decision for described hosts, its fact on this host and its schema: through
``gpudask.testing`` and ``gpudask.pluginapi`` only."""

from __future__ import annotations

import json

import pytest

import gpudask_gds as plugin
from gpudask.pluginapi import GpudaskError
from gpudask.testing import facts_file, plan_for

LOADED = {"nvidia_fs": "2.17.5", "cufile_json": "/etc/cufile.json"}


@pytest.mark.parametrize("gds, mode", [(LOADED, "OFF"), ({"nvidia_fs": None, "cufile_json": None}, "ON")])
def test_each_gpu_worker_gets_the_mode_its_host_allows(tmp_path, gds, mode):
    host = plan_for(facts_file(tmp_path, "dgx-8gpu-nvswitch-4ib", sections={"gds": gds}), "ucx", 2, plugins=[plugin])
    for worker in host.workers:
        assert worker.env["KVIKIO_COMPAT_MODE"] == mode
        assert any(r.plugin == "gds" and r.decision == f"KVIKIO_COMPAT_MODE={mode}" for r in worker.reasons)
    assert host.facts.section("gds") == gds
    assert json.loads(json.dumps(host.to_dict()))["facts"]["sections"]["gds"] == gds  # published with the facts
    assert "KVIKIO_COMPAT_MODE" not in host.scheduler.env


def test_a_host_that_does_not_say_gets_no_mode():
    host = plan_for("dgx-8gpu-nvswitch-4ib", "ucx", 1, plugins=[plugin])
    assert host.facts.section("gds") is None and "KVIKIO_COMPAT_MODE" not in host.workers[0].env
    assert any(r.plugin == "gds" and r.decision == "KVIKIO_COMPAT_MODE not set" for r in host.workers[0].reasons)


def test_a_malformed_section_is_refused_in_one_line_naming_the_key(tmp_path):
    path = facts_file(tmp_path, "single-gpu", sections={"gds": {"nvidia_fs": 2, "cufile_json": None}})
    with pytest.raises(GpudaskError) as info:
        plan_for(path, "ucx", plugins=[plugin])
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}: key 'sections.gds.nvidia_fs' must be the nvidia-fs driver")
    assert text.endswith("got 2 (facts section of plugin 'gds')")


def test_the_probe_reads_procfs_and_the_cufile_variable(tmp_path, monkeypatch):
    version = tmp_path / "version"
    version.write_text("version: 2.17.5\n")
    monkeypatch.setattr(plugin, "NVIDIA_FS", version)
    monkeypatch.setenv("CUFILE_ENV_PATH_JSON", "/opt/cufile.json")
    assert plugin.probe(None) == {"nvidia_fs": "2.17.5", "cufile_json": "/opt/cufile.json"}  # type: ignore[arg-type]
    monkeypatch.setattr(plugin, "NVIDIA_FS", tmp_path / "absent")
    assert plugin.probe(None)["nvidia_fs"] is None  # type: ignore[arg-type]

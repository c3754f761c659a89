"""The planner's own rules, with small in-test plugins (the built-ins have their own tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from conftest import host

from gpudask import hookimpl
from gpudask.config import CORE_OPTIONS, Option, Settings
from gpudask.facts import load_facts
from gpudask.plugin.manager import PluginManager
from gpudask.plan import PlanInputs, build_plan


def plugin(name, priority, **hooks):
    mod = types.SimpleNamespace(name=name, priority=priority)
    for hook_name, fn in hooks.items():
        setattr(mod, hook_name, hookimpl(fn))
    return mod


def manager(*plugins):
    m = PluginManager()
    for p in plugins:
        m.register(p)
    return m


A = plugin("a", 10, gpudask_select_transport=lambda plan: plan.add_ucx_transport("tcp", "always"))
B = plugin("b", 20, gpudask_select_transport=lambda plan: plan.add_ucx_transport("cuda_copy", "gpu"))
ENV = plugin("c", 30, gpudask_plan_process=lambda plan: plan.set_env("UCX_MAX_RNDV_RAILS", "1", "ib"))


def plan(protocol="ucx", user_env=None, *plugins, facts="hgx-4gpu-2ib.json", nworkers=None, interface=None):
    inputs = PlanInputs(load_facts(host(facts)), Settings(CORE_OPTIONS), manager(*plugins), dict(user_env or {}))
    return build_plan(inputs, protocol, nworkers, user_interface=interface)


def test_ucx_tls_is_composed_from_every_contribution():
    w = plan("ucx", {}, A, B).workers[0]
    assert w.env["UCX_TLS"] == "tcp,cuda_copy"
    (reason,) = [r for r in w.reasons if r.decision.startswith("UCX_TLS=")]
    assert reason.plugin == "gpudask" and "a, b" in reason.why


def test_no_ucx_tls_without_ucx():
    assert "UCX_TLS" not in plan("tcp", {}, A, B).workers[0].env


def test_ucx_tls_from_the_environment_wins_and_the_reason_says_so():
    w = plan("ucx", {"UCX_TLS": "tcp,sm"}, A, B).workers[0]
    assert w.env["UCX_TLS"] == "tcp,sm"
    assert any("explicit settings win" in r.why and "tcp,cuda_copy" in r.why for r in w.reasons)


def test_any_variable_the_user_exported_wins():
    w = plan("ucx", {"UCX_MAX_RNDV_RAILS": "2"}, ENV).workers[0]
    assert w.env["UCX_MAX_RNDV_RAILS"] == "2"
    assert w.reasons[-1].decision == "UCX_MAX_RNDV_RAILS=2" and "detection chose 1" in w.reasons[-1].why


IFACE = plugin("d", 40, gpudask_select_transport=lambda plan: plan.set_interface("ib0", "nearest port"))


def test_a_worker_interface_given_on_the_command_line_wins():
    h = plan("ucx", {}, IFACE, interface="eth0")
    w = h.workers[0]
    assert w.interface == "eth0"
    assert w.reasons[-1].plugin == "gpudask" and "explicit settings win; detection chose ib0" in w.reasons[-1].why
    assert h.nanny.interface == "ib0"  # only workers take `dask worker --interface`
    assert plan("ucx", {}, IFACE).workers[0].interface == "ib0"


def test_default_worker_count_is_one_per_visible_gpu():
    assert plan("tcp", {}).nworkers == 4
    assert plan("tcp", {}, facts="no-gpu.json").nworkers == 1
    assert plan("tcp", {}, facts="subset-visible.json").nworkers == 2


def test_planning_has_no_side_effects():
    before = dict(os.environ)
    plan("ucx", {}, A, B, ENV)
    assert dict(os.environ) == before


@pytest.mark.process
def test_info_json_has_the_design_shape():
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--facts", host("hgx-4gpu-2ib.json"),
                          "--protocol", "ucx", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["protocol"] == "ucx" and data["facts"]["hostname"] == "hgx4"
    assert {"name", "priority", "source"} <= set(data["plugins"][0])
    assert set(data["scheduler"]) >= {"env", "config"}
    assert len(data["workers"]) == 4
    for w in data["workers"]:
        assert set(w) >= {"index", "gpu", "cuda_visible_devices", "env", "config", "interface", "cpu_affinity",
                          "sections", "multiprocessing_method", "reasons"}
        assert all(set(r) == {"plugin", "decision", "why"} for r in w["reasons"])


@pytest.mark.process
def test_info_table_and_bad_facts_file(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--facts", host("hgx-4gpu-2ib.json")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "host hgx4 (described by" in out.stdout
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": 2}')
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--facts", str(bad)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert str(bad) in out.stderr and "is missing" in out.stderr


@pytest.mark.process
def test_replanning_after_apply_ignores_what_gpudask_itself_applied():
    """The nanny host applies nvlink=False for itself; a plan built later in that process
    (another nanny, a worker index past the first plan) must still give workers cuda_ipc."""
    code = ("from gpudask.apply import process as session\n"
            "session.start('nanny', protocol='ucx', nworkers=2)\n"
            "import dask; assert dask.config.get('distributed-ucxx.nvlink') is False\n"
            "print(session.plan_host('ucx', 2).workers[0].env['UCX_TLS'])")
    env = {"PATH": "/usr/bin:/bin", "GPUDASK_FACTS": host("hgx-4gpu-2ib.json")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "rc,tcp,cuda_copy,cuda_ipc"


def test_cuda_visible_devices_without_any_gpu_plans_a_cpu_host_with_one_warning(monkeypatch):
    """A login node or a container without GPUs, CUDA_VISIBLE_DEVICES still exported (issue 11)."""
    from click.testing import CliRunner

    from gpudask import facts
    from gpudask.cli import main

    probed = load_facts(host("no-gpu.json")).to_dict()  # what a probe finds there: no GPU
    monkeypatch.setenv("GPUDASK_PROBED_FACTS", json.dumps(probed))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.delenv("GPUDASK_FACTS", raising=False)
    facts.clear_cache()
    try:
        result = CliRunner().invoke(main, ["info", "--json", "--nworkers", "2"])
    finally:
        facts.clear_cache()
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert [w["gpu"] for w in info["workers"]] == [None, None]
    assert all("CUDA_VISIBLE_DEVICES" not in w["env"] for w in info["workers"])
    nvml = [w for w in info["warnings"] if "NVML sees no GPU" in w]
    assert len(nvml) == 1 and "CUDA_VISIBLE_DEVICES=0,1 is set" in nvml[0] and "\n" not in nvml[0]


def test_cuda_visible_devices_exported_with_a_facts_file_is_said_to_be_ignored():
    p = plan("tcp", {"CUDA_VISIBLE_DEVICES": "3"}, facts="hgx-4gpu-2ib.json")
    (warning,) = [w for w in p.warnings if "CUDA_VISIBLE_DEVICES" in w]
    assert "CUDA_VISIBLE_DEVICES=3 in the environment is ignored" in warning and "hgx-4gpu-2ib.json" in warning
    assert not [w for w in plan("tcp", {}, facts="hgx-4gpu-2ib.json").warnings if "CUDA_VISIBLE_DEVICES" in w]


def test_the_plan_context_is_a_frozen_snapshot():
    import dataclasses

    import pytest

    env = {"UCX_TLS": "tcp"}
    p = plan("ucx", env)
    env["UCX_TLS"] = "changed"
    assert p.ctx.user_env["UCX_TLS"] == "tcp"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.ctx.protocol = "tcp"  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.ctx.user_env["UCX_TLS"] = "x"  # type: ignore[index]


# ------------------------------------------------------------- reading settings (ctx.value / ctx.require)
LEVEL = "gpudask.probe.level"


def _with_level(*plugins, config=None):
    options = [*CORE_OPTIONS, Option(LEVEL, 1, "how deep", int, "an integer")]
    settings = Settings(options, config=config if config is not None else {"gpudask": {"probe": {"level": "3"}}})
    inputs = PlanInputs(load_facts(host("hgx-4gpu-2ib.json")), settings, manager(*plugins), {})
    return build_plan(inputs, "tcp", 1)


def test_a_plugin_reads_a_declared_option_through_the_typed_accessors():
    seen = []

    def read(ctx):
        setting = ctx.require(LEVEL)
        seen.append((ctx.value(LEVEL), setting.value, setting.source, setting.explicit, ctx.setting("gpudask.no.such")))

    _with_level(plugin("probe", 50, gpudask_validate=read))
    _with_level(plugin("probe", 50, gpudask_validate=read), config={})
    assert seen == [(3, 3, "dask config", True, None), (1, 1, "default", False, None)]


@pytest.mark.parametrize("key, hint", [
    ("gpudask.probe.levle", "did you mean 'gpudask.probe.level'?"),
    ("gpudask.zzz.qqq", "is the plugin that declares it disabled?"),
])
def test_requiring_an_option_no_plugin_declares_is_one_line_naming_plugin_hook_and_key(key, hint):
    from gpudask.errors import PluginError

    for read in (lambda ctx: ctx.value(key), lambda ctx: ctx.require(key)):
        with pytest.raises(PluginError) as info:
            _with_level(plugin("probe", 50, gpudask_validate=read))
        assert str(info.value) == (f"gpudask plugin 'probe' failed in gpudask_validate: no loaded plugin declares "
                                   f"the option {key!r}; {hint}")

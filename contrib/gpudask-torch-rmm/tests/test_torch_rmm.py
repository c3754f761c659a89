"""gpudask-torch-rmm: the decision for described hosts, and what the worker hook does.

Runs without a GPU: hosts are described by facts files (schema 2), the plugin is loaded
next to gpudask's built-in plugins exactly as the entry point would load it.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

import gpudask_torch_rmm as plugin


def _facts(tmp_path, gpus=2, **packages):
    pkgs = {"distributed": "2026.7.1", "dask": "2026.7.1", "rmm": "26.10.0", "torch": "2.9.0", "cupy": "14.2.0"}
    pkgs.update(packages)
    data = {
        "schema": 2, "hostname": "test-host", "cpu_count": 16,
        "driver_version": "580.1" if gpus else None, "cuda_driver_version": 13000 if gpus else None,
        "gpus": [{"index": i, "uuid": f"GPU-0000000{i}-0000-0000-0000-000000000000", "name": "NVIDIA Test",
                  "memory_total": 16 * 2**30, "compute_capability": [9, 0], "pci_bus_id": None, "pci_path": None,
                  "numa_node": None, "cpu_affinity": list(range(8 * i, 8 * i + 8)),
                  "mig": {"enabled": False, "instances": []}} for i in range(gpus)],
        "net_interfaces": {"lo": ["127.0.0.1"]}, "cuda_visible_devices": None,
        "sections": {"nvlink": {"peers": {}}, "infiniband": {"ports": []},
                     "ucx_info": {"transports": ["self", "tcp", "cuda_copy"]}}, "packages": pkgs,
    }
    path = tmp_path / f"host-{gpus}-{abs(hash(json.dumps(pkgs, sort_keys=True)))}.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """The installed copy of this plugin is not loaded twice; dask config is restored."""
    import dask.config

    monkeypatch.setenv("GPUDASK_DISABLE_PLUGIN_AUTOLOAD", "1")
    for name in [n for n in __import__("os").environ if n.startswith(("GPUDASK_FACTS", "DASK_GPUDASK__"))]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    saved = copy.deepcopy(dask.config.config)
    plugin._RESULT = None
    yield
    plugin._RESULT = None
    dask.config.config.clear()
    dask.config.config.update(saved)


def _plan(facts_path=None, nworkers=None):
    from gpudask.apply.process import plan_host

    return plan_host("tcp", nworkers, facts_path=facts_path, extra_plugins=[plugin])


def _reasons(plan):
    """The plugin's decision lines (its request to rmm is checked on its own)."""
    return [r for r in plan.reasons if r.plugin == "torch-rmm" and not r.decision.startswith("asks rmm")]


def test_gpu_host_with_torch_and_rmm_points_torch_at_rmm(tmp_path):
    host = _plan(_facts(tmp_path))
    assert [p["name"] for p in host.plugins if p["name"] == "torch-rmm"] == ["torch-rmm"]
    assert [p["priority"] for p in host.plugins if p["name"] == "torch-rmm"] == [110]
    for worker in host.workers:
        (reason,) = _reasons(worker)
        assert reason.decision == plugin.DECISION
        assert "torch 2.9.0 and rmm 26.10.0" in reason.why
        # rmm learns it through the plan: a request, not a setting of this plugin
        assert worker.requests == {"rmm": {"torch-rmm": {"allocates_through": ["torch"]}}}
        assert worker.sections.get("rmm", {}).get("maximum_pool_size") is None  # never capped for PyTorch
    for other in (host.scheduler, host.nanny, host.client):
        assert _reasons(other) == [] and other.requests == {}


def test_ordered_after_the_rmm_pool(tmp_path):
    host = _plan(_facts(tmp_path))
    names = [p["name"] for p in host.plugins]
    assert names.index("rmm") < names.index("torch-rmm")


@pytest.mark.parametrize("gpus, packages, why", [
    (0, {}, "no GPU visible"),
    (2, {"torch": None}, "torch not installed on this host"),
    (2, {"rmm": None}, "rmm not installed on this host"),
])
def test_skipped_with_a_reason(tmp_path, gpus, packages, why):
    host = _plan(_facts(tmp_path, gpus, **packages))
    for worker in host.workers:
        (reason,) = _reasons(worker)
        assert (reason.decision, reason.why) == ("skipped", why)


def test_turned_off_by_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DASK_GPUDASK__TORCH_RMM__ENABLED", "false")
    (reason,) = _reasons(_plan(_facts(tmp_path)).workers[0])
    assert reason.decision == "skipped"
    assert reason.why == "gpudask.torch-rmm.enabled is false (from $DASK_GPUDASK__TORCH_RMM__ENABLED)"


def test_turned_off_by_gpudask_toml(tmp_path):
    (tmp_path / "gpudask.toml").write_text("[torch-rmm]\nenabled = false\n")
    (reason,) = _reasons(_plan(_facts(tmp_path)).workers[0])
    assert reason.decision == "skipped" and "gpudask.toml" in reason.why


def test_defers_to_the_rmm_plugin_when_it_already_points_torch(tmp_path):
    (tmp_path / "gpudask.toml").write_text("[rmm]\npool-size = \"1GB\"\nlibraries = [\"cupy\", \"torch\"]\n")
    (reason,) = _reasons(_plan(_facts(tmp_path)).workers[0])
    assert reason.decision == "skipped" and "gpudask.rmm.libraries" in reason.why


def test_worker_hook_on_a_described_host_changes_nothing(tmp_path):
    host = _plan(_facts(tmp_path))
    result = plugin.gpudask_setup_memory(host.ctx, host.workers[0])
    assert result["torch_allocator"] == "default"
    assert result["why"].startswith("host described by ")
    assert "torch" not in sys.modules  # never imported for a described host
    again = plugin.gpudask_setup_memory(host.ctx, host.workers[0])
    assert again["already_set_up"] and again["torch_allocator"] == "default"


def test_worker_hook_on_this_machine(tmp_path):
    """Probed facts: on a machine without a GPU (CI) the hook says so."""
    host = _plan()
    on, why = plugin.decide(host.ctx, host.workers[0])
    result = plugin.gpudask_setup_memory(host.ctx, host.workers[0])
    if not host.facts.visible_gpus():
        assert (on, why) == (False, "no GPU visible")
        assert result == {"torch_allocator": "default", "why": "no GPU visible", "pid": result["pid"]}


def test_unknown_setting_value_is_a_clear_error(tmp_path, monkeypatch):
    from gpudask.errors import ConfigError

    monkeypatch.setenv("DASK_GPUDASK__TORCH_RMM__ENABLED", "sometimes")
    with pytest.raises(ConfigError, match=r"gpudask.torch-rmm.enabled = 'sometimes'.*accepted: true or false"):
        _plan(_facts(tmp_path))


@pytest.mark.gpu
def test_real_gpu_torch_allocates_from_rmm():
    pytest.importorskip("torch")
    pytest.importorskip("rmm")
    try:
        import pynvml

        pynvml.nvmlInit()
        if not pynvml.nvmlDeviceGetCount():
            pytest.skip("no GPU")
    except Exception:
        pytest.skip("no GPU")
    code = """if True:
        import gpudask_torch_rmm as plugin
        from gpudask.apply.process import plan_host
        host = plan_host("tcp", 1, extra_plugins=[plugin])
        result = plugin.gpudask_setup_memory(host.ctx, host.workers[0])
        assert result["torch_allocator"] == "rmm", result
        import rmm, torch
        stats = rmm.mr.StatisticsResourceAdaptor(rmm.mr.get_current_device_resource())
        rmm.mr.set_current_device_resource(stats)
        x = torch.ones(1 << 20, device="cuda")
        counts = stats.allocation_counts  # an object in rmm >= 25.x, a dict before
        current = counts.current_bytes if hasattr(counts, "current_bytes") else counts["current_bytes"]
        assert current >= 4 << 20, counts
        print("OK")
    """
    env = {**__import__("os").environ, "GPUDASK_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr

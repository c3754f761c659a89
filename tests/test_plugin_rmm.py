"""The built-in `rmm` plugin: size parsing, validation, defaults, where pools are (not) built.

Plans are built for described hosts (tests/hosts) on this CPU machine.  Where a test needs
UCX over NVLink or InfiniBand regardless of how far the transport plugins are, a small
in-test transport plugin stands in for them (it contributes what the nvlink/infiniband
plugins contribute on such hosts); everything else is the real plugin.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import types

import dask.config
import pytest
from conftest import base_env, host

from gpudask import hookimpl
from gpudask.config import Option, Settings, parse_bool
from gpudask.errors import ConfigError, GpudaskError
from gpudask.facts import facts_from_dict, load_facts
from gpudask.plugin.manager import PluginManager
from gpudask.plan import ProcessPlan
from gpudask.plan import PlanInputs, build_plan
from gpudask.plugins import gpu_pinning
from gpudask.plugins.rmm import plugin as rmm_plugin
from gpudask.plugins.rmm import setup as rmm_setup

H200 = 150754820096  # tests/hosts/h200-single.json
RTX = 25757220864  # tests/hosts/single-gpu.json
POOL_KEYS = ("distributed-ucxx.rmm.pool-size", "distributed.rmm.pool-size")


# --------------------------------------------------------------------------- helpers
def fabric(*transports: str, roles=("worker",)):
    """An in-test transport plugin: UCX over these transports in the given plans."""

    def select(ctx, plan):
        if ctx.uses_ucx and plan.role in roles and ctx.gpus:
            for t in transports:
                plan.add_ucx_transport(t, "test fabric")

    return types.SimpleNamespace(name="test-fabric", priority=60, gpudask_select_transport=hookimpl(select))


def nested(flat: dict) -> dict:
    out: dict = {}
    dask.config.set(flat, config=out)  # dotted keys into a fresh dict, the global config untouched
    return out


def make(facts="h200-single.json", protocol="ucx", config=None, env=None, *extra, nworkers=None):
    """The host plan with the rmm and gpu-pinning plugins (and extra ones) for a described host."""
    env = dict(env or {})
    cfg = nested(config or {})
    dask.config.update(cfg, dask.config.collect_env(env), priority="new")
    m = PluginManager()
    m.register(rmm_plugin)
    m.register(gpu_pinning)  # each worker on its own GPU, as in a real plan
    for p in extra:
        m.register(p)
    settings = Settings(m.config_options(), config=cfg, environ=env)
    settings.validate_all()
    facts_obj = load_facts(host(facts)) if isinstance(facts, str) else facts
    return build_plan(PlanInputs(facts_obj, settings, m, env, cfg), protocol, nworkers)


def worker(*args, **kwargs) -> ProcessPlan:
    return make(*args, **kwargs).workers[0]


def error(*args, **kwargs) -> str:
    with pytest.raises(GpudaskError) as e:
        make(*args, **kwargs)
    message = str(e.value)
    assert "\n" not in message
    return message


def described(tmp_path, base="h200-single.json", **packages) -> object:
    data = json.loads(pathlib.Path(host(base)).read_text())
    data["packages"].update(packages)
    path = tmp_path / "host.json"
    path.write_text(json.dumps(data))
    return facts_from_dict(data, str(path))


def reason(plan: ProcessPlan, prefix: str) -> str:
    found = [r.why for r in plan.reasons if r.plugin == "rmm" and r.decision.startswith(prefix)]
    assert found, [r.to_dict() for r in plan.reasons]
    return found[-1]


# --------------------------------------------------------------------------- sizes
@pytest.mark.parametrize("value, expected", [
    ("4GB", 4_000_000_000), ("4GiB", 2**32), ("4 GB", 4_000_000_000), ("1e3MB", 1_000_000_000),
    (4e9, 4_000_000_000), (4_000_000_000, 4_000_000_000), ("4000000000", 4_000_000_000),
    (0.5, 0.5), ("0.5", 0.5), ("50%", 0.5), (1, 1.0), ("1", 1.0),
    (None, None), ("auto", None), (False, False), ("off", False), (0, False), ("0", False),
])
def test_pool_size_forms(value, expected):
    parsed = rmm_plugin.parse_pool_size(value)
    assert parsed == expected and type(parsed) is type(expected)


@pytest.mark.parametrize("value", ["-1GB", -0.5, -4, "foo", "4 bananas", "150%", "x%", True, [1], float("nan"),
                                   float("inf")])
def test_malformed_or_negative_sizes_are_one_line_errors_naming_key_and_value(value):
    with pytest.raises(ConfigError) as e:
        make(config={"gpudask.rmm.pool-size": value})
    message = str(e.value)
    assert message.startswith("gpudask.rmm.pool-size = ") and repr(value) in message
    assert "accepted:" in message and "\n" not in message


def test_negative_sizes_say_so():
    with pytest.raises(ConfigError, match="non-negative"):
        make(config={"gpudask.rmm.maximum-pool-size": "-4GB"})


@pytest.mark.parametrize("value, nbytes", [
    (0.5, H200 // 2), ("0.5", H200 // 2), ("4GB", 4_000_000_000), ("4GiB", 2**32),
    ("1000001", 1000001 // 256 * 256), (0.3, int(0.3 * H200) // 256 * 256), ("50%", H200 // 2),
])
def test_sizes_resolve_to_bytes_rounded_down_to_256(value, nbytes):
    memory = worker(config={"gpudask.rmm.pool-size": value}).sections.get("rmm")
    assert memory["allocator"] == "pool" and memory["initial_pool_size"] == nbytes
    assert nbytes % 256 == 0


def test_environment_variable_fraction_is_a_float_and_works():
    env = {"DASK_GPUDASK__RMM__POOL_SIZE": "0.5"}
    assert dask.config.collect_env(env) == {"gpudask": {"rmm": {"pool_size": 0.5}}}  # dask's literal_eval
    w = worker(env=env)
    assert w.sections.get("rmm")["initial_pool_size"] == H200 // 2 // 256 * 256
    assert "$DASK_GPUDASK__RMM__POOL_SIZE" in reason(w, "memory:")


def test_environment_variable_bytes_and_fraction_strings():
    assert worker(env={"DASK_GPUDASK__RMM__POOL_SIZE": "4GiB"}).sections.get("rmm")["initial_pool_size"] == 2**32
    assert worker(env={"DASK_GPUDASK__RMM__POOL_SIZE": "'0.25'"}).sections.get("rmm")["initial_pool_size"] == H200 // 4


def test_fraction_of_a_mig_instance_is_of_the_instance():
    w = worker("mig.json", config={"gpudask.rmm.pool-size": 0.5})
    instance = 21072183296
    assert w.sections.get("rmm")["initial_pool_size"] == instance // 2 // 256 * 256
    assert "MIG instance" in reason(w, "memory:")


def test_mig_instance_too_small_for_the_pool_is_an_error():
    message = error("mig.json", config={"gpudask.rmm.pool-size": "30GB"})
    assert "MIG instance MIG-" in message and "larger than" in message


# --------------------------------------------------------------------------- legacy keys
def test_legacy_distributed_rmm_pool_size_is_honoured():
    w = worker(protocol="tcp", config={"distributed.rmm.pool-size": "4GB"})
    assert w.sections.get("rmm")["initial_pool_size"] == 4_000_000_000
    assert "legacy key distributed.rmm.pool-size" in reason(w, "memory:")


def test_legacy_distributed_ucxx_key_is_honoured_first():
    w = worker(config={"distributed-ucxx.rmm.pool-size": "2GB", "distributed.rmm.pool-size": "4GB"})
    assert w.sections.get("rmm")["initial_pool_size"] == 2_000_000_000


def test_gpudask_key_beats_legacy_keys():
    w = worker(config={"gpudask.rmm.pool-size": "1GB", "distributed.rmm.pool-size": "4GB"})
    assert w.sections.get("rmm")["initial_pool_size"] == 1_000_000_000


def test_legacy_environment_variable_is_honoured():
    w = worker(env={"DASK_DISTRIBUTED__RMM__POOL_SIZE": "3GB"})
    assert w.sections.get("rmm")["initial_pool_size"] == 3_000_000_000


@pytest.mark.parametrize("protocol", ["ucx", "tcp"])
def test_every_plan_unsets_distributed_ucxx_pool_keys(protocol):
    """distributed-ucxx's init_once must build no pool anywhere: not in the nanny (1472 MiB on the
    H200), not twice in a worker; gpudask builds the worker pool itself."""
    host_plan = make(protocol=protocol, config={"distributed.rmm.pool-size": "4GB"})
    for p in (host_plan.nanny, host_plan.client, *host_plan.workers):
        for key in POOL_KEYS:
            assert key in p.config and p.config[key] is None, (p.role, key)
    assert "in the nanny too" in reason(host_plan.nanny, "distributed-ucxx.rmm.pool-size=")
    assert host_plan.workers[0].sections.get("rmm")["initial_pool_size"] == 4_000_000_000
    assert host_plan.nanny.sections.get("rmm") is None and host_plan.client.sections.get("rmm") is None
    # the scheduler: distributed-ucxx's own key, honoured over UCX (init_once builds it), refused in one line over tcp
    scheduler = host_plan.scheduler
    if protocol == "ucx":
        assert scheduler.config["distributed.rmm.pool-size"] == "4GB"
        assert "distributed-ucxx.rmm.pool-size" not in scheduler.config  # ucxx falls back to the key given
        assert "set by you" in reason(scheduler, "distributed.rmm.pool-size=")
        assert scheduler.sections.get("rmm")["initial_pool_size"] == 4_000_000_000
        assert scheduler.sections.get("rmm")["built_by"] == "distributed-ucxx"
    else:
        assert scheduler.config["distributed.rmm.pool-size"] is None and scheduler.sections.get("rmm") is None
        refused = reason(scheduler, "distributed.rmm.pool-size=")
        assert "refused" in refused and "protocol tcp does not start UCX" in refused
        assert refused in host_plan.warnings and "\n" not in refused


@pytest.mark.parametrize("key", POOL_KEYS)
def test_scheduler_pool_key_from_the_environment_is_honoured(key):
    """DASK_DISTRIBUTED__RMM__POOL_SIZE (or distributed-ucxx.rmm.pool-size) given to a scheduler: kept in its plan."""
    env = {"DASK_" + key.upper().replace(".", "__").replace("-", "_"): "2GB"}
    scheduler = make(env=env).scheduler
    assert dask.config.get(key, config=nested(scheduler.config)) == "2GB"
    assert scheduler.sections.get("rmm")["initial_pool_size"] == 2_000_000_000
    assert "init_once" in reason(scheduler, "memory:")


def test_scheduler_pool_key_refused_without_a_gpu():
    host_plan = make("cpu-ib.json", config={"distributed.rmm.pool-size": "2GB"})
    assert host_plan.scheduler.config["distributed.rmm.pool-size"] is None
    [line] = [w for w in host_plan.warnings if "refused" in w]
    assert "the scheduler sees no GPU" in line and "accepted:" in line


def test_scheduler_pool_key_that_is_no_size_is_refused_in_one_line():
    message = error(config={"distributed-ucxx.rmm.pool-size": "lots"})
    assert "'lots'" in message and "distributed-ucxx.rmm.pool-size" in message and "accepted:" in message


def test_tcp_without_legacy_keys_leaves_distributed_config_alone():
    host_plan = make(protocol="tcp")
    assert all(k not in p.config for p in (host_plan.nanny, host_plan.workers[0]) for k in POOL_KEYS)


# --------------------------------------------------------------------------- defaults
@pytest.mark.parametrize("transports, named", [(("cuda_copy", "cuda_ipc"), "NVLink"), (("rc",), "InfiniBand"),
                                               (("cuda_copy", "cuda_ipc", "rc"), "NVLink (cuda_ipc) and")])
def test_pool_is_on_by_default_with_ucx_over_nvlink_or_infiniband(transports, named):
    host_plan = make("hgx-4gpu-2ib.json", "ucx", None, None, fabric(*transports))
    for w in host_plan.workers:
        assert w.sections.get("rmm")["allocator"] == "pool"
        assert w.sections.get("rmm")["initial_pool_size"] == 85520809984 // 2 // 256 * 256
        assert w.sections.get("rmm")["maximum_pool_size"] is None
        assert w.sections.get("rmm")["libraries"] == ["cupy"]
        why = reason(w, "memory:")
        assert named in why and "one mapping" in why and "default size 0.5" in why
    assert host_plan.workers[1].sections.get("rmm")["gpu"] == load_facts(host("hgx-4gpu-2ib.json")).gpus[1].uuid


def test_the_design_example_h200_default_pool():
    w = worker("h200-single.json", "ucx", None, None, fabric("cuda_ipc"))
    assert w.sections.get("rmm")["initial_pool_size"] == 75377410048 and w.sections.get("rmm")["maximum_pool_size"] is None


def test_no_pool_by_default_with_ucx_over_tcp_only():
    w = worker("single-gpu.json", "ucx", None, None, fabric("tcp", "cuda_copy"))
    assert w.sections.get("rmm") is None
    assert "no pool: UCX without NVLink or InfiniBand" in reason(w, "memory: none")


def test_no_pool_by_default_without_ucx():
    w = worker("hgx-4gpu-2ib.json", "tcp", None, None, fabric("cuda_ipc", "rc"))
    assert w.sections.get("rmm") is None and "protocol tcp" in reason(w, "memory: none")


def test_user_ucx_tls_without_nvlink_or_ib_means_no_default_pool():
    w = worker("hgx-4gpu-2ib.json", "ucx", None, {"UCX_TLS": "tcp,cuda_copy"}, fabric("cuda_ipc", "rc"))
    assert w.sections.get("rmm") is None


def test_real_plugins_pool_matches_the_transports_they_chose():
    """With whatever transport plugins are installed: a pool iff cuda_ipc or rc is in the plan."""
    m = PluginManager.from_environment()
    settings = Settings(m.config_options(), config={}, environ={})
    for facts in ("hgx-4gpu-2ib.json", "single-gpu.json", "workstation-2gpu-pcie.json"):
        host_plan = build_plan(PlanInputs(load_facts(host(facts)), settings, m), "ucx", None)
        for w in host_plan.workers:
            fast = {"cuda_ipc", "rc"} & set(w.ucx_transports) or any(t.startswith("rc") for t in w.ucx_transports)
            # (the spill plugin adds a device_memory_limit to every GPU worker: a pool has an allocator)
            assert ((w.sections.get("rmm") or {}).get("allocator") is not None) == bool(fast), (facts, w.index, w.ucx_transports)


def test_explicit_pool_without_ucx():
    w = worker(protocol="tcp", config={"gpudask.rmm.pool-size": "2GB"})
    assert w.sections.get("rmm")["initial_pool_size"] == 2_000_000_000


@pytest.mark.parametrize("off", [False, "off", 0])
def test_pool_can_be_turned_off_even_with_nvlink(off):
    w = worker("hgx-4gpu-2ib.json", "ucx", {"gpudask.rmm.pool-size": off}, None, fabric("cuda_ipc"))
    assert w.sections.get("rmm") is None and "no pool: gpudask.rmm.pool-size" in reason(w, "memory: none")


def test_allocator_pool_alone_asks_for_a_default_sized_pool():
    w = worker(protocol="tcp", config={"gpudask.rmm.allocator": "pool"})
    assert w.sections.get("rmm")["allocator"] == "pool" and w.sections.get("rmm")["initial_pool_size"] == H200 // 2


def test_maximum_alone_asks_for_a_pool_and_lowers_the_default_initial_size():
    w = worker(protocol="tcp", config={"gpudask.rmm.maximum-pool-size": "8GB"})
    assert w.sections.get("rmm")["initial_pool_size"] == 8_000_000_000 == w.sections.get("rmm")["maximum_pool_size"]


def test_default_pool_is_split_between_workers_sharing_a_gpu():
    host_plan = make("single-gpu.json", "ucx", None, None, fabric("cuda_ipc"), nworkers=2)
    sizes = [w.sections.get("rmm")["initial_pool_size"] for w in host_plan.workers]
    assert sizes == [int(RTX * 0.25) // 256 * 256] * 2
    assert "split between the 2 workers" in reason(host_plan.workers[0], "memory:")


def test_explicit_pools_of_workers_sharing_a_gpu_must_fit_together():
    message = error("single-gpu.json", "tcp", {"gpudask.rmm.pool-size": 0.6}, nworkers=2)
    assert "x 2 workers sharing it" in message and "fraction <= 0.5" in message


def test_pytorch_installed_caps_the_default_pool(tmp_path):
    facts = described(tmp_path, torch="2.9.0")
    w = worker(facts, "ucx", None, None, fabric("cuda_ipc"))
    assert w.sections.get("rmm")["maximum_pool_size"] == w.sections.get("rmm")["initial_pool_size"] == H200 // 2
    assert "PyTorch 2.9.0 is installed" in reason(w, "memory:")
    # routed through RMM: one allocator, no cap needed
    w = worker(facts, "ucx", {"gpudask.rmm.libraries": ["cupy", "torch"]}, None, fabric("cuda_ipc"))
    assert w.sections.get("rmm")["maximum_pool_size"] is None
    # a size the user chose is not capped
    w = worker(facts, "ucx", {"gpudask.rmm.pool-size": 0.7}, None, fabric("cuda_ipc"))
    assert w.sections.get("rmm")["maximum_pool_size"] is None
    # a plugin that points PyTorch at RMM asks rmm through the plan (a request made in
    # gpudask_plan_process, read by rmm in the later memory step): its priority does not matter
    for priority in (5, 500):
        torch_rmm = types.SimpleNamespace(name="torch-rmm", priority=priority, gpudask_plan_process=hookimpl(
            lambda plan: plan.request("rmm", {"allocates_through": ["torch"]}, "points PyTorch at RMM")))
        w = worker(facts, "ucx", None, None, fabric("cuda_ipc"), torch_rmm)
        assert w.sections["rmm"]["maximum_pool_size"] is None, priority
        assert w.requests == {"rmm": {"torch-rmm": {"allocates_through": ["torch"]}}}
    # a plugin that only declares the contrib plugin's setting asks nothing: rmm knows no contrib key
    declares = types.SimpleNamespace(name="torch-rmm", priority=110, gpudask_config_options=hookimpl(
        lambda: [Option("gpudask.torch-rmm.enabled", True, "doc", parse_bool)]))
    w = worker(facts, "ucx", None, None, fabric("cuda_ipc"), declares)
    assert w.sections["rmm"]["maximum_pool_size"] == w.sections["rmm"]["initial_pool_size"]


def test_no_gpu_host_skips_even_an_explicit_pool():
    host_plan = make("no-gpu.json", "tcp", {"gpudask.rmm.pool-size": "4GB"})
    w = host_plan.workers[0]
    assert w.sections.get("rmm") is None
    assert any(r.plugin == "rmm" and r.decision == "skipped" and "no GPU" in r.why for r in w.reasons)


def test_other_options_reach_the_plan(tmp_path):
    w = worker(protocol="tcp", config={
        "gpudask.rmm.pool-size": "1GB", "gpudask.rmm.maximum-pool-size": "2GB",
        "gpudask.rmm.log-directory": str(tmp_path), "gpudask.rmm.track-allocations": True,
        "gpudask.rmm.libraries": "cupy,numba"})
    m = w.sections.get("rmm")
    assert (m["initial_pool_size"], m["maximum_pool_size"]) == (1_000_000_000, 2_000_000_000)
    assert os.path.dirname(m["log_file"]) == str(tmp_path)
    assert os.path.basename(m["log_file"]).startswith("rmm-") and m["log_file"].endswith("-worker-0.log")
    assert m["track_allocations"] is True and m["libraries"] == ["cupy", "numba"]


def test_async_allocator_with_release_threshold():
    w = worker(protocol="tcp", config={"gpudask.rmm.allocator": "async", "gpudask.rmm.pool-size": "1GB",
                                       "gpudask.rmm.release-threshold": 0.25})
    assert w.sections.get("rmm")["allocator"] == "async" and w.sections.get("rmm")["release_threshold"] == H200 // 4


def test_managed_memory_pool_and_plain_managed():
    w = worker(protocol="tcp", config={"gpudask.rmm.allocator": "managed", "gpudask.rmm.pool-size": "1GB"})
    assert w.sections.get("rmm")["allocator"] == "pool" and w.sections.get("rmm")["managed_memory"] is True
    w = worker(protocol="tcp", config={"gpudask.rmm.allocator": "managed"})
    assert w.sections.get("rmm")["allocator"] == "managed" and w.sections.get("rmm")["initial_pool_size"] is None


def test_unknown_library_is_an_error():
    with pytest.raises(ConfigError, match="gpudask.rmm.libraries"):
        make(config={"gpudask.rmm.libraries": ["cupy", "tensorflow"]})


# --------------------------------------------------------------------------- errors
def test_pool_larger_than_the_gpu_names_key_value_and_gpu():
    message = error(config={"gpudask.rmm.pool-size": "200GB"})
    assert "gpudask.rmm.pool-size = '200GB'" in message and "larger than GPU 0" in message
    assert "NVIDIA H200" in message and "GPU-b2548dea" in message and "worker 0" in message


def test_a_bare_small_number_is_refused_with_the_likely_meaning():
    message = error(config={"gpudask.rmm.pool-size": "2"})  # 2 bytes: surely meant 2GB or 0.2
    assert "gpudask.rmm.pool-size = '2'" in message and "would be 2 bytes (a bare number is bytes)" in message
    assert "did you mean '2GB' or 0.2 (a fraction)?" in message
    message = error(config={"gpudask.rmm.pool-size": "100000"})  # 100 kB: still no pool anyone means
    assert "would be 100000 bytes" in message


def test_an_empty_pool_size_is_refused():
    message = error(config={"gpudask.rmm.pool-size": ""})
    assert "an empty value is none of these" in message


def test_a_large_bare_number_is_bytes():
    assert worker(config={"gpudask.rmm.pool-size": "4000000000"}).sections.get("rmm")["initial_pool_size"] == 4 * 10**9


def test_maximum_larger_than_the_gpu():
    message = error(config={"gpudask.rmm.pool-size": "1GB", "gpudask.rmm.maximum-pool-size": "151GB"})
    assert "gpudask.rmm.maximum-pool-size = '151GB'" in message and "larger than GPU 0" in message


def test_maximum_below_initial_size_settings_only():
    message = error(config={"gpudask.rmm.pool-size": "8GB", "gpudask.rmm.maximum-pool-size": "4GB"})
    assert "failed in gpudask_validate" in message and "is below" in message


def test_maximum_below_initial_size_per_gpu():
    message = error(config={"gpudask.rmm.pool-size": 0.5, "gpudask.rmm.maximum-pool-size": "4GB"})
    assert "failed in gpudask_plan_memory" in message and "is below" in message and "GPU 0" in message


def test_release_threshold_needs_async():
    message = error(config={"gpudask.rmm.pool-size": "1GB", "gpudask.rmm.release-threshold": "1GB"})
    assert "gpudask.rmm.release-threshold = '1GB'" in message and "async allocator only" in message


def test_async_with_managed_memory():
    message = error(config={"gpudask.rmm.allocator": "async", "gpudask.rmm.managed-memory": True})
    assert "'async' cannot use managed memory" in message


def test_managed_memory_with_nvlink():
    message = error("hgx-4gpu-2ib.json", "ucx", {"gpudask.rmm.allocator": "managed"}, None, fabric("cuda_ipc"))
    assert "gpudask.rmm.allocator = 'managed'" in message and "NVLink" in message and "GPU 0" in message
    message = error("hgx-4gpu-2ib.json", "ucx", {"gpudask.rmm.managed-memory": True}, None, fabric("cuda_ipc"))
    assert "gpudask.rmm.managed-memory" in message
    # managed memory over InfiniBand alone is accepted
    assert worker("hgx-4gpu-2ib.json", "ucx", {"gpudask.rmm.managed-memory": True}, None,
                  fabric("rc")).sections.get("rmm")["managed_memory"] is True


def test_default_allocator_with_a_pool_size():
    message = error(config={"gpudask.rmm.allocator": "default", "gpudask.rmm.pool-size": "1GB"})
    assert "allocator = 'default'" in message


def test_pool_allocator_turned_off():
    assert "turns the pool off" in error(config={"gpudask.rmm.allocator": "pool", "gpudask.rmm.pool-size": False})


def test_explicit_pool_without_rmm_installed_is_an_error(tmp_path):
    facts = described(tmp_path, rmm=None)
    assert "rmm is not installed" in error(facts, "tcp", {"gpudask.rmm.pool-size": "1GB"})


def test_default_pool_without_rmm_installed_warns(tmp_path):
    facts = described(tmp_path, rmm=None)
    host_plan = make(facts, "ucx", None, None, fabric("cuda_ipc"))
    assert host_plan.workers[0].sections.get("rmm") is None
    assert any("rmm is not installed" in w for w in host_plan.warnings)


@pytest.mark.process
@pytest.mark.parametrize("value", ["200GB", "-1GB", "lots"])
def test_gpudask_info_reports_a_bad_pool_in_one_line(value):
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--facts", host("h200-single.json")],
                         capture_output=True, text=True, timeout=120,
                         env=base_env(DASK_GPUDASK__RMM__POOL_SIZE=value))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("gpudask: error: ") and "gpudask.rmm.pool-size" in lines[0] and value in lines[0]
    if value == "200GB":
        assert "GPU 0 (NVIDIA H200" in lines[0]


@pytest.mark.process
def test_gpudask_info_json_shows_the_memory_plan():
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--json", "--facts",
                          host("h200-single.json")], capture_output=True, text=True, timeout=120,
                         env=base_env(DASK_GPUDASK__RMM__POOL_SIZE="0.5"))
    assert out.returncode == 0, out.stderr
    memory = json.loads(out.stdout)["workers"][0]["sections"]["rmm"]
    assert memory["allocator"] == "pool" and memory["initial_pool_size"] == 75377410048
    assert memory["maximum_pool_size"] is None


# --------------------------------------------------------------------------- scheduler pool
def test_scheduler_pool_only_when_asked_and_built_by_distributed_ucxx():
    host_plan = make(config={"gpudask.rmm.scheduler-pool-size": "1GiB"})
    s = host_plan.scheduler
    assert s.config["distributed-ucxx.rmm.pool-size"] == 2**30 and s.config["distributed.rmm.pool-size"] is None
    assert s.sections.get("rmm")["initial_pool_size"] == 2**30 and s.sections.get("rmm")["built_by"] == "distributed-ucxx"
    assert host_plan.nanny.config["distributed-ucxx.rmm.pool-size"] is None
    assert make().scheduler.sections.get("rmm") is None


def test_scheduler_pool_ignored_when_the_scheduler_ucx_has_no_cuda_transport():
    host_plan = make(config={"gpudask.rmm.scheduler-pool-size": "1GiB"}, env={"UCX_TLS": "rc,tcp"})
    assert host_plan.scheduler.sections.get("rmm") is None
    assert "has no cuda transport" in reason(host_plan.scheduler, "no scheduler pool")
    assert any("scheduler-pool-size" in w for w in host_plan.warnings)
    assert make(config={"gpudask.rmm.scheduler-pool-size": "1GiB"},
                env={"UCX_TLS": "tcp,cuda_copy"}).scheduler.sections.get("rmm")["initial_pool_size"] == 2**30


def test_scheduler_pool_ignored_without_ucx():
    s = make(protocol="tcp", config={"gpudask.rmm.scheduler-pool-size": "1GiB"}).scheduler
    assert s.sections.get("rmm") is None and "only a UCX scheduler" in reason(s, "no scheduler pool")


def test_scheduler_pool_larger_than_the_gpu():
    assert "of the scheduler" in error(config={"gpudask.rmm.scheduler-pool-size": "200GB"})


# --------------------------------------------------------------------------- apply
def test_setup_memory_on_a_described_host_allocates_nothing_and_says_so():
    host_plan = make(config={"gpudask.rmm.pool-size": 0.5})
    report = rmm_plugin.gpudask_setup_memory(host_plan.ctx, host_plan.workers[0])
    assert report["applied"] is False and "no real GPU" in report["skipped"]
    assert report["initial_pool_size"] == H200 // 2 and report["allocator"] == "pool"
    json.dumps(report)  # JSON-compatible: published in the worker's startup information
    assert rmm_setup._MR is None  # nothing built in this process


def test_setup_memory_without_a_plan_reports_none():
    host_plan = make(protocol="tcp")
    report = rmm_plugin.gpudask_setup_memory(host_plan.ctx, host_plan.workers[0])
    assert report["allocator"] is None and report["applied"] is False


# --------------------------------------------------------------------------- CPU clusters
@pytest.mark.process
@pytest.mark.parametrize("nanny", [True, False])
def test_bad_pool_size_stops_the_worker_with_the_message(cluster, nanny):
    cluster.scheduler()
    env = base_env(GPUDASK_FACTS=host("h200-single.json"), DASK_GPUDASK__RMM__POOL_SIZE="200GB")
    proc = cluster.worker("--preload", "gpudask", *([] if nanny else ["--no-nanny"]), env=env)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the worker kept running with an invalid pool size:\n" + cluster.log("worker"))
    log = cluster.log("worker")
    assert proc.returncode != 0
    assert "gpudask.rmm.pool-size = '200GB'" in log and "larger than GPU 0 (NVIDIA H200" in log, log
    with cluster.client() as client:
        assert client.scheduler_info()["workers"] == {}


@pytest.mark.process
def test_described_worker_plans_the_pool_skips_it_and_no_process_builds_another(cluster):
    """Legacy key in the environment: honoured as the worker's pool (skipped: no real GPU here),
    and unset in the nanny's and the worker's dask config, so distributed-ucxx builds none."""
    env = base_env(GPUDASK_FACTS=host("h200-single.json"), DASK_DISTRIBUTED__RMM__POOL_SIZE="4GB",
                   DASK_DISTRIBUTED__WORKER__DAEMON="False")
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--nthreads", "1", env=env)

    def pool_keys():
        import dask.config

        return [dask.config.get(k, default=None) for k in POOL_KEYS]  # missing = unset

    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        (addr, info), = client.scheduler_info()["workers"].items()
        report = info["gpudask"]["memory"]["rmm"]
        assert report["allocator"] == "pool" and report["initial_pool_size"] == 4_000_000_000
        assert report["applied"] is False and "no real GPU" in report["skipped"]
        assert client.run(pool_keys)[addr] == [None, None]
        assert list(client.run(pool_keys, nanny=True).values()) == [[None, None]]
        # the worker's own metric carries the same report
        deadline = time.time() + 30
        while time.time() < deadline:
            metric = client.scheduler_info()["workers"][addr]["metrics"].get("gpudask-rmm")
            if metric:
                break
            time.sleep(0.5)
        assert metric and metric["allocator"] == "pool" and metric["applied"] is False


# --------------------------------------------------------------------------- real GPU
def _gpu_cluster(cluster, tmp_path, *, protocol="tcp", **env):
    cluster.scheduler(protocol=protocol, env=base_env(CUDA_VISIBLE_DEVICES="", UCX_TLS="tcp"))
    cluster.worker("--preload", "gpudask", "--nworkers", "1", "--nthreads", "1", env=base_env(**env))
    client = cluster.client()
    client.wait_for_workers(1, timeout=120)
    return client


@pytest.mark.process
@pytest.mark.gpu
def test_gpu_pool_is_the_worker_allocator_and_cupy_uses_it(cluster, tmp_path):
    def probe():
        import rmm

        mr = rmm.mr.get_current_device_resource()
        chain, m = [], mr
        while m is not None:
            chain.append(type(m).__name__)
            m = getattr(m, "upstream_mr", None)
        out = {"chain": chain, "pool": None, "cupy": None}
        m = mr
        while m is not None:
            if isinstance(m, rmm.mr.PoolMemoryResource):
                out["pool"] = m.pool_size()
            m = getattr(m, "upstream_mr", None)
        try:
            import cupy

            alloc = cupy.cuda.get_allocator()
            out["cupy"] = getattr(alloc, "__name__", repr(alloc))
            cupy.arange(1000).sum()
        except ImportError:
            pass
        return out

    with _gpu_cluster(cluster, tmp_path, DASK_GPUDASK__RMM__POOL_SIZE="1GiB") as client:
        (result,) = client.run(probe).values()
        (info,) = client.scheduler_info()["workers"].values()
    assert "PoolMemoryResource" in result["chain"] and result["pool"] >= 2**30
    assert info["gpudask"]["memory"]["rmm"]["applied"] is True
    assert info["gpudask"]["memory"]["rmm"]["initial_pool_size"] == 2**30
    if result["cupy"] is not None:
        assert result["cupy"] == "rmm_cupy_allocator"


@pytest.mark.process
@pytest.mark.gpu
def test_gpu_log_file_appears(cluster, tmp_path):
    logs = tmp_path / "rmm-logs"

    def allocate():
        import rmm

        rmm.DeviceBuffer(size=1 << 20)
        rmm.mr.get_current_device_resource()
        return True

    with _gpu_cluster(cluster, tmp_path, DASK_GPUDASK__RMM__POOL_SIZE="256MiB",
                      DASK_GPUDASK__RMM__LOG_DIRECTORY=str(logs)) as client:
        client.run(allocate)
        (info,) = client.scheduler_info()["workers"].values()
    files = list(logs.glob("rmm-*-worker-0*.log"))
    assert files, list(logs.iterdir()) if logs.exists() else "no log directory"
    assert info["gpudask"]["memory"]["rmm"]["log_file"] == str(files[0])


@pytest.mark.process
@pytest.mark.gpu
def test_gpu_second_setup_reports_and_does_not_rebuild(cluster, tmp_path):
    def again():
        import rmm

        from gpudask.apply import process as session

        s = session.current()
        before = rmm.mr.get_current_device_resource()
        report = session.setup_memory(s.manager, s.ctx, s.plan)["rmm"]
        return report, s.memory["rmm"], rmm.mr.get_current_device_resource() is before

    with _gpu_cluster(cluster, tmp_path, DASK_GPUDASK__RMM__POOL_SIZE="256MiB") as client:
        ((report, first, same_resource),) = client.run(again).values()
    # the core calls the hook once per process and hands back what it kept
    assert report == first and report["applied"] is True and same_resource


@pytest.mark.process
@pytest.mark.gpu
def test_gpu_nanny_holds_no_pool(cluster, tmp_path):
    """With the legacy key set (the case that gave the nanny a 1472 MiB pool), the nanny process
    holds no pool over UCX: NVML shows no (or only a context's worth of) memory for its pid."""
    pytest.importorskip("distributed_ucxx")
    import pynvml

    pool = 2**31
    env = dict(DASK_DISTRIBUTED__RMM__POOL_SIZE=str(pool), UCX_TLS="tcp,cuda_copy")
    with _gpu_cluster(cluster, tmp_path, protocol="ucx", **env) as client:
        (worker_pid,) = client.run(os.getpid).values()
        (nanny_pid,) = client.run(os.getpid, nanny=True).values()
        pynvml.nvmlInit()
        try:
            used = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    used[p.pid] = used.get(p.pid, 0) + (p.usedGpuMemory or 0)
        finally:
            pynvml.nvmlShutdown()
    assert used.get(worker_pid, 0) >= pool  # the worker's pool
    assert used.get(nanny_pid) is None or used[nanny_pid] < pool, used  # no pool in the nanny



def test_tracking_logging_and_libraries_are_honoured_without_a_pool(tmp_path):
    w = worker(config={"gpudask.rmm.pool-size": False, "gpudask.rmm.track-allocations": True,
                       "gpudask.rmm.log-directory": str(tmp_path)})
    assert w.sections.get("rmm")["allocator"] == "default" and w.sections.get("rmm")["initial_pool_size"] is None
    assert w.sections.get("rmm")["track_allocations"] is True and w.sections.get("rmm")["log_file"].startswith(str(tmp_path))
    rmm_why = " ".join(r.why for r in w.reasons if r.plugin == "rmm")
    assert "no pool, but gpudask.rmm.track-allocations" in rmm_why and "as dask-cuda does without a pool" in rmm_why
    w = worker(config={"gpudask.rmm.pool-size": False, "gpudask.rmm.libraries": ["cupy", "numba"]})
    assert w.sections.get("rmm")["allocator"] == "default" and w.sections.get("rmm")["libraries"] == ["cupy", "numba"]
    assert worker(config={"gpudask.rmm.pool-size": False}).sections.get("rmm") is None  # nothing asked for: no RMM setup

"""The spill plugin's plan on described hosts: the device memory limit of each worker, cuDF's
own spilling, and the one-line refusals of limits that cannot work."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import base_env, described, host, plan_on

from gpudask.errors import GpudaskError

H200 = 150754820096  # tests/hosts/h200-single.json
A6000 = 51527024640  # each GPU of tests/hosts/workstation-2gpu-pcie.json
MIG_INSTANCE = 21072183296  # tests/hosts/mig.json
KEY = "gpudask.spill.device-memory-limit"


@pytest.fixture(autouse=True)
def _user_env(monkeypatch):
    for name in ("CUDA_VISIBLE_DEVICES", "CUDF_SPILL", "CUDF_SPILL_STATS", "UCX_TLS"):
        monkeypatch.delenv(name, raising=False)


def limits(host_plan) -> list:
    return [w.sections.get("spill", {}).get("device_memory_limit") for w in host_plan.workers]


def spill_reasons(plan) -> list[str]:
    return [f"{r.decision} -- {r.why}" for r in plan.reasons if r.plugin == "spill"]


def refused(facts: str, nworkers=None, protocol="tcp", **config) -> str:
    with pytest.raises(GpudaskError) as e:
        plan_on(host(facts), protocol, nworkers, **config)
    message = str(e.value)
    assert "\n" not in message and KEY in message
    return message


def test_default_is_0_8_of_each_workers_own_gpu():
    h = plan_on(host("workstation-2gpu-pcie.json"), "tcp")
    assert limits(h) == [int(0.8 * A6000)] * 2
    (line,) = spill_reasons(h.workers[1])
    assert line.startswith(f"memory: device_memory_limit={int(0.8 * A6000)} -- default 0.8 of GPU 1 (")
    assert "least recently used GPU objects move to host memory" in line


def test_workers_sharing_a_gpu_divide_it():
    h = plan_on(host("h200-single.json"), "tcp", 2)
    assert limits(h) == [int(0.8 * H200 / 2)] * 2
    assert "split between the 2 workers sharing it" in spill_reasons(h.workers[0])[0]


def test_limit_appears_in_gpudask_info_json_next_to_the_pool():
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--json", "--nworkers", "2", "--facts",
                          host("h200-single.json")], capture_output=True, text=True, timeout=120,
                         env=base_env(DASK_GPUDASK__RMM__POOL_SIZE="0.25"))
    assert out.returncode == 0, out.stderr
    for w in json.loads(out.stdout)["workers"]:
        assert w["sections"]["spill"] == {"device_memory_limit": int(0.8 * H200 / 2)}
        assert w["sections"]["rmm"]["allocator"] == "pool"  # each plugin's section beside the others


def test_without_a_pool_the_memory_plan_is_the_limit_alone():
    (w,) = plan_on(host("h200-single.json"), "tcp").workers
    assert w.sections == {"spill": {"device_memory_limit": int(0.8 * H200)},
                          "worker-memory": {"host_memory_fraction": 1.0}}  # no rmm section: no pool


@pytest.mark.parametrize("value, expected", [
    ("8GB", 8 * 10**9), ("8GiB", 8 * 2**30), ("8 GB", 8 * 10**9), (8 * 10**9, 8 * 10**9), ("8000000000", 8 * 10**9),
    (0.5, int(0.5 * H200)), ("0.5", int(0.5 * H200)), ("50%", int(0.5 * H200)), (1, H200), ("auto", int(0.8 * H200)),
    (None, int(0.8 * H200)),
])
def test_explicit_bytes_and_fractions(value, expected):
    h = plan_on(host("h200-single.json"), "tcp", **{KEY: value})
    assert limits(h) == [expected]
    if value not in ("auto", None):
        assert f"{KEY} = " in spill_reasons(h.workers[0])[0]


def test_explicit_fraction_is_of_the_whole_gpu_even_when_shared():
    h = plan_on(host("h200-single.json"), "tcp", 2, **{KEY: 0.4})
    assert limits(h) == [int(0.4 * H200)] * 2


def test_fraction_of_a_mig_instance_is_of_the_instance():
    h = plan_on(host("mig.json"), "tcp", 2, **{KEY: 0.5})  # one worker per instance
    assert limits(h) == [int(0.5 * MIG_INSTANCE)] * 2
    assert "MIG instance" in spill_reasons(h.workers[0])[0]


@pytest.mark.parametrize("off", [0, "0", False, "false", "off"])
def test_zero_or_false_turns_spilling_off(off):
    (w,) = plan_on(host("h200-single.json"), "tcp", **{KEY: off}).workers
    assert w.sections["spill"]["device_memory_limit"] is None and "rmm" not in w.sections
    assert "spilling off" in spill_reasons(w)[0]


def test_no_gpu_no_spill_plan():
    h = plan_on(host("no-gpu.json"), "tcp", **{KEY: "8GB"})
    assert all("spill" not in w.sections for w in h.workers)
    assert spill_reasons(h.workers[0]) == ["skipped -- no GPU visible: no device memory limit, nothing to spill"]


def test_only_workers_get_a_limit():
    h = plan_on(host("h200-single.json"), "tcp")
    assert all("spill" not in p.sections for p in (h.scheduler, h.client, h.nanny))


# -- refused before the worker starts ---------------------------------------------------------
@pytest.mark.parametrize("value, guess", [(8, "did you mean '8GB' or 0.8?"), ("80", "did you mean '80GB' or 0.8?"),
                                          (500, "did you mean '500GB'?")])
def test_bare_small_numbers_are_bytes_and_the_likely_meaning_is_suggested(value, guess):
    message = refused("h200-single.json", **{KEY: value})
    assert f"{KEY} = {value!r}" in message and f"is {int(value)} bytes?" in message and guess in message
    assert "a bare number is bytes" in message


@pytest.mark.parametrize("value", ["lots", "-1GB", "-0.5", "150%", [1], "nan"])
def test_bad_values_are_one_line_naming_key_value_and_what_is_accepted(value):
    message = refused("h200-single.json", **{KEY: value})
    assert f"{KEY} = {value!r}" in message and "accepted:" in message and "a fraction 0 < f <= 1" in message


def test_limit_above_the_gpu_is_refused():
    message = refused("h200-single.json", **{KEY: "200GB"})
    assert "200000000000 bytes is more than GPU 0 (NVIDIA H200" in message
    assert f"accepted: at most {H200} bytes" in message


def test_limits_of_workers_sharing_a_gpu_must_fit_together():
    message = refused("h200-single.json", 2, **{KEY: 0.8})
    assert "x 2 workers sharing it" in message and "a fraction <= 0.5" in message


def test_limit_above_a_fixed_maximum_pool_is_refused():
    message = refused("h200-single.json", **{KEY: "64GB", "gpudask.rmm.maximum-pool-size": "32GB"})
    assert "above the RMM pool's maximum size 32000000000 bytes" in message
    assert "gpudask.rmm.maximum-pool-size" in message and "accepted: at most 32000000000 bytes" in message


def test_default_limit_follows_a_smaller_maximum_pool():
    (w,) = plan_on(host("h200-single.json"), "tcp", **{"gpudask.rmm.maximum-pool-size": "32GB"}).workers
    assert w.sections["rmm"]["maximum_pool_size"] == 32 * 10**9
    assert w.sections["spill"]["device_memory_limit"] == int(0.8 * 32 * 10**9)
    assert "RMM pool's maximum size" in spill_reasons(w)[0]


def test_limit_below_a_fixed_maximum_pool_is_fine():
    (w,) = plan_on(host("h200-single.json"), "tcp", **{KEY: "16GB", "gpudask.rmm.maximum-pool-size": "32GB"}).workers
    assert w.sections["spill"]["device_memory_limit"] == 16 * 10**9


def test_gpudask_info_refuses_a_bad_limit_in_one_line():
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--facts", host("h200-single.json")],
                         capture_output=True, text=True, timeout=120,
                         env=base_env(DASK_GPUDASK__SPILL__DEVICE_MEMORY_LIMIT="8"))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr and "did you mean '8GB' or 0.8?" in lines[0]


# -- cuDF's own spilling ------------------------------------------------------------------------
def test_cudf_spilling_sets_cudf_spill_everywhere_it_matters_and_the_device_tier_stands_aside():
    h = plan_on(host("workstation-2gpu-pcie.json"), "tcp", **{"gpudask.spill.cudf": True,
                                                               "gpudask.spill.cudf-stats": 1})
    for p in (h.scheduler, h.client, *h.workers):
        assert p.env["CUDF_SPILL"] == "1" and p.env["CUDF_SPILL_STATS"] == "1", p.role
    assert "CUDF_SPILL" not in h.nanny.env
    assert limits(h) == [None, None]
    why = " ".join(spill_reasons(h.workers[0]))
    assert "no device tier: gpudask.spill.cudf = true" in why and "would move them twice" in why
    assert any("cudf is not installed" in w for w in h.warnings)  # the described host has no cudf


def test_cudf_spill_exported_by_the_user_also_sets_the_device_tier_aside(monkeypatch):
    monkeypatch.setenv("CUDF_SPILL", "on")
    (w,) = plan_on(host("h200-single.json"), "tcp").workers
    assert w.sections["spill"]["device_memory_limit"] is None and "CUDF_SPILL=on is set" in spill_reasons(w)[0]


def test_cudf_with_cudf_installed_gives_no_warning(tmp_path):
    facts = described(tmp_path, "h200-single.json", packages={**json.load(open(host("h200-single.json")))["packages"],
                                                                "cudf": "26.10.0"})
    h = plan_on(facts, "tcp", **{"gpudask.spill.cudf": True})
    assert h.workers[0].env["CUDF_SPILL"] == "1" and not any("cudf" in w for w in h.warnings)


def test_spilling_on_by_default_without_cudf_env():
    h = plan_on(host("h200-single.json"), "tcp")
    assert all("CUDF_SPILL" not in p.env for p in (h.scheduler, h.client, *h.workers))

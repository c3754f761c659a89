"""Every way users start a cluster, planned on every described host (issue: plan for the host and
all its peers, not for one command).

A process's peers are the client, the scheduler, every worker on its host whoever started it
(this command, another ``dask worker`` command, a ``LocalGPUCluster``) and other hosts; UCX picks a
path per endpoint among the transports it is allowed.  So on every described host, for every
shape -- one command with the default worker count, one worker, one worker per GPU under
``CUDA_VISIBLE_DEVICES`` (Slurm ``--gpus-per-task=1``, dask-mpi), ``UCX_TLS=all`` exported, dask-cuda's
automatic configuration -- each GPU process (worker, relaying scheduler, client) may use CUDA IPC
unless the hardware rules it out (MIG, a UCX without cuda_ipc), and InfiniBand / rdmacm appear
only where an active port exists.
"""

from __future__ import annotations

import copy
import json
import pathlib

import dask
import pytest
from conftest import HOSTS, described, plan_on, sections_with

from gpudask.errors import GpudaskError
from gpudask.pluginapi import tls_enables

HOST_FILES = sorted(p.name for p in HOSTS.glob("*.json"))


@pytest.fixture(autouse=True)
def _user_env(monkeypatch):
    for name in ("CUDA_VISIBLE_DEVICES", "UCX_TLS", "UCX_NET_DEVICES", "UCX_SOCKADDR_TLS_PRIORITY",
                 "DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    saved = copy.deepcopy(dask.config.config)
    yield
    dask.config.config.clear()
    dask.config.config.update(saved)


def _facts(name: str) -> dict:
    return json.loads((HOSTS / name).read_text())


def _active_ib(facts: dict) -> bool:
    return any(d["state"] == "ACTIVE" and d["link_layer"] == "InfiniBand" for d in facts["sections"]["infiniband"]["ports"])


def _ipc_possible(facts: dict, plan) -> bool:
    transports = facts["sections"]["ucx_info"]["transports"]
    if transports is not None and "cuda_ipc" not in transports:
        return False
    return not any(g["mig"]["enabled"] for g in facts["gpus"])


def _shapes(tmp_path: pathlib.Path, name: str):
    """(shape, facts path, nworkers, extra env) for every way a user starts workers on this host."""
    facts = _facts(name)
    yield "one command, default workers", str(HOSTS / name), None, {}
    yield "one command, one worker", str(HOSTS / name), 1, {}
    if len(facts["gpus"]) > 1:
        for g in facts["gpus"]:  # one command per GPU: srun --gpus-per-task=1, dask-mpi
            yield (f"one command per GPU (CUDA_VISIBLE_DEVICES={g['index']})",
                   described(tmp_path, name, cuda_visible_devices=str(g["index"])), 1, {})
    yield "UCX_TLS=all exported", str(HOSTS / name), None, {"UCX_TLS": "all"}
    yield "dask-cuda's automatic mode", str(HOSTS / name), None, {"DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT": "True"}


def _plan(monkeypatch, facts_path: str, nworkers, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    try:
        return plan_on(facts_path, "ucx", nworkers)
    finally:
        for k in env:
            monkeypatch.delenv(k, raising=False)


@pytest.mark.parametrize("name", HOST_FILES)
def test_every_gpu_process_may_use_cuda_ipc_in_every_shape(name, tmp_path, monkeypatch):
    facts = _facts(name)
    for shape, path, nworkers, env in _shapes(tmp_path, name):
        try:
            h = _plan(monkeypatch, path, nworkers, env)
        except GpudaskError as e:  # a host gpudask refuses over UCX (distributed-ucxx missing): one line
            assert "\n" not in str(e) and "distributed-ucxx" in str(e), (shape, e)
            continue
        for p in (h.scheduler, h.client, *h.workers):
            if not facts["gpus"] or not h.ctx.gpus:
                continue
            tls = p.env.get("UCX_TLS") or env.get("UCX_TLS")
            assert tls, (name, shape, p.role)
            if "UCX_TLS" in env:  # explicit settings win: the user's value, whatever the hardware
                assert tls == env["UCX_TLS"], (name, shape, p.role, tls)
                continue
            ipc = tls_enables(tls, "cuda_ipc")
            assert ipc == _ipc_possible(facts, p), (name, shape, p.role, p.index, tls)
            assert tls_enables(tls, "cuda_copy"), (name, shape, p.role, tls)


@pytest.mark.parametrize("name", HOST_FILES)
def test_infiniband_and_rdmacm_only_where_an_active_port_exists(name, tmp_path, monkeypatch):
    facts = _facts(name)
    for shape, path, nworkers, env in _shapes(tmp_path, name):
        try:
            h = _plan(monkeypatch, path, nworkers, env)
        except GpudaskError:
            continue
        for p in h.processes():
            rdmacm = p.env.get("UCX_SOCKADDR_TLS_PRIORITY")
            if _active_ib(facts):
                if env.get("UCX_TLS") != "all":
                    assert "rc" in (p.env.get("UCX_TLS") or ""), (name, shape, p.role)
                assert rdmacm == "rdmacm", (name, shape, p.role)
            else:
                assert rdmacm is None, (name, shape, p.role, rdmacm)
                assert "rc" not in (p.env.get("UCX_TLS") or "").split(","), (name, shape, p.role)
                assert p.config.get("distributed-ucxx.rdmacm") in (False, None), (name, shape, p.role)


def test_ucx_tls_all_on_a_host_without_infiniband_says_why_no_rdmacm(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "all")
    h = plan_on(str(HOSTS / "h200-single.json"), "ucx", 1)
    assert "UCX_SOCKADDR_TLS_PRIORITY" not in h.nanny.env
    notes = [r.why for r in h.nanny.reasons if r.plugin == "infiniband" and r.decision == "no InfiniBand port"]
    assert notes and "no rdmacm" in notes[0]
    assert not h.warnings  # UCX_TLS=all only allows rc: nothing to warn about


def test_infiniband_asked_by_name_on_a_host_without_a_port_warns_and_sets_no_rdmacm(monkeypatch):
    h = plan_on(str(HOSTS / "h200-single.json"), "ucx", 1, **{"gpudask.transport.infiniband": True,
                                                               "gpudask.transport.rdmacm": True})
    assert all("UCX_SOCKADDR_TLS_PRIORITY" not in p.env for p in h.processes())
    assert any("no active InfiniBand port" in w for w in h.warnings)
    assert any("rdmacm=True" in w and "ignored" in w for w in h.warnings)


# -- memory for the host, not the command ---------------------------------------------------------
def _gpu_with_free(tmp_path, name: str, free_fraction: float, other_workers=None, processes=None) -> str:
    """A described host whose rmm section says what is free, and optionally other commands' workers
    and the processes on each GPU."""
    rmm = {"memory_free": {str(g["index"]): int(g["memory_total"] * free_fraction) for g in _facts(name)["gpus"]}}
    if other_workers is not None:
        rmm["other_workers"] = other_workers
    if processes is not None:
        rmm["processes"] = processes
    return described(tmp_path, name, sections=sections_with(name, rmm=rmm))


def test_free_memory_does_not_change_the_planned_pool(tmp_path):
    """A pool is a share of the GPU's total, not of what is free when the command plans: the
    first command's pool, a restarted worker's old process or a client's context do not shrink it."""
    fresh = plan_on(str(HOSTS / "h200-single.json"), "ucx", 1).workers[0].sections["rmm"]["initial_pool_size"]
    total = _facts("h200-single.json")["gpus"][0]["memory_total"]
    assert fresh == total // 2 // 256 * 256
    for free in (0.99, 0.49, 0.1):
        h = plan_on(_gpu_with_free(tmp_path, "h200-single.json", free), "ucx", 1)
        assert h.workers[0].sections["rmm"]["initial_pool_size"] == fresh
        assert h.workers[0].sections["rmm"]["fit_to_free"] is True  # a default: fitted at start, after a wait


def test_a_gpu_short_of_memory_names_who_holds_it_in_the_reasons(tmp_path):
    processes = {"0": [{"pid": 4242, "used": 70 * 2**30}, {"pid": 4243, "used": 600 * 2**20}]}
    h = plan_on(_gpu_with_free(tmp_path, "h200-single.json", 0.3, processes=processes), "ucx", 1)
    short = [r.why for r in h.workers[0].reasons if r.plugin == "rmm" and "less than this pool" in r.why]
    assert short and "pid 4242" in short[0] and "71680 MiB" in short[0] and "pid 4243" in short[0]
    assert short[0].index("pid 4242") < short[0].index("pid 4243")  # largest first


def test_a_second_command_on_a_gpu_plans_an_equal_share(tmp_path):
    """Another gpudask command of this user has a worker planned on GPU 0 (its host plan in the
    state directory, described here): this command's worker plans half of the GPU split
    between both, and says who shares it."""
    total = _facts("h200-single.json")["gpus"][0]["memory_total"]
    h = plan_on(_gpu_with_free(tmp_path, "h200-single.json", 0.49, other_workers={"0": {"4711": 1}}), "ucx", 1)
    section = h.workers[0].sections["rmm"]
    assert section["initial_pool_size"] == total // 4 // 256 * 256
    assert section["share"]["workers"] == 2 and section["share"]["other_workers"] == {"4711": 1}
    # two workers on the GPU: each pool stops growing at its share of 0.9 of it
    assert section["maximum_pool_size"] == int(0.9 * total / 2) // 256 * 256
    reasons = [r.why for r in h.workers[0].reasons if r.plugin == "rmm"]
    assert any("split between the 2 workers sharing it" in r and "1 of pid 4711" in r for r in reasons)
    assert any("GPU 0" in w and "1 of pid 4711" in w for w in h.warnings)


def test_workers_of_several_commands_all_get_the_same_share(tmp_path):
    """Three commands: 2 workers here, 1 of pid 10 and 3 of pid 11 on the one GPU -- six equal pools."""
    total = _facts("h200-single.json")["gpus"][0]["memory_total"]
    h = plan_on(_gpu_with_free(tmp_path, "h200-single.json", 0.2, other_workers={"0": {"10": 1, "11": 3}}),
                "ucx", 2)
    sizes = {w.sections["rmm"]["initial_pool_size"] for w in h.workers}
    assert sizes == {int(0.5 * total / 6) // 256 * 256}


def test_workers_per_gpu_declares_the_share_from_the_start(tmp_path):
    total = _facts("h200-single.json")["gpus"][0]["memory_total"]
    h = plan_on(str(HOSTS / "h200-single.json"), "ucx", 1, **{"gpudask.rmm.workers-per-gpu": 2})
    section = h.workers[0].sections["rmm"]
    assert section["initial_pool_size"] == total // 4 // 256 * 256 and section["share"]["declared"] == 2
    assert any("gpudask.rmm.workers-per-gpu = 2 (declared" in r.why for r in h.workers[0].reasons)
    # more workers planned than declared: planned for all of them, said so
    h = plan_on(_gpu_with_free(tmp_path, "h200-single.json", 1.0, other_workers={"0": {"4711": 2}}), "ucx", 1,
                **{"gpudask.rmm.workers-per-gpu": 2})
    assert h.workers[0].sections["rmm"]["initial_pool_size"] == int(total / 6) // 256 * 256
    assert any("but 3 workers are planned on it" in r.why for r in h.workers[0].reasons)


@pytest.mark.parametrize("value", [0, -1, "two", 1.5, True, "99999"])
def test_a_bad_workers_per_gpu_is_one_line(value):
    with pytest.raises(GpudaskError) as e:
        plan_on(str(HOSTS / "h200-single.json"), "ucx", 1, **{"gpudask.rmm.workers-per-gpu": value})
    text = str(e.value)
    assert "gpudask.rmm.workers-per-gpu" in text and "an integer from 1 to 4096" in text and "\n" not in text


def test_an_explicit_pool_size_still_wins_beside_other_commands(tmp_path):
    h = plan_on(_gpu_with_free(tmp_path, "h200-single.json", 0.49, other_workers={"0": {"4711": 1}}), "ucx", 1,
                **{"gpudask.rmm.pool-size": "10GB"})
    section = h.workers[0].sections["rmm"]
    assert section["initial_pool_size"] == 10 * 10**9 // 256 * 256 and section["fit_to_free"] is False
    assert section["share"] is None and section["maximum_pool_size"] is None


def test_workers_of_one_command_split_the_gpu(tmp_path):
    h = plan_on(_gpu_with_free(tmp_path, "h200-single.json", 0.5), "ucx", 2)
    total = _facts("h200-single.json")["gpus"][0]["memory_total"]
    sizes = [w.sections["rmm"]["initial_pool_size"] for w in h.workers]
    assert sizes[0] == sizes[1] == int(0.25 * total) // 256 * 256
    assert not [w for w in h.warnings if "pid" in w]  # no other command: nothing to warn about


def test_other_workers_keyed_by_an_unknown_gpu_is_one_line(tmp_path):
    with pytest.raises(GpudaskError) as e:
        plan_on(_gpu_with_free(tmp_path, "h200-single.json", 0.5, other_workers={"7": {"4711": 1}}), "ucx", 1)
    assert "other_workers" in str(e.value) and "index of a GPU of the host" in str(e.value)
    assert "\n" not in str(e.value)


def test_memory_free_above_memory_total_is_refused_in_one_line(tmp_path):
    free = {str(g["index"]): g["memory_total"] + 1 for g in _facts("h200-single.json")["gpus"]}
    with pytest.raises(GpudaskError) as e:
        plan_on(described(tmp_path, "h200-single.json", sections=sections_with("h200-single.json",
                                                                                rmm={"memory_free": free})), "ucx", 1)
    assert "memory_free" in str(e.value) and "at most memory_total" in str(e.value) and "\n" not in str(e.value)

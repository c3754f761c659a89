"""The scheduler check with many workers: what each joining worker costs the scheduler.

The workers of a host publish the same facts; the check validates each distinct facts
once and hands the same read-only dict to every side that published them.  These tests
hold what that must not change: data that differs in any way, types included, is
validated on its own, and findings are the same as without the memo
(docs/benchmarks.md, "Scheduler cost at scale").
"""

from __future__ import annotations

import copy
import json
import pathlib

import pytest
from distributed.protocol.core import dumps, loads

from conftest import host

from gpudask.checks import evaluate_worker, local_side, side_from_published
from gpudask.checks.runner import plan_here
from gpudask.findings import fingerprint

DGX = "dgx-8gpu-nvswitch-4ib.json"


def facts_of(name: str) -> dict:
    return json.loads(pathlib.Path(host(name)).read_text())


def over_the_wire(value):
    """As the scheduler receives a worker's startup information (msgpack: tuples, not lists)."""
    return loads(dumps({"extra": value}))["extra"]


@pytest.fixture
def scheduler(monkeypatch):
    """The scheduler's side of an 8-GPU node (plan_here registers the plugins' defaults in
    the global dask config: put it back afterwards, as test_checks.py does)."""
    import dask.config

    config, defaults = copy.deepcopy(dask.config.config), list(dask.config.defaults)
    monkeypatch.setenv("GPUDASK_FACTS", host(DGX))
    manager, ctx, facts = plan_here("tcp")
    yield manager, ctx, local_side(facts, "scheduler", "tcp://127.0.0.1:8786", "tcp")
    dask.config.config.clear()
    dask.config.config.update(config)
    dask.config.defaults[:] = defaults


# ----------------------------------------------------------------------------- fingerprint
def test_fingerprint_tells_types_apart_but_not_tuples_from_lists():
    assert fingerprint({"a": [1, 2]}) == fingerprint({"a": (1, 2)}) == fingerprint({"a": [1, 2]})
    different = [{"a": 1}, {"a": 1.0}, {"a": True}, {"a": "1"}, {"a": b"1"}, {1: 1}, {"b": 1}, {"a": [1]}]
    keys = [fingerprint(v) for v in different]
    assert None not in keys and len(set(keys)) == len(keys)


def test_fingerprint_is_none_for_what_msgpack_does_not_carry():
    assert fingerprint({"a": object()}) is None
    assert fingerprint({"a": {1, 2}}) is None


# ----------------------------------------------------------------------------- the check's memo
def test_workers_publishing_the_same_facts_share_one_validated_dict(scheduler):
    manager, ctx, side = scheduler
    published = {"facts": facts_of(DGX), "protocol": "tcp", "version": "0.1.0"}
    first = side_from_published(over_the_wire(published), "worker", "tcp://127.0.0.1:1")
    second = side_from_published(over_the_wire(published), "worker", "tcp://127.0.0.1:2")
    assert first["facts"] is second["facts"]  # validated once
    assert first["facts"]["gpus"][0]["cpu_affinity"] == facts_of(DGX)["gpus"][0]["cpu_affinity"]
    assert isinstance(first["facts"]["gpus"], list)  # JSON data, whatever msgpack gave
    other = side_from_published({"facts": facts_of("h200-single.json")}, "worker", "tcp://127.0.0.1:3")
    assert other["facts"] is not first["facts"] and len(other["facts"]["gpus"]) == 1


@pytest.mark.parametrize("change", [
    lambda f: f.update(cpu_count=True),  # a bool where the schema wants an int
    lambda f: f.update(hostname=f["hostname"].encode()),  # bytes, not a string
    lambda f: f.update(cpu_count=float("nan")),
    lambda f: f["gpus"][0].update(index=1),  # two GPUs with index 1
    lambda f: f.update({1: "x"}),  # a non-string key
])
def test_a_near_copy_of_facts_seen_valid_is_still_reported_malformed(scheduler, change):
    manager, ctx, side = scheduler
    good = facts_of(DGX)
    findings, worker_side = evaluate_worker(manager, ctx, side, "tcp://127.0.0.1:1", {"gpudask": {"facts": good}})
    assert worker_side is not None and findings == []
    bad = copy.deepcopy(good)
    change(bad)
    extra = over_the_wire({"gpudask": {"facts": bad}})
    (f,), worker_side = evaluate_worker(manager, ctx, side, "tcp://127.0.0.1:2", extra)
    assert worker_side is None and f.code == "malformed-facts"


def test_the_check_reads_only_what_it_compares(scheduler):
    """The plan and applied state a worker publishes are gpudask status's to read: data there
    that is not JSON does not make the worker's facts malformed."""
    manager, ctx, side = scheduler
    published = {"facts": facts_of(DGX), "protocol": "tcp", "plan": {"odd": {1, 2}}, "applied": object()}
    findings, worker_side = evaluate_worker(manager, ctx, side, "tcp://127.0.0.1:1", {"gpudask": published})
    assert worker_side is not None and findings == []
    with pytest.raises(ValueError, match="must be a string"):
        side_from_published({**published, "version": 7}, "worker", None)


def test_findings_follow_each_workers_own_facts_through_the_memo(scheduler):
    """Same facts but another visible GPU set: scheduler-parity reads each one's GPUs."""
    manager, ctx, side = scheduler
    none_visible = facts_of(DGX)
    none_visible["cuda_visible_devices"] = ""
    codes = []
    for facts in (facts_of(DGX), none_visible, facts_of(DGX), none_visible):
        extra = over_the_wire({"gpudask": {"facts": facts}})
        findings, _ = evaluate_worker(manager, ctx, side, "tcp://127.0.0.1:1", extra)
        codes.append(sorted(f.code for f in findings))
    assert codes[0] == codes[2] == [] and codes[1] == codes[3] == ["worker-no-gpu"]

"""What a worker publishes (plan, applied state, mismatches) is bounded on the scheduler:
NaN/Infinity never make ``/gpudask/json`` invalid, 100 000 mismatches never become 100 000
findings, a 20 MB value is never logged or served in full (gpudask.checks.published)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from conftest import base_env, host, third_party_plugin

from distributed.scheduler import WorkerState

import gpudask.dashboard.page as dashboard
from gpudask.checks import published as bounds
from gpudask.checks.sides import not_applied

TWO_GPUS = host("workstation-2gpu-pcie.json")


def _strict_json(text: str):
    """json.loads that refuses NaN / Infinity, as browsers' JSON.parse does."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_bound_replaces_non_finite_numbers_and_truncates_strings_with_a_marker():
    value = {"a": math.nan, "b": [math.inf, -math.inf], "s": "x" * (bounds.MAX_STR + 10), 3: b"raw"}
    out = bounds.bound(value)
    assert out["a"] == "nan" and out["b"] == ["inf", "-inf"]
    assert len(out["s"]) <= bounds.MAX_STR and out["s"].endswith("... [50 more characters]")
    assert out["3"] == "b'raw'"  # a non-string key and a non-JSON value: their repr
    _strict_json(json.dumps(out, allow_nan=False))
    assert bounds.bound(out) == out  # bounded data passes through again unchanged


def test_bound_cuts_long_lists_dicts_and_deep_nesting_and_counts_what_it_left_out():
    out = bounds.bound({"many": list(range(5000)), "keys": {str(i): i for i in range(3000)}})
    assert len(out["many"]) == bounds.MAX_ITEMS + 1 and out["many"][-1] == "... and 4000 more items"
    assert len(out["keys"]) == bounds.MAX_ITEMS + 1 and out["keys"]["..."] == "and 2000 more keys"
    deep: list = []
    node = deep
    for _ in range(50):
        node.append([])
        node = node[0]
    text = json.dumps(bounds.bound(deep))
    assert "nested deeper than" in text and text.count("[") <= bounds.MAX_DEPTH + 1
    # the total budget: many small lists never add up to more than MAX_TOTAL values
    wide = bounds.bound([[0] * 900 for _ in range(900)])
    assert sum(len(x) if isinstance(x, list) else 1 for x in wide) <= bounds.MAX_TOTAL + 2 * bounds.MAX_ITEMS


def test_100000_mismatches_become_a_bounded_number_of_findings():
    mismatches = [{"process": "worker 0", "key": f"k{i}", "planned": 1, "actual": 2, "plugin": "p"}
                  for i in range(100_000)]
    mismatches[3] = {"process": "worker 0", "key": "huge", "planned": math.nan, "actual": "y" * 20_000_000,
                     "plugin": "p"}
    findings = not_applied({"mismatches": [*mismatches, "junk", 7]})
    assert len(findings) == bounds.MAX_MISMATCHES + 2
    assert findings[bounds.MAX_MISMATCHES].message.startswith(
        f"... and {100_000 - bounds.MAX_MISMATCHES} more planned value(s) not in effect")
    assert "2 mismatch item(s) that are not objects" in findings[-1].message
    huge = findings[3].message
    assert len(huge) < 1000 and "more characters]" in huge and "planned 'nan'" in huge
    # a list bounded on the way in (the runner bounds ws.extra) still counts all of them
    again = not_applied(bounds.bound_published({"mismatches": mismatches}))
    assert again[-1].details == {"more": 100_000 - bounds.MAX_MISMATCHES}


def test_a_row_with_nan_infinity_and_floods_is_valid_bounded_json():
    ws = WorkerState(address="tcp://127.0.0.1:1", status=None, pid=1, name="w", nthreads=1, memory_limit=0,
                     local_directory="/tmp", nanny=None, server_id="x", extra={})
    ws.extra["gpudask"] = {"version": "1", "plan": {"sections": {"rmm": {"allocator": "pool", "initial_pool_size": math.inf}}, "env": {"UCX_TLS": "x" * 10**6}},
                           "applied": {"plugins": {"p": {f"k{i}": {"planned": math.nan, "actual": i}
                                                         for i in range(100_000)}}},
                           "mismatches": [{"key": "k", "actual": "z" * 20_000_000}] * 100_000}
    ws.metrics["gpudask-x"] = {"v": math.nan}
    row = dashboard.worker_state(ws.address, ws, None)
    text = json.dumps(row, allow_nan=False)
    _strict_json(text)
    assert len(text) < 2_000_000
    assert row["sections"]["rmm"]["initial_pool_size"] == "inf" and row["metrics"]["gpudask-x"]["v"] == "nan"


# ------------------------------------------------------------------ real processes
FLOOD = """
    import math, os
    from gpudask.pluginapi import hookimpl

    name = "flood"
    priority = 500

    @hookimpl
    def gpudask_applied_state(ctx, plan):
        if plan.role != "worker":
            return None
        out = {f"k{i}": {"planned": 1, "actual": 2} for i in range(int(os.environ["FLOOD_N"]))}
        out["nan"] = {"planned": math.nan, "actual": math.inf}
        out["huge"] = {"planned": "small", "actual": "y" * 20_000_000}
        return out
    """


@pytest.mark.process
def test_a_worker_publishing_nan_and_a_flood_keeps_the_page_valid_and_the_log_small(cluster, tmp_path):
    import urllib.request

    env = base_env(GPUDASK_FACTS=TWO_GPUS, FLOOD_N="100000", **third_party_plugin(tmp_path, FLOOD, "flood"))
    cluster.scheduler("--preload", "gpudask", "--dashboard-address", "127.0.0.1:0", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(1, timeout=120)
        info = client.scheduler_info(n_workers=-1)
        (w,) = info["workers"].values()
        with urllib.request.urlopen(f"http://127.0.0.1:{info['services']['dashboard']}/gpudask/json",
                                    timeout=30) as r:
            text = r.read().decode()
    state = _strict_json(text)  # valid JSON: NaN / Infinity replaced
    (row,) = state["workers"]
    assert row["gpudask"] and row["gpu"]["uuid"]  # the worker has its row
    assert len(text) < 5_000_000, len(text)
    findings = w["gpudask-check"]["findings"]
    not_applied_ = [f for f in findings if f["code"] == "not-applied"]
    assert len(not_applied_) == bounds.MAX_MISMATCHES + 1
    assert any(f["message"].startswith("... and ") for f in not_applied_)
    # what scheduler_info / gpudask status read is bounded too
    assert len(w["gpudask"]["mismatches"]) <= bounds.MAX_ITEMS + 1
    log = cluster.log("scheduler")
    assert len(log) < 1_000_000, len(log)
    assert "y" * 5000 not in log and "y" * 5000 not in cluster.log("worker")


BAD_APPLIED = """
    from gpudask.pluginapi import hookimpl

    name = "wrongtype"
    priority = 500

    @hookimpl
    def gpudask_applied_state(ctx, plan):
        if plan.role == "worker":
            return ["not", "a", "dict"]
    """


@pytest.mark.process
def test_a_plugin_whose_applied_state_has_the_wrong_type_stops_the_worker_with_one_line(cluster, tmp_path):
    env = base_env(GPUDASK_FACTS=TWO_GPUS, **third_party_plugin(tmp_path, BAD_APPLIED, "wrongtype"))
    cluster.scheduler("--preload", "gpudask", env=env)
    proc = cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env)
    assert proc.wait(timeout=120) != 0  # never a worker running half-configured
    log = cluster.log("worker")
    line = ("gpudask plugin 'wrongtype' (from wrongtypeplug) failed in gpudask_applied_state: returned a list; "
            "expected None or a dict {key: {'planned': value, 'actual': value}}")
    assert line in log, log[-3000:]
    assert "Failed to start preload" not in log and "Traceback" not in log, log[-3000:]

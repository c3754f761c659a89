"""A process that starts servers gpudask did not start at import (a LocalCluster's scheduler
in a client's process) plans once per set of inputs: the config keys a plan depends on are
learnt from the plans made (the plugins' legacy keys, the keys a plan sets), never listed
by the core."""

from __future__ import annotations

import dask
import pytest
from conftest import host

from gpudask import session
from gpudask.apply import preload


@pytest.fixture
def fresh(monkeypatch):
    # the process state of a fresh process (no plan-only sessions, no keys learnt; the
    # autouse fixture of conftest.py resets it again after the test)
    session.reset()
    monkeypatch.setenv("GPUDASK_FACTS", host("workstation-2gpu-pcie.json"))
    for name in ("UCX_TLS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    # this process applied a client's plan (as gpudask.initialize() does), without changing
    # anything here: the servers it starts get plan-only sessions
    from gpudask.apply import process

    client = process.Session("client", process.plan_host("tcp"), process.plan_host("tcp").client)
    client.applied = True
    session.current().applied = client


def test_the_same_inputs_reuse_the_plan_and_a_key_the_plans_depend_on_replans(fresh):
    first = preload.session_for("worker")
    assert preload.session_for("worker") is first
    # learnt from the plans, not listed in the core: rmm's legacy key, the key gpu-dask-defaults sets
    assert {"distributed.rmm.pool-size", "array.rechunk.method"} <= session.current().plan_keys
    with dask.config.set({"some.unrelated-key": 1}):
        assert preload.session_for("worker") is first  # the rest of dask's config does not count
    with dask.config.set({"distributed.rmm.pool-size": "1GB"}):
        legacy = preload.session_for("worker")
        assert legacy is not first and "legacy key distributed.rmm.pool-size" in str(legacy.plan.reasons)
    with dask.config.set({"array.rechunk.method": "p2p"}):
        kept = preload.session_for("worker")
        assert kept is not first and "array.rechunk.method" not in kept.plan.config
    assert preload.session_for("worker") is first

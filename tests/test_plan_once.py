"""The resolved host plan is the only thing that crosses a process boundary: the planning
process resolves settings and facts once and writes them, with their sources, into the plan;
a worker process reads the plan and bootstraps nothing, validates no facts and parses no
setting (the counts of :mod:`gpudask.session`, published with a worker's applied state)."""

from __future__ import annotations

import json

import pytest

from conftest import base_env, host

from gpudask import bootstrap, session
from gpudask.apply import hostfile
from gpudask.plan.host_plan import PlanFileError
from gpudask.plan.host_plan import facts_digest

H200 = host("h200-single.json")
POOL = "gpudask.rmm.pool-size"


def _write(tmp_path, text):
    """The plan file as a planning parent leaves it: in a private folder, 0600."""
    private = tmp_path / "state"
    private.mkdir(mode=0o700, exist_ok=True)
    path = private / "plan-1.json"
    path.write_text(text)
    path.chmod(0o600)
    return path


def _as_a_worker_process(monkeypatch, path):
    """What a nanny's worker process starts with: the plan's path, and nothing of the
    parent's process state (a spawned interpreter)."""
    monkeypatch.setenv(hostfile.PLAN_ENV, str(path))
    session.reset()


def test_the_planning_process_parses_the_pool_size_once(monkeypatch):
    monkeypatch.setenv("DASK_GPUDASK__RMM__POOL_SIZE", "2GB")
    session.reset()
    plan = bootstrap.plan_host("ucx", 2, facts_path=H200, planner="nanny")
    bootstrap.plan_host("ucx", 2, facts_path=H200, planner="nanny")  # planning again builds nothing twice
    counts = session.current().startup_counts()
    assert counts["parsed"][POOL] == 1
    assert counts["bootstrap"] == 1 and counts["facts_read"] == 1
    assert all(n == 1 for n in counts["parsed"].values()), counts["parsed"]
    assert plan.workers[0].sections["rmm"]["initial_pool_size"] == 2_000_000_000


def test_the_plan_file_holds_the_resolved_settings_with_their_sources(monkeypatch):
    monkeypatch.setenv("DASK_GPUDASK__RMM__POOL_SIZE", "2GB")
    doc = json.loads(bootstrap.plan_host("ucx", 2, facts_path=H200).to_json())
    assert doc["settings"][POOL] == {"value": 2_000_000_000, "source": "$DASK_GPUDASK__RMM__POOL_SIZE"}
    assert doc["settings"]["gpudask.plugins.disable"] == {"value": [], "source": "default"}
    assert doc["facts_digest"] == facts_digest(doc["facts"])


def test_a_worker_reading_its_host_plan_bootstraps_validates_and_parses_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("DASK_GPUDASK__RMM__POOL_SIZE", "2GB")
    plan = bootstrap.plan_host("ucx", 2, facts_path=H200, planner="nanny")
    path = _write(tmp_path, plan.to_json())
    _as_a_worker_process(monkeypatch, path)
    read = hostfile.load()
    assert read == plan and read.facts == plan.facts
    counts = session.current().startup_counts()
    assert counts == {"bootstrap": 0, "facts_read": 0, "facts_schema": 0, "parsed": {}, "preimported": []}, counts
    # the parent's value and its source, as it resolved them
    assert read.ctx.require(POOL).value == 2_000_000_000
    assert read.ctx.require(POOL).source == "$DASK_GPUDASK__RMM__POOL_SIZE"
    assert [p.name for p in read.ctx.manager.plugins] == [p["name"] for p in plan.plugins]
    assert session.current().counts == {}, "nothing else was counted either"


def test_facts_changed_since_the_plan_was_written_are_validated_in_full(tmp_path, monkeypatch, own_state_dir):
    doc = json.loads(bootstrap.plan_host("ucx", 2, facts_path=H200).to_json())
    doc["facts"]["hostname"] = "edited-by-hand"  # still valid facts, but not the ones validated
    path = _write(tmp_path, json.dumps(doc))
    _as_a_worker_process(monkeypatch, path)
    assert hostfile.load().facts.hostname == "edited-by-hand"
    assert session.current().startup_counts()["facts_schema"] == 1  # the digest did not match: validated

    doc["facts"]["cpu_count"] = "many"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanFileError) as e:
        hostfile.load()
    assert "key 'facts': key 'cpu_count' must be" in str(e.value) and "\n" not in str(e.value)


def test_invalid_facts_under_their_old_digest_are_refused_too(tmp_path, monkeypatch):
    """A digest is only trusted for the very facts it was computed from."""
    doc = json.loads(bootstrap.plan_host("ucx", 2, facts_path=H200).to_json())
    doc["facts"]["gpus"][0]["memory_total"] = -1
    path = _write(tmp_path, json.dumps(doc))
    _as_a_worker_process(monkeypatch, path)
    with pytest.raises(PlanFileError, match=r"key 'gpus\[0\]\.memory_total' must be"):
        hostfile.load()


@pytest.mark.parametrize("settings,said", [
    (KeyError, "key 'settings' is missing"),
    ([1], "key 'settings' is [1]"),
    ({POOL: 5}, f"key 'settings.{POOL}' is 5"),
    ({POOL: {"value": 5, "source": 1}}, f"key 'settings.{POOL}'"),
])
def test_malformed_resolved_settings_are_refused_in_one_line(settings, said, tmp_path, monkeypatch):
    doc = json.loads(bootstrap.plan_host("ucx", 2, facts_path=H200).to_json())
    if settings is KeyError:
        del doc["settings"]
    else:
        doc["settings"] = settings
    path = _write(tmp_path, json.dumps(doc))
    _as_a_worker_process(monkeypatch, path)
    with pytest.raises(PlanFileError) as e:
        hostfile.load()
    assert said in str(e.value) and "accepted" in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.process
@pytest.mark.parametrize("facts", [None, "h200-single.json"], ids=["this-cpu-host", "described-h200"])
def test_preloaded_workers_publish_that_they_bootstrapped_nothing(cluster, facts):
    """Real `dask worker --nworkers 2 --preload gpudask`: each worker's applied state counts no
    bootstrap, no facts read or validated and no setting parsed, and its plan has the pool
    size the planning process parsed from the environment."""
    env = base_env(DASK_GPUDASK__RMM__POOL_SIZE="1GB", **({"GPUDASK_FACTS": host(facts)} if facts else {}))
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        published = [w["gpudask"] for w in client.scheduler_info(n_workers=-1)["workers"].values()]
    assert sorted(p["plan"]["index"] for p in published) == [0, 1]
    for p in published:
        startup = dict(p["applied"]["startup"])
        preimported = startup.pop("preimported")
        assert startup == {"bootstrap": 0, "facts_read": 0, "facts_schema": 0, "parsed": {}}
        if facts:
            assert p["plan"]["sections"]["rmm"]["initial_pool_size"] == 1_000_000_000
            # a described GPU host: forked from a fork server that had imported what the plugins
            # name for a worker (those installed here: rmm is, cupy is not)
            assert p["plan"]["multiprocessing_method"] == "forkserver"
            assert "rmm" in preimported and "rmm.allocators.cupy" in preimported, preimported
            # and gpudask's own plugin modules (the worker's import of gpudask then applied its plan)
            assert "gpudask.plugins.rmm.plugin" in preimported, preimported
        else:
            assert list(preimported) == []  # no GPU: no fork server


@pytest.mark.gpu
@pytest.mark.process
def test_on_a_gpu_host_workers_read_their_plan_and_set_up_the_pool_it_holds(cluster):
    """A real GPU host over ucx: the `dask worker` process probes and plans once; its workers
    bootstrap nothing and set up the RMM pool the plan holds (the size parsed in the parent)."""
    env = {k: v for k, v in base_env(DASK_GPUDASK__RMM__POOL_SIZE="1GiB").items()
           if not k.startswith("UCX_") or k == "UCX_WARN_UNUSED_ENV_VARS"}
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=120)
        published = [w["gpudask"] for w in client.scheduler_info(n_workers=-1)["workers"].values()]
    for p in published:
        startup = dict(p["applied"]["startup"])
        # forked from a server that had imported UCX's and RMM's modules (gpudask_preimport)
        assert {"distributed_ucxx.ucxx", "ucxx", "rmm", "rmm.allocators.cupy", "cuda.core"} <= set(
            startup.pop("preimported")), p["applied"]["startup"]
        assert startup == {"bootstrap": 0, "facts_read": 0, "facts_schema": 0, "parsed": {}}
        assert p["plan"]["sections"]["rmm"]["initial_pool_size"] == 2**30
        assert "rmm" in p["memory"], "the pool was set up from the plan's section"
        assert not [m for m in p["mismatches"] if m["plugin"] == "rmm"], p["mismatches"]

"""The bootstrap (config, plugins, settings, the user's view and facts, once per process), the
pure plan stage built on it, and the host plan file format (``HostPlan.to_json`` / ``from_json``)."""

from __future__ import annotations

import copy
import json
import os
import pathlib

import dask.config
import pytest
from conftest import HOSTS, base_env, host, third_party_plugin

from gpudask import bootstrap
from gpudask.plan import FORMAT, HostPlan, PlanFileError, build_plan

ROOT = pathlib.Path(__file__).parent.parent
GOLDEN = sorted((ROOT / "tests" / "golden").glob("*.json"))
HGX = host("hgx-4gpu-2ib.json")


def _clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("UCX_", "DASK_", "UCXPY_", "RAPIDS_")) or name in ("CUDA_VISIBLE_DEVICES", "CUDF_SPILL"):
            monkeypatch.delenv(name)


# -- the bootstrap ----------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["tcp", "ucx"])
def test_building_a_plan_twice_from_one_bootstrap_changes_nothing(protocol):
    inputs = bootstrap.inputs(facts_path=HGX)
    env_before, config_before = dict(os.environ), copy.deepcopy(dask.config.config)
    first = build_plan(inputs, protocol, None)
    second = build_plan(inputs, protocol, 2, user_interface="ib0", planner="nanny")
    assert dict(os.environ) == env_before
    assert dask.config.config == config_before
    assert first.workers[0].env and len(second.workers) == 2  # the plans did decide things


def test_the_same_inputs_are_built_once_and_other_inputs_again():
    one = bootstrap.plan_host("ucx", facts_path=HGX)
    two = bootstrap.plan_host("ucx", 2, facts_path=HGX)
    assert bootstrap.builds() == 1 and one.ctx.manager is two.ctx.manager and one.ctx.settings is two.ctx.settings
    # another facts file: other plan inputs, the same plugins and settings
    other = bootstrap.plan_host("ucx", facts_path=host("h200-single.json"))
    assert bootstrap.builds() == 1 and other.ctx.manager is one.ctx.manager and other.ctx.facts is not one.ctx.facts
    assert bootstrap.manager() is one.ctx.manager  # status and the dashboard ask this one
    with dask.config.set({"gpudask.rmm.pool-size": "1GiB"}):  # another user config
        assert bootstrap.plan_host("ucx", facts_path=HGX).workers[0].sections["rmm"]["initial_pool_size"] == 2**30
    assert bootstrap.builds() == 2
    bootstrap.plan_host("ucx", facts_path=HGX)  # back to the first inputs: still cached
    assert bootstrap.builds() == 2
    bootstrap.reset()
    bootstrap.plan_host("ucx", facts_path=HGX)
    assert bootstrap.builds() == 1


def test_a_bootstrap_builds_one_plugin_manager_and_one_settings(monkeypatch):
    from gpudask import config
    from gpudask.plugin import manager

    made = {"settings": 0, "managers": 0}
    settings_init, manager_init = config.Settings.__init__, manager.PluginManager.__init__

    def count_settings(self, *args, **kwargs):
        made["settings"] += 1
        settings_init(self, *args, **kwargs)

    def count_managers(self, *args, **kwargs):
        made["managers"] += 1
        manager_init(self, *args, **kwargs)

    monkeypatch.setattr(config.Settings, "__init__", count_settings)
    monkeypatch.setattr(manager.PluginManager, "__init__", count_managers)
    inputs = bootstrap.inputs(facts_path=HGX)
    assert made == {"settings": 1, "managers": 1}
    # the core's options and the plugins', in the same Settings
    assert {"gpudask.plugins.autoload", "gpudask.rmm.pool-size"} <= set(inputs.settings.options)
    bootstrap.plan_host("ucx", 2, facts_path=HGX)
    bootstrap.manager()
    from gpudask.cli.status import worker_row

    worker_row("tcp://w", {})
    assert made == {"settings": 1, "managers": 1}


def test_a_changed_gpudask_toml_is_read_again(tmp_path):
    assert bootstrap.inputs(facts_path=HGX).settings["gpudask.rmm.pool-size"] != 3 * 2**30
    (tmp_path / "gpudask.toml").write_text('[rmm]\npool-size = "3GiB"\n')
    assert bootstrap.inputs(facts_path=HGX).settings["gpudask.rmm.pool-size"] == 3 * 2**30
    assert bootstrap.builds() == 2


def test_the_user_view_puts_back_what_gpudask_applied(monkeypatch):
    from gpudask.plan import UserValues

    monkeypatch.setenv("UCX_TLS", "applied-by-gpudask")
    monkeypatch.delenv("UCX_RNDV_SCHEME", raising=False)
    bootstrap.keep_user_values(UserValues({"UCX_TLS": None, "UCX_RNDV_SCHEME": "put_zcopy"},
                                          {"distributed.comm.ucx.nvlink": True}))
    env, config = bootstrap.user_view()
    assert "UCX_TLS" not in env and env["UCX_RNDV_SCHEME"] == "put_zcopy"
    assert dask.config.get("distributed.comm.ucx.nvlink", config=config) is True
    assert os.environ["UCX_TLS"] == "applied-by-gpudask"  # the process itself is left as it is


# -- the host plan file -----------------------------------------------------------------
def _golden_cases():
    cases = [tuple(p.stem.split("--")) for p in GOLDEN]
    cases += [(p.stem, protocol, "default") for p in sorted(HOSTS.glob("*.json")) for protocol in ("tcp", "ucx")]
    return sorted(set(cases))


@pytest.mark.parametrize("name,protocol,nworkers", _golden_cases(), ids=["--".join(c) for c in _golden_cases()])
def test_every_host_plan_reads_back_equal(name, protocol, nworkers, monkeypatch):
    _clean_env(monkeypatch)
    monkeypatch.chdir(ROOT)  # the facts path as tests/test_golden_plans.py gives it
    facts = f"tests/hosts/{name}.json"
    try:
        plan = bootstrap.plan_host(protocol, None if nworkers == "default" else int(nworkers), facts_path=facts)
    except Exception as e:  # a described host gpudask refuses to plan for (said in one line)
        assert "\n" not in str(e)
        pytest.skip(f"not a plannable host: {e}")
    text = plan.to_json()
    again = HostPlan.from_json(text, bootstrap.inputs(facts_path=facts))
    assert again == plan
    assert again.to_json() == text and json.loads(text)["format"] == FORMAT
    assert again.ctx.facts == plan.facts and again.ctx.manager is plan.ctx.manager
    golden = ROOT / "tests" / "golden" / f"{name}--{protocol}--{nworkers}.json"
    if golden.exists():  # what gpudask info --json prints is the file without format and user values
        from regenerate_golden import assemble

        assert json.loads(json.dumps(again.to_dict())) == assemble(golden)


def test_the_plan_carries_the_user_values_of_what_it_sets(monkeypatch):
    monkeypatch.setenv("UCX_MAX_RNDV_RAILS", "3")
    plan = bootstrap.plan_host("ucx", facts_path=HGX)
    names = {n for p in plan.processes() for n in p.env}
    assert set(plan.user_values.env) == names and plan.user_values.env["UCX_MAX_RNDV_RAILS"] == "3"
    assert all(plan.user_values.env[n] is None for n in names if n not in os.environ)


def _document(change):
    doc = json.loads(bootstrap.plan_host("ucx", facts_path=HGX).to_json())
    change(doc)
    return json.dumps(doc)


def _set(path, value):
    """A change to the document: ``path`` like "workers/0/env"; ``value`` KeyError deletes it."""
    def change(doc):
        *parents, last = path.split("/")
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return change


@pytest.mark.parametrize("change,said", [
    ("{not json", "not valid JSON at line 1 column 2"),
    ("[1, 2]", "the top level is a list"),
    (_set("format", KeyError), "has no 'format'"),
    (_set("format", 2), "has format 2, which this gpudask does not read"),
    (_set("format", True), "has format True"),
    (_set("nworkers", "2"), "key 'nworkers' is '2'; accepted: an integer >= 1"),
    (_set("nworkers", 0), "key 'nworkers' is 0"),
    (_set("nworkers", 3), "key 'workers' holds 4 plans for nworkers 3"),
    (_set("protocol", KeyError), "key 'protocol' is missing"),
    (_set("plugins", {"a": 1}), "key 'plugins'"),
    (_set("warnings", [1]), "key 'warnings' is [1]; accepted: a list of strings"),
    (_set("facts", {"schema": 2}), "key 'facts': key 'hostname' is missing"),
    (_set("scheduler/role", "worker"), "key 'scheduler.role' is 'worker'; accepted: 'scheduler'"),
    (_set("nanny", []), "key 'nanny' is []; accepted: a process plan"),
    (_set("workers/0/env", {"A": 1}), "key 'workers[0].env'"),
    (_set("workers/0/reasons", [{"plugin": "x"}]), "key 'workers[0].reasons[0]'"),
    (_set("workers/0/surprise", 1), "key 'workers[0]' is not a process plan"),
    (_set("user_values", KeyError), "key 'user_values' is missing"),
    (_set("user_values/env", {"A": 1}), "key 'user_values.env'"),
])
def test_a_malformed_host_plan_is_refused_in_one_line(change, said):
    text = change if isinstance(change, str) else _document(change)
    with pytest.raises(PlanFileError) as e:
        HostPlan.from_json(text, bootstrap.inputs(facts_path=HGX), where="plan.json")
    message = str(e.value)
    assert message.startswith("plan.json") and said in message and "accepted" in message, message
    assert "\n" not in message


def test_an_oversized_host_plan_is_refused_unread(monkeypatch):
    from gpudask.plan import host_plan

    monkeypatch.setattr(host_plan, "MAX_PLAN_BYTES", 100)
    with pytest.raises(PlanFileError, match="over the 100-byte limit"):
        HostPlan.from_json(" " * 101, bootstrap.inputs(facts_path=HGX))


def test_hostfile_load_reads_what_publish_wrote_and_refuses_a_broken_one(tmp_path, monkeypatch):
    from gpudask.apply import hostfile

    plan = bootstrap.plan_host("ucx", facts_path=HGX)
    private = tmp_path / "state"
    private.mkdir(mode=0o700)
    path = private / "plan-1.json"
    path.write_text(plan.to_json())
    path.chmod(0o600)
    monkeypatch.setenv(hostfile.PLAN_ENV, str(path))
    env_before = dict(os.environ)
    assert hostfile.load() == plan
    assert dict(os.environ) == env_before  # loading changes nothing; restore_user_values does
    path.write_text(plan.to_json().replace('"format": 1', '"format": 99'))
    with pytest.raises(PlanFileError, match=r"the host plan .*plan-1.json \(\$GPUDASK_HOST_PLAN\): has format 99"):
        hostfile.load()


# -- a real dask worker -------------------------------------------------------------------
COUNTING = """
    import multiprocessing, os
    from gpudask import hookimpl

    name = "counting"
    priority = 500

    @hookimpl
    def gpudask_config_options():
        # once per plugin manager asked for its settings: one line per process that built them
        with open(os.environ["COUNT_FILE"], "a") as f:
            f.write(f"{os.getpid()} {multiprocessing.current_process().name}\\n")
        return []
    """


@pytest.mark.process
def test_each_process_of_dask_worker_builds_its_plugins_and_settings_once(cluster, tmp_path):
    count = tmp_path / "count.txt"
    env = base_env(GPUDASK_FACTS=host("workstation-2gpu-pcie.json"), COUNT_FILE=str(count),
                   **third_party_plugin(tmp_path, COUNTING, name="counting"))
    cluster.scheduler(env=base_env())
    cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        assert sorted(w["gpudask"]["plan"]["index"] for w in workers.values()) == [0, 1]
        pids = set(client.run(os.getpid).values())
    lines = count.read_text().splitlines()
    by_pid: dict[str, int] = {}
    for line in lines:
        by_pid[line.split()[0]] = by_pid.get(line.split()[0], 0) + 1
    assert {str(p) for p in pids} <= set(by_pid), lines  # each worker process built its own
    assert len(by_pid) == 3 and set(by_pid.values()) == {1}, lines  # the dask worker process and 2 workers, once

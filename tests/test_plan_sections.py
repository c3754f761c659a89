"""Plugin-owned plan sections: written by their plugin, published as they are, read by
another plugin only when declared and only as the earlier plan steps left them; and the
report rows the plugins supply for ``gpudask info`` / ``status`` / the page.

Plans on described hosts (tests/hosts/*.json); no process is started.
"""

from __future__ import annotations

import types

import dask.config
import pytest
from conftest import host

from gpudask import hookimpl
from gpudask.cli.status import format_status, worker_row
from gpudask.config import Settings
from gpudask.errors import PluginError
from gpudask.facts import load_facts
from gpudask.plugin.manager import PluginManager
from gpudask.plan import PlanInputs, ProcessPlan, build_plan
from gpudask.plugins import gpu_pinning, worker_memory
from gpudask.plugins.rmm import plugin as rmm_plugin
from gpudask.plugins.spill import plugin as spill_plugin

POOL = {"gpudask": {"rmm": {"pool-size": "4GiB", "maximum-pool-size": "8GiB"}}}


def _plan(*extra, config=POOL, builtins=(rmm_plugin, gpu_pinning)):
    m = PluginManager()
    for p in (*builtins, *extra):
        m.register(p)
    with dask.config.set(config):
        settings = Settings(m.config_options(), config=config)
        return build_plan(PlanInputs(load_facts(host("h200-single.json")), settings, m, {}, config), "tcp", 1)


def _reader(priority, hook, declared=("rmm",)):
    seen = []

    def read(plan):
        if plan.role == "worker":
            seen.append(dict(plan.section("rmm")))

    return seen, types.SimpleNamespace(name="reader", priority=priority, reads_sections=declared,
                                       **{hook: hookimpl(read)})


@pytest.mark.parametrize("priority", [5, 500])
def test_a_section_is_read_in_a_later_step_whatever_the_priorities(priority):
    seen, reader = _reader(priority, "gpudask_plan_finish")
    (w,) = _plan(reader).workers
    assert seen == [w.sections["rmm"]] and seen[0]["initial_pool_size"] == 4 * 2**30


@pytest.mark.parametrize("priority", [5, 500])
def test_a_section_written_in_the_same_step_is_not_visible_yet(priority):
    """rmm decides in gpudask_plan_memory: a reader in that step sees nothing, before or after rmm."""
    seen, reader = _reader(priority, "gpudask_plan_memory")
    _plan(reader)
    assert seen == [{}]


def test_reading_an_undeclared_section_is_one_line_naming_plugin_and_section():
    _, reader = _reader(300, "gpudask_plan_finish", declared=())
    with pytest.raises(PluginError) as e:
        _plan(reader)
    message = str(e.value)
    assert "'reader'" in message and "'rmm'" in message and "reads_sections" in message and "\n" not in message


@pytest.mark.parametrize("bad", ["rmm", [1], None])
def test_reads_sections_of_the_wrong_shape_is_refused_at_registration(bad):
    plugin = types.SimpleNamespace(name="odd", priority=300, reads_sections=bad)
    with pytest.raises(PluginError, match="reads_sections must be a tuple of plugin names"):
        PluginManager().register(plugin)


def test_spill_caps_by_rmms_maximum_through_the_declared_section_at_any_priority():
    """spill reads rmm's maximum_pool_size in gpudask_plan_finish: moving spill before rmm changes nothing."""
    expected = int(0.8 * 8 * 2**30)
    for priority in (110, 1):
        spill = types.ModuleType("spill_at")
        spill.__dict__.update({k: v for k, v in vars(spill_plugin).items() if not k.startswith("__")})
        spill.priority = priority
        (w,) = _plan(spill, builtins=(rmm_plugin, gpu_pinning, worker_memory)).workers
        assert w.sections["spill"] == {"device_memory_limit": expected}, priority
        assert w.sections["rmm"]["maximum_pool_size"] == 8 * 2**30
        assert w.sections["worker-memory"] == {"host_memory_fraction": 1.0}


def test_sections_and_requests_are_published_and_read_back():
    plan = ProcessPlan("worker", index=0)
    plan.acting_plugin = "one"
    plan.set_section({"a": 1}, "because")
    plan.set_section({"b": [2]}, "and because")
    plan.request("two", {"x": True}, "asked")
    data = plan.to_dict()
    assert data["sections"] == {"one": {"a": 1, "b": [2]}} and data["requests"] == {"two": {"one": {"x": True}}}
    again = ProcessPlan.from_dict(data)
    assert again.sections == plan.sections and again.requests == plan.requests
    assert [r.decision for r in plan.reasons] == ["one: a=1", "one: b=[2]", "asks two: x=True"]


def _published(sections):
    return {"gpudask": {"plan": {"index": 0, "sections": sections},
                        "memory": {"rmm": {"initial_pool_size": 2**30, "applied": True, "pool_size": 2**31}}}}


def test_status_columns_come_from_the_plugins():
    row = worker_row("tcp://w:1", _published({"rmm": {"allocator": "pool", "initial_pool_size": 2**30},
                                              "spill": {"device_memory_limit": 2**33}}))
    assert row["columns"]["pool"]["planned"] == 2**30 and row["columns"]["pool"]["actual"] == 2**31
    assert row["columns"]["pool"]["plugin"] == "rmm" and row["columns"]["spill"]["planned"] == 2**33
    text = format_status({"scheduler": "tcp://s:1", "workers": [row]}, lambda h, r: "\n".join(
        " | ".join(map(str, x)) for x in [h, *r]))
    header, line = text.splitlines()[1:3]
    assert "pool" in header.split(" | ") and "spill" in header.split(" | ")
    assert "1.0 GiB -> 2.0 GiB" in line and "8.0 GiB" in line and "!" not in line


def test_a_plugin_whose_rows_are_malformed_is_left_out_with_one_warning(monkeypatch):
    broken = types.SimpleNamespace(name="broken", priority=1, gpudask_report_rows=hookimpl(
        lambda plan: [{"column": 3}]))
    raising = types.SimpleNamespace(name="raising", priority=2, gpudask_report_rows=hookimpl(
        lambda plan: 1 / 0))
    manager = PluginManager.from_environment(extra=[broken, raising])
    row = worker_row("tcp://w:1", _published({"rmm": {"allocator": "pool", "initial_pool_size": 2**30}}), manager)
    assert list(row["columns"]) == ["pool"]
    assert any("broken" in p for p in row["problems"]) and any("raising" in p for p in row["problems"])


def test_a_column_named_twice_keeps_the_first_and_warns_once_naming_both(monkeypatch):
    from gpudask.plugin import hookresults

    hookresults.warn_column_twice.cache_clear()
    row = {"column": "pool", "summary": "mine", "planned": 1, "actual": None}
    first = types.SimpleNamespace(name="first", priority=1, gpudask_report_rows=hookimpl(lambda plan: [row]))
    second = types.SimpleNamespace(name="second", priority=2, gpudask_report_rows=hookimpl(
        lambda plan: [{**row, "summary": "theirs"}]))
    manager = PluginManager.from_environment(extra=[second, first])
    plan = {"role": "worker", "sections": {}}
    with pytest.warns(UserWarning) as caught:
        rows, problems = manager.report_rows(plan, None)
    pool = [r for r in rows if r["column"] == "pool"]
    assert [(r["plugin"], r["summary"]) for r in pool] == [("first", "mine")] and problems == []
    [w] = [w for w in caught if "report column" in str(w.message)]
    assert "'pool' of plugin 'second' left out: plugin 'first'" in str(w.message) and "\n" not in str(w.message)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert manager.report_rows(plan, None)[0] == rows  # once per process: no second warning

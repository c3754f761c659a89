"""Facts a plugin owns (``gpudask_facts_sections``): probed on a real host, read from a
described host's ``sections``, validated by the plugin's schema fragment, carried with the
facts; the core knows none of them."""

from __future__ import annotations

import json
import types

import pytest

from conftest import HOSTS
from gpudask import bootstrap, hookimpl
from gpudask.errors import FactsError, PluginError
from gpudask.pluginapi import FactsSection
from gpudask.testing import facts_file, plan_for

SCHEMA = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean", "x-accepts": "true or false"}}}


def owner(name="owner", section="thing", schema=SCHEMA, probe=lambda facts: {"ok": True}, calls=None):
    plugin = types.SimpleNamespace(name=name, priority=300)

    def gpudask_facts_sections():
        if calls is not None:
            calls.append(name)
        return [FactsSection(section, schema, probe)]

    def gpudask_plan_process(ctx, plan):
        if plan.role == "worker":
            plan.note(f"thing={ctx.facts.section(section)}", "its facts")

    plugin.gpudask_facts_sections = hookimpl(gpudask_facts_sections)
    plugin.gpudask_plan_process = hookimpl(gpudask_plan_process)
    return plugin


def test_a_described_host_gives_its_section_and_the_plan_carries_it(tmp_path):
    path = facts_file(tmp_path, "single-gpu", sections={"thing": {"ok": False}, "nobody's": [1]})
    host = plan_for(path, "tcp", plugins=[owner()])
    assert host.facts.section("thing") == {"ok": False} and host.facts.section("nobody's") == [1]  # kept, unread
    assert "thing={'ok': False}" in [r.decision for r in host.workers[0].reasons]
    again = type(host).from_json(host.to_json(), bootstrap.inputs(facts_path=path, extra_plugins=()))
    assert again.facts.section("thing") == {"ok": False}  # a nanny's workers read it from the host plan


def test_a_described_host_without_the_section_gives_none():
    host = plan_for("single-gpu", "tcp", plugins=[owner()])
    assert host.facts.section("thing") is None and "thing" not in host.facts.to_dict()["sections"]
    assert "thing=None" in [r.decision for r in host.workers[0].reasons]


def test_a_real_host_is_probed_once_per_bootstrap(monkeypatch):
    data = json.loads((HOSTS / "single-gpu.json").read_text())
    monkeypatch.setenv("GPUDASK_PROBED_FACTS", json.dumps(data))  # this host, as a probe found it
    probed = []
    plugin = owner(probe=lambda facts: probed.append(facts.hostname) or {"ok": True})
    one = bootstrap.plan_host("tcp", extra_plugins=[plugin])
    bootstrap.plan_host("tcp", 2, extra_plugins=[plugin])
    assert probed == [data["hostname"]] and one.facts.section("thing") == {"ok": True}
    assert one.to_dict()["facts"]["sections"]["thing"] == {"ok": True}  # published with the facts


@pytest.mark.parametrize("probe, message", [
    (lambda facts: {"ok": "yes"}, "probed host: key 'sections.thing.ok' must be true or false, got 'yes' "
                                  "(facts section of plugin 'owner')"),
    (lambda facts: 1 / 0, "gpudask plugin 'owner' failed in the probe of facts section 'thing': ZeroDivisionError: "),
])
def test_a_probe_that_fails_or_returns_what_its_schema_refuses_is_one_line(monkeypatch, probe, message):
    monkeypatch.setenv("GPUDASK_PROBED_FACTS", (HOSTS / "single-gpu.json").read_text())
    with pytest.raises((FactsError, PluginError)) as info:
        bootstrap.plan_host("tcp", extra_plugins=[owner(probe=probe)])
    assert "\n" not in str(info.value) and str(info.value).startswith(message)


def test_a_described_section_its_schema_refuses_is_one_line(tmp_path):
    path = facts_file(tmp_path, "single-gpu", sections={"thing": {}})
    with pytest.raises(FactsError) as info:
        plan_for(path, "tcp", plugins=[owner()])
    assert str(info.value) == (f"{path}: key 'sections.thing.ok' is missing (expected true or false) "
                               "(facts section of plugin 'owner')")


@pytest.mark.parametrize("plugins, message", [
    ([owner(), owner(name="second")], "gpudask plugin 'second' failed in gpudask_facts_sections: facts "
                                      "section 'thing' is plugin 'owner''s; accepted: a section name of its own"),
    ([owner(schema={"type": "nothing"})], "failed in gpudask_facts_sections: facts section 'thing': its schema is "
                                          "not valid JSON Schema"),
    ([types.SimpleNamespace(name="odd", gpudask_facts_sections=hookimpl(lambda: ["thing"]))],
     "gpudask plugin 'odd' failed in gpudask_facts_sections: returned 'thing'; expected "
     "gpudask.pluginapi.FactsSection"),
])
def test_a_bad_declaration_is_refused_in_one_line(plugins, message):
    with pytest.raises(PluginError) as info:
        plan_for("single-gpu", "tcp", plugins=plugins)
    assert "\n" not in str(info.value) and message in str(info.value)


@pytest.mark.filterwarnings("ignore:unknown gpudask setting")  # rmm disabled after its defaults were registered here
def test_the_package_list_is_the_plugins(monkeypatch):
    """The core probes the packages it runs on; each plugin names the ones it reads
    (gpudask_facts_packages): rmm rmm and torch, tcp the UCX packages (libucx since ucx_info's probe reads it), scheduler-parity what it
    compares -- the keys a probe had before."""
    from gpudask.facts.probe import CORE_PACKAGES

    assert set(CORE_PACKAGES) == {"dask", "distributed", "nvidia-ml-py", "gpudask"}
    inputs = bootstrap.inputs()
    assert set(inputs.facts.packages) == {"python", "dask", "distributed", "nvidia-ml-py", "gpudask", "cupy", "rmm",
                                          "cudf", "dask-cudf", "ucxx", "libucx", "distributed-ucxx", "numba", "dask-cuda",
                                          "torch"}
    wanted = inputs.manager.facts_packages()
    assert wanted["rmm"] == ["rmm", "rmm-cu12", "rmm-cu13"] and "distributed-ucxx" in wanted
    bootstrap.reset()
    from gpudask import facts as F

    F.clear_cache()
    monkeypatch.setenv("GPUDASK_DISABLE_PLUGINS", "scheduler-parity,rmm")
    assert "cudf" not in bootstrap.inputs().facts.packages and "torch" not in bootstrap.inputs().facts.packages
    bad = types.SimpleNamespace(name="bad", gpudask_facts_packages=hookimpl(lambda: {"x": "x-dist"}))
    with pytest.raises(PluginError, match="failed in gpudask_facts_packages: returned {'x': 'x-dist'}; expected"):
        bootstrap.inputs(extra_plugins=[bad])


def test_a_third_party_section_is_read_beside_the_built_in_ones(tmp_path):
    """A plugin's section in a described host's ``sections``, beside the built-in plugins'."""
    data = json.loads((HOSTS / "partial-nvlink.json").read_text())
    data["sections"]["thing"] = {"ok": False}
    host = plan_for(facts_file(tmp_path, data), "tcp", plugins=[owner()])
    assert host.facts.section("thing") == {"ok": False}
    assert host.facts.section("nvlink") == {"peers": {"0": [1], "1": [0], "2": [3], "3": [2]}}
    assert "thing={'ok': False}" in [r.decision for r in host.workers[0].reasons]
    del data["sections"]["thing"]
    host = plan_for(facts_file(tmp_path, data), "tcp", plugins=[owner()])
    assert host.facts.section("thing") is None  # a described host without it: None


def test_a_summary_is_on_the_host_line_of_gpudask_info():
    from gpudask.cli.report import plan_summary, plan_table

    plugin = types.SimpleNamespace(name="summed", priority=300)
    plugin.gpudask_facts_sections = hookimpl(lambda: [FactsSection(
        "summed", SCHEMA, lambda f: {"ok": True}, summary=lambda v: "summed unknown" if v is None else f"ok={v['ok']}")])
    host = plan_for("hgx-4gpu-2ib", "ucx", plugins=[plugin])
    for text in (plan_summary(host, width=None), plan_table(host, width=None)):
        assert "driver 570.86.15, 2 active InfiniBand port(s), summed unknown" in text


def test_a_section_that_decides_nothing_is_probed_only_when_read():
    """``decides=False`` (the nvlink plugin's peers): on a real host the probe runs, and its
    value is validated, when the section is first read -- not in every process that reads facts."""
    from gpudask.facts import facts_from_dict
    from gpudask.facts.sections import with_sections

    calls = []
    lazy = FactsSection("lazy", SCHEMA, lambda facts: calls.append(1) or {"ok": True}, decides=False)
    bad = FactsSection("bad-lazy", SCHEMA, lambda facts: {"ok": "yes"}, decides=False)
    probed = facts_from_dict(json.loads((HOSTS / "single-gpu.json").read_text()), "probed")
    facts = with_sections(probed, [("lazy-owner", lazy), ("bad-owner", bad)])
    assert calls == [] and "lazy" not in facts.to_dict().get("sections", {})
    assert facts.section("lazy") == {"ok": True} and facts.section("lazy") == {"ok": True}
    assert len(calls) <= 1  # once per process (a probe's value is memoised)
    assert facts.to_dict()["sections"]["lazy"] == {"ok": True}  # published once read
    with pytest.raises(FactsError) as e:
        facts.section("bad-lazy")
    assert "sections.bad-lazy.ok" in str(e.value) and "plugin 'bad-owner'" in str(e.value)
    # a described host's file is read and validated as any section
    described = with_sections(facts_from_dict(json.loads((HOSTS / "single-gpu.json").read_text()), "x.json"),
                              [("lazy-owner", lazy)])
    assert described.section("lazy") is None and described.deferred == {}


def test_the_nvlink_peers_decide_nothing():
    from gpudask.plugins.ucx import nvlink_facts

    assert [s.decides for s in nvlink_facts.SECTIONS] == [False]


def test_decides_must_be_a_bool():
    plugin = types.SimpleNamespace(name="odd", priority=300)
    plugin.gpudask_facts_sections = hookimpl(lambda: [FactsSection("odd", SCHEMA, lambda f: {"ok": True},
                                                                   decides="no")])
    with pytest.raises(PluginError, match="decides: a bool"):
        plan_for("single-gpu", "tcp", plugins=[plugin])


def test_every_built_in_section_schema_is_json_schema():
    """A start does not check the built-in plugins' section schemas against the meta-schema
    (a third party's are: tests below); this test does, for every built-in section."""
    import jsonschema

    from gpudask.plugin.manager import PluginManager
    from gpudask.plugin.registration import BUILTIN_DISTRIBUTION

    manager = PluginManager.from_environment()
    sections = manager.facts_sections()
    assert {section.name for _, section in sections} >= {"ucx_info", "nvlink", "infiniband"}, sections
    distribution = {p.name: p.distribution for p in manager.plugins}
    for plugin, section in sections:
        assert distribution[plugin] == BUILTIN_DISTRIBUTION
        jsonschema.Draft202012Validator.check_schema(dict(section.schema))


def test_a_third_party_section_schema_that_is_not_json_schema_is_refused():
    from gpudask.errors import PluginError
    from gpudask.facts.sections import check_declared
    from gpudask.pluginapi import FactsSection

    bad = FactsSection("mine", {"type": "no-such-type"}, probe=lambda facts: None)
    with pytest.raises(PluginError, match="mine"):
        check_declared("third", "third-dist", [bad], {})
    assert check_declared("builtin", "gpudask", [bad], {}) == [bad]  # the suite checks the built-in ones

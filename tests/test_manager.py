"""Plugin manager: discovery, priority order, allow/deny, failures, tracing."""

from __future__ import annotations

import re
import subprocess
import sys
import types

import pytest

from gpudask import hookimpl
from gpudask.errors import ConfigError, PluginError
from gpudask.plugin.manager import PluginManager
from gpudask.plan import ProcessPlan

BUILTINS = {"tcp", "nvlink", "infiniband", "rmm", "forkserver", "cuda-context", "gpu-pinning", "cpu-affinity",
            "scheduler-parity", "gpu-dask-defaults", "worker-memory", "spill", "gpu-graph-data"}


def make_plugin(name, priority=500, **hooks):
    mod = types.SimpleNamespace(name=name, priority=priority)
    for hook_name, fn in hooks.items():
        setattr(mod, hook_name, hookimpl(fn))
    return mod


def test_builtins_come_from_the_tuple_in_code_in_priority_order():
    from gpudask.plugin.manager import BUILTIN_PLUGINS

    assert {name for name, _ in BUILTIN_PLUGINS} == BUILTINS
    m = PluginManager.from_environment()
    assert BUILTINS <= set(m.names())
    assert all(p.source == "builtin" and p.distribution == "gpudask" for p in m.plugins if p.name in BUILTINS)
    keys = [(p.priority, p.name) for p in m.plugins]
    assert keys == sorted(keys)


def test_ties_are_broken_by_name_and_lower_priority_runs_first():
    calls = []
    m = PluginManager()
    for name, prio in [("zeta", 5), ("alpha", 5), ("first", 1)]:
        m.register(make_plugin(name, prio, gpudask_plan_process=lambda plan, n=name: calls.append(n)))
    m.plan_process(None, ProcessPlan("worker", 0))
    assert calls == ["first", "alpha", "zeta"]


@pytest.mark.parametrize("priority", [-1, 1001, "10", 2.5, True])
def test_priority_range_is_checked(priority):
    with pytest.raises(PluginError, match="priority must be an integer from 0 to 1000"):
        PluginManager().register(make_plugin("bad", priority))


def test_unknown_hook_name_is_refused_with_a_suggestion():
    with pytest.raises(PluginError, match="did you mean 'gpudask_select_transport'"):
        PluginManager().register(make_plugin("typo", gpudask_select_transprt=lambda ctx, plan: None))


def test_reasons_are_attributed_to_the_plugin_that_decided():
    m = PluginManager()
    m.register(make_plugin("mine", gpudask_plan_process=lambda plan: plan.set_env("X", "1", "because")))
    plan = ProcessPlan("worker", 0)
    m.plan_process(None, plan)
    assert plan.reasons[0].plugin == "mine" and plan.reasons[0].decision == "X=1"


def test_a_raising_hook_names_plugin_distribution_hook_and_cause():
    def boom(ctx, plan):
        raise RuntimeError("kaput")

    m = PluginManager()
    m.register(make_plugin("fragile", gpudask_select_transport=boom), distribution="gpudask-fragile")
    with pytest.raises(PluginError) as info:
        m.select_transport(None, ProcessPlan("worker", 0))
    text = str(info.value)
    assert "'fragile'" in text and "gpudask-fragile" in text and "gpudask_select_transport" in text
    assert "RuntimeError: kaput" in text


def test_disable_by_environment_and_config(monkeypatch):
    monkeypatch.setenv("GPUDASK_DISABLE_PLUGINS", "nvlink,rmm")
    names = PluginManager.from_environment().names()
    assert "nvlink" not in names and "rmm" not in names and "tcp" in names
    monkeypatch.delenv("GPUDASK_DISABLE_PLUGINS")
    import dask

    with dask.config.set({"gpudask.plugins.disable": ["infiniband"]}):
        assert "infiniband" not in PluginManager.from_environment().names()


def test_enable_list_keeps_only_the_named_plugins(monkeypatch):
    monkeypatch.setenv("GPUDASK_PLUGINS", "tcp,gpu-pinning")
    assert PluginManager.from_environment().names() == ["gpu-pinning", "tcp"]


def test_an_essential_plugin_stays_loaded_with_an_enable_list_and_cannot_be_disabled(monkeypatch):
    from gpudask.plugin.manager import ESSENTIAL_PLUGINS

    assert ESSENTIAL_PLUGINS == ("tcp",)
    monkeypatch.setenv("GPUDASK_PLUGINS", "gpu-pinning")
    assert PluginManager.from_environment().names() == ["gpu-pinning", "tcp"]
    monkeypatch.delenv("GPUDASK_PLUGINS")
    monkeypatch.setenv("GPUDASK_DISABLE_PLUGINS", "rmm,tcp")
    with pytest.raises(ConfigError) as info:
        PluginManager.from_environment()
    text = str(info.value)
    assert "\n" not in text and text.startswith("gpudask plugin 'tcp' is essential and cannot be disabled")
    assert "accepted in a disable list: cpu-affinity, cuda-context" in text and "tcp," not in text


def test_unknown_plugin_name_in_lists_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("GPUDASK_DISABLE_PLUGINS", "nvlnk")
    with pytest.raises(ConfigError, match="no gpudask plugin named 'nvlnk'.*did you mean 'nvlink'"):
        PluginManager.from_environment()


def test_autoload_off_keeps_builtins(monkeypatch):
    monkeypatch.setenv("GPUDASK_DISABLE_PLUGIN_AUTOLOAD", "1")
    m = PluginManager.from_environment()
    assert BUILTINS <= set(m.names())
    assert all(p.source == "builtin" for p in m.plugins)


@pytest.mark.process
def test_tracing_logs_each_hook_call():
    code = ("import types; from gpudask import hookimpl; from gpudask.apply.process import plan_host\n"
            "p = types.SimpleNamespace(name='probe', priority=7)\n"
            "p.gpudask_plan_process = hookimpl(lambda plan: plan.note('seen', 'test'))\n"
            "plan_host('tcp', 1, extra_plugins=[p])")
    env = {"GPUDASK_TRACE_PLUGINS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # the documented format (docs/troubleshooting.md): one line per plugin and call, nothing else
    assert re.search(r"^gpudask trace: gpudask_plan_process -> probe role=worker index=0: None \(\d+\.\d ms\)$",
                     out.stderr, re.M), out.stderr
    assert "gpudask trace: gpudask_plan_process -> probe role=scheduler: None (" in out.stderr
    lines = out.stderr.splitlines()
    assert all(re.match(r"gpudask trace: gpudask_\w+ -> [\w-]+( role=\w+( index=\d+)?)?: .* \(\d+\.\d ms\)$", line)
               for line in lines), [line for line in lines if "[hook]" in line][:3]
    env["GPUDASK_TRACE_PLUGINS"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert "gpudask trace" not in out.stderr


@pytest.mark.process
def test_plugin_failing_to_import_is_reported_by_name(tmp_path):
    """A real installed distribution whose entry point module raises on import."""
    dist = tmp_path / "site"
    (dist / "broken_plugin_pkg").mkdir(parents=True)
    (dist / "broken_plugin_pkg" / "__init__.py").write_text("raise ImportError('needs libfoo')\n")
    info = dist / "gpudask_broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpudask-broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[gpudask]\nbroken = broken_plugin_pkg\n")
    code = "from gpudask.cli import main; main()"
    env = {"PYTHONPATH": str(dist), "PATH": "/usr/bin:/bin"}
    line = "gpudask plugin 'broken' (from gpudask-broken) failed in import: ImportError: needs libfoo"
    # planning refuses with one line ...
    out = subprocess.run([sys.executable, "-c", code, "info"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == f"gpudask: error: {line}"
    # ... and `gpudask plugins`, the command that should show which, lists it as broken and exits 1
    out = subprocess.run([sys.executable, "-c", code, "plugins"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and line in out.stdout and "rmm" in out.stdout
    env["GPUDASK_DISABLE_PLUGINS"] = "broken"
    assert subprocess.run([sys.executable, "-c", code, "plugins"], env=env, capture_output=True,
                          timeout=60).returncode == 0


def _fake_distribution(root, dist, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """An installed distribution (dist-info with entry points) and its modules under ``root``."""
    for module, source in modules.items():
        (root / f"{module}.py").write_text(source)
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[gpudask]\n{lines}")


def test_a_third_party_plugin_loads_through_its_entry_point(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, "gpudask-extra", {"extra": "gpudask_extra_mod"},
                       {"gpudask_extra_mod": "from gpudask.pluginapi import hookimpl\nname = 'extra'\npriority = 300\n"
                                             "@hookimpl\ndef gpudask_plan_process(plan):\n    plan.note('x', 'y')\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    # the test session turns autoload off (tests/conftest.py): installed, not loaded ...
    assert "extra" not in PluginManager.from_environment().names()
    # ... unless named (pytest's -p), or with autoload on
    for name, value in (("GPUDASK_LOAD_PLUGINS", "extra"), ("GPUDASK_DISABLE_PLUGIN_AUTOLOAD", "0")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            (extra,) = [p for p in PluginManager.from_environment().plugins if p.name == "extra"]
            assert (extra.source, extra.distribution, extra.hooks) == ("entry point", "gpudask-extra",
                                                                       ["gpudask_plan_process"])
            m.setenv("GPUDASK_DISABLE_PLUGINS", "extra")  # blocked through pluggy: never imported
            assert "extra" not in PluginManager.from_environment().names()


def test_loading_a_plugin_by_name_refuses_a_name_no_entry_point_has(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, "gpudask-extra", {"extra": "gpudask_extra_mod"}, {"gpudask_extra_mod": "name = 'extra'\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("GPUDASK_LOAD_PLUGINS", "extar")
    with pytest.raises(ConfigError) as info:
        PluginManager.from_environment()
    assert "\n" not in str(info.value) and "'extar'" in str(info.value) and "did you mean 'extra'?" in str(info.value)


def test_a_third_party_plugin_with_a_builtin_name_is_refused_in_one_line(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, "gpudask-fancy-rmm", {"rmm": "fancy_rmm"},
                       {"fancy_rmm": "name = 'rmm'\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError) as info:
        PluginManager.from_environment()
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("gpudask plugin 'rmm' (from gpudask-fancy-rmm) failed in registration: ")
    assert "rmm = fancy_rmm" in text and "built-in plugin 'rmm' (gpudask.plugins.rmm.plugin)" in text


def test_plugin_error_survives_pickling():
    import pickle

    error = PluginError("rmm", "gpudask", "gpudask_setup_memory", MemoryError("out of memory"))
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is PluginError and str(again) == str(error)
    assert (again.plugin, again.distribution, again.hook) == ("rmm", "gpudask", "gpudask_setup_memory")
    assert str(again) == "gpudask plugin 'rmm' (from gpudask) failed in gpudask_setup_memory: MemoryError: out of memory"


def test_setup_memory_runs_once_per_process_and_keeps_its_result():
    from gpudask import session
    from gpudask.apply.process import setup_memory

    calls = []
    m = PluginManager()
    m.register(make_plugin("pool", gpudask_setup_memory=lambda plan: calls.append(plan.index) or {"n": len(calls)}))
    session.current().memory_setup.clear()
    try:
        first = setup_memory(m, None, ProcessPlan("worker", 0))
        again = PluginManager()  # another manager of the same process (a re-plan) gets the same answer
        again.register(make_plugin("pool", gpudask_setup_memory=lambda plan: calls.append(9) or {"n": 9}))
        assert first == {"pool": {"n": 1}}
        assert setup_memory(m, None, ProcessPlan("worker", 0)) is first
        assert setup_memory(again, None, ProcessPlan("worker", 1)) is first
        assert calls == [0]
    finally:
        session.current().memory_setup.clear()
    # the manager itself keeps nothing: it runs the hooks at every call
    assert m.setup_memory(None, ProcessPlan("worker", 2)) == {"pool": {"n": 2}}
    assert calls == [0, 2]


def _wrapping(plan):
    yield


def _plain(plan):
    return None


@pytest.mark.parametrize(("option", "fn"), [("wrapper", _wrapping), ("hookwrapper", _wrapping),
                                            ("tryfirst", _plain), ("trylast", _plain)])
def test_hookimpl_options_gpudask_does_not_run_are_refused_in_one_line(option, fn):
    plugin = types.SimpleNamespace(name="eager", priority=900,
                                   gpudask_plan_process=hookimpl(**{option: True})(fn))
    m = PluginManager()
    with pytest.raises(PluginError) as info:
        m.register(plugin, distribution="gpudask-eager")
    text = str(info.value)
    assert "\n" not in text
    assert text == (f"gpudask plugin 'eager' (from gpudask-eager) failed in registration: gpudask_plan_process "
                    f"is marked {option}=True, which gpudask does not run; accepted: a plain @hookimpl, ordered by "
                    "the plugin's integer 'priority' (0-1000, lower first)")
    # nothing of the refused plugin stays registered: the same name registers again, plainly
    assert m.names() == []
    m.register(make_plugin("eager", 900, gpudask_plan_process=_plain))
    assert m.names() == ["eager"]


def test_priority_order_holds_whatever_the_registration_order():
    """pluggy alone calls the last registered first; gpudask calls by priority, then name."""
    calls = []
    m = PluginManager()
    for name, prio in [("first", 1), ("last", 900), ("middle", 40), ("also-middle", 40)]:
        m.register(make_plugin(name, prio, gpudask_validate=lambda ctx, n=name: calls.append(n)))
    m.validate(None)
    assert calls == ["first", "also-middle", "middle", "last"]
    calls.clear()
    m.plan_process(None, ProcessPlan("worker", 0))  # a hook nobody implements calls nobody
    assert calls == []


def test_only_pluggys_public_api_is_used():
    """A guard: no pluggy internals (its private attributes, its hook execution)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1]
    private = re.compile(r"\._pm\._|_hookexec|\._hookimpls\b|_multicall|\bpluggy\._")
    found = [f"{path.relative_to(root)}:{n}: {line.strip()}"
             for folder in ("gpudask", "plugins") for path in sorted((root / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if private.search(line)]
    assert found == []


# ----------------------------------------------------------------- hook names and parameters
def test_a_hook_gpudask_does_not_have_is_refused_in_one_line():
    """pluggy would keep it pending, never called: registration refuses it, naming the nearest hook."""
    plugin = make_plugin("legacy", 300, gpudask_server_setpu=lambda ctx, plan, server: None)
    m = PluginManager()
    with pytest.raises(PluginError) as info:
        m.register(plugin, distribution="gpudask-legacy")
    assert str(info.value) == ("gpudask plugin 'legacy' (from gpudask-legacy) failed in registration: unknown hook "
                               "'gpudask_server_setpu'; did you mean 'gpudask_server_setup'?")
    assert m.names() == []


def test_the_new_parameter_names_reach_the_implementation():
    seen = []
    m = PluginManager()
    m.register(make_plugin("new-check", 400, gpudask_scheduler_check=lambda reference, subject: seen.append(
        (reference["role"], subject["role"])) or []))
    assert m.scheduler_check(None, {"role": "worker"}, {"role": "client"}) == []
    assert seen == [("worker", "client")]


def test_an_argument_the_spec_does_not_have_is_refused_in_one_line():
    """pluggy's own message is three lines; gpudask's is one, with pluggy's words."""
    with pytest.raises(PluginError) as info:
        PluginManager().register(make_plugin("odd", gpudask_validate=lambda ctx, extra: None))
    text = str(info.value)
    assert "\n" not in text and "'odd'" in text and "extra" in text and "gpudask_validate" in text


def test_hooks_are_called_through_pluggys_hook_callers_one_plugin_at_a_time():
    """Each plugin's implementation is called through pluggy (a subset hook caller holding
    it alone), so pluggy's own call monitoring sees every call, in priority order."""
    seen = []
    m = PluginManager()
    for name, prio in [("late", 9), ("early", 1)]:
        m.register(make_plugin(name, prio, gpudask_plan_process=lambda plan, n=name: plan.note(n, "called")))
    undo = m._pm.add_hookcall_monitoring(lambda hook, impls, kwargs: seen.append((hook, [i.plugin_name for i in impls])),
                                         lambda outcome, hook, impls, kwargs: None)
    plan = ProcessPlan("worker", 0)
    m.plan_process(None, plan)
    undo()
    assert seen == [("gpudask_plan_process", ["early"]), ("gpudask_plan_process", ["late"])]
    assert [(r.plugin, r.decision) for r in plan.reasons] == [("early", "early"), ("late", "late")]


def test_an_entry_points_distribution_is_pluggys_record(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, "gpudask-extra", {"extra": "gpudask_extra_mod"}, {"gpudask_extra_mod": "name = 'extra'\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("GPUDASK_LOAD_PLUGINS", "extra")
    m = PluginManager.from_environment()
    (extra,) = [p for p in m.plugins if p.name == "extra"]
    assert [(d.metadata["name"]) for obj, d in m._pm.list_plugin_distributions() if obj is extra.obj] == ["gpudask-extra"]
    assert extra.distribution == "gpudask-extra"


# ------------------------------------------------------ a worker loads what its parent loaded
def _listed(manager):
    return [(p.name, p.priority, p.source, p.distribution, p.hooks) for p in manager.plugins]


def _core():
    from gpudask.config import CORE_OPTIONS, Settings

    return Settings(CORE_OPTIONS)


def test_a_worker_loads_the_plugins_its_parent_listed_without_scanning_distributions(monkeypatch):
    import importlib.metadata

    monkeypatch.setenv("GPUDASK_DISABLE_PLUGINS", "spill")
    parent = PluginManager.from_environment(extra=[make_plugin("mine", gpudask_plan_process=lambda plan: None)])
    listed = [p.to_dict() for p in parent.plugins]
    monkeypatch.delenv("GPUDASK_DISABLE_PLUGINS")  # the parent's choice stands, not this process's lists

    def scanned():
        raise AssertionError("the installed distributions were scanned")

    monkeypatch.setattr(importlib.metadata, "distributions", scanned)
    worker = PluginManager.from_plan_plugins(listed, core=_core())
    # the built-ins the parent loaded, as they were; the object it registered itself is not here
    assert _listed(worker) == [row for row in _listed(parent) if row[0] != "mine"]
    assert "spill" not in worker.names() and "mine" not in worker.names()
    # entries that are not a gpudask plugin's are passed over
    assert PluginManager.from_plan_plugins([{"name": ["x"]}, {"name": "nope", "source": "builtin"}],
                                           core=_core()).names() == []


def test_a_worker_loads_an_entry_point_its_parent_loaded(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, "gpudask-extra", {"extra": "gpudask_extra_mod"},
                       {"gpudask_extra_mod": "from gpudask.pluginapi import hookimpl\nname = 'extra'\npriority = 300\n"
                                             "@hookimpl\ndef gpudask_plan_process(plan):\n    plan.note('x', 'y')\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("GPUDASK_LOAD_PLUGINS", "extra")
    parent = PluginManager.from_environment()
    monkeypatch.delenv("GPUDASK_LOAD_PLUGINS")
    worker = PluginManager.from_plan_plugins([p.to_dict() for p in parent.plugins], core=_core())
    assert _listed(worker) == _listed(parent) and "extra" in worker.names()

"""gpudask_preimport: what the plugins name, how it is checked, and the fork server's preload
that imports it with every error caught (plan tests; the live ones are in test_plan_once.py)."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

import gpudask_forkserver
from conftest import HOSTS
from gpudask import bootstrap, hookimpl
from gpudask.apply import preimport
from gpudask.errors import PluginError
from gpudask.plugin.manager import PluginManager

UCX_MODULES = ["distributed_ucxx.ucxx", "ucxx"]


def _answers(facts_file, role, protocol):
    inputs = bootstrap.inputs(facts_path=HOSTS / facts_file)
    return inputs.manager.preimport(inputs.facts, role, protocol)


def test_a_gpu_worker_over_ucx_is_named_ucx_rmm_and_cuda_modules():
    names = _answers("single-gpu.json", "worker", "ucx")
    assert set(names) == {*UCX_MODULES, "rmm", "rmm.allocators.cupy", "cuda.core"}
    assert len(names) == len(set(names)), "each once"


def test_over_tcp_a_gpu_worker_needs_no_ucx_module():
    assert set(_answers("single-gpu.json", "worker", "tcp")) == {"rmm", "rmm.allocators.cupy", "cuda.core"}


def test_the_waiting_dask_worker_process_of_a_gpu_host_takes_ucx_as_likely():
    assert _answers("single-gpu.json", "nanny", None)[:2] == UCX_MODULES
    assert _answers("single-gpu.json", "nanny", "tcp") == []  # the protocol is known: no guess


def test_a_host_without_gpu_is_named_nothing():
    for role, protocol in (("worker", "tcp"), ("nanny", None), ("worker", "ucx")):
        assert not [m for m in _answers("no-gpu.json", role, protocol) if m != "ucxx" and "ucxx" not in m]


def _plugin(result):
    return types.SimpleNamespace(name="third", priority=300,
                                 gpudask_preimport=hookimpl(lambda facts, role, protocol: result))


@pytest.mark.parametrize("result, says", [
    ("rmm", "expected None or a list of at most 32 dotted module names"),
    (["ok", 3], "expected None or a list"),
    (["not a module"], "expected None or a list"),
    ([f"m{i}" for i in range(33)], "at most 32"),
    (["gpudask.plugins.rmm"], "a module of gpudask cannot be imported ahead"),
])
def test_what_a_plugin_names_is_checked_in_one_line(result, says):
    manager = PluginManager.from_environment(extra=[_plugin(result)])
    facts = bootstrap.inputs(facts_path=HOSTS / "single-gpu.json").facts
    with pytest.raises(PluginError, match="third.*failed in gpudask_preimport") as raised:
        manager.preimport(facts, "worker", "ucx")
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_answers_combine_in_priority_order_each_once():
    manager = PluginManager.from_environment(extra=[_plugin(["numpy", "rmm"])])
    facts = bootstrap.inputs(facts_path=HOSTS / "single-gpu.json").facts
    names = manager.preimport(facts, "worker", "ucx")
    assert names.count("rmm") == 1 and names[-1] == "numpy"


def test_the_fork_servers_preload_survives_any_import_error(tmp_path, monkeypatch):
    (tmp_path / "raises_oserror.py").write_text("raise OSError('libfoo.so: cannot open shared object file')\n")
    (tmp_path / "fine_module_for_preimport.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(gpudask_forkserver.VARIABLE, "raises_oserror,no_such_module_x,fine_module_for_preimport")
    gpudask_forkserver._preimport()  # what the server runs at its preload: nothing escapes
    assert "fine_module_for_preimport" in sys.modules and "raises_oserror" not in sys.modules
    assert gpudask_forkserver.VARIABLE not in __import__("os").environ  # the workers do not inherit it


def test_the_background_import_says_what_failed_and_finds_what_is_imported(tmp_path, monkeypatch):
    (tmp_path / "raises_runtime.py").write_text("raise RuntimeError('no device')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert preimport.import_all(["json", "raises_runtime"]) == ["raises_runtime"]
    assert preimport.found_imported(["json", "raises_runtime", "no_such_module_y"]) == ["json"]
    assert preimport.in_background(["json"]) is None  # nothing left to import: no thread


def test_the_fork_server_keeps_gpudask_modules_but_not_the_package_module(monkeypatch):
    """The fork server imports gpudask's modules named in its list and leaves the package module
    out, so a forked worker's own ``import gpudask`` runs its __init__ (which applies its plan);
    a process that had gpudask already (the nanny importing gpudask_forkserver) keeps it."""
    import gpudask

    monkeypatch.setenv(gpudask_forkserver.VARIABLE, "gpudask.errors")
    gpudask_forkserver._preimport()
    assert sys.modules["gpudask"] is gpudask  # had it: kept
    monkeypatch.delitem(sys.modules, "gpudask")  # a fork server: gpudask not imported yet
    monkeypatch.delitem(sys.modules, "gpudask.errors")
    monkeypatch.setenv(gpudask_forkserver.VARIABLE, "gpudask.errors")
    gpudask_forkserver._preimport()
    assert "gpudask" not in sys.modules and "gpudask.errors" in sys.modules
    fresh = importlib.import_module("gpudask")  # what the forked worker's import runs
    assert fresh is not gpudask and fresh.errors is sys.modules["gpudask.errors"]  # bound on first use

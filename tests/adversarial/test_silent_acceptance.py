"""What was accepted without a word (issue 40, item 4): two distributions declaring one
plugin name in the ``gpudask`` entry point group (pluggy loaded whichever it met first and
skipped the other), and a worker running another gpudask version than the scheduler."""

from __future__ import annotations

import importlib
import sys

import pytest

from gpudask.errors import PluginError


def _distribution(site, dist: str, entry: str, module: str) -> None:
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[gpudask]\n{entry} = {module}\n")
    (site / f"{module}.py").write_text("name = 'fast'\n")


def test_two_distributions_declaring_one_plugin_name_are_refused_in_one_line(tmp_path, monkeypatch):
    from gpudask.plugin.registration import select

    _distribution(tmp_path / "a", "gpudask-fast-a", "fast", "fast_a")
    _distribution(tmp_path / "b", "gpudask-fast-b", "fast", "fast_b")
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    importlib.invalidate_caches()
    with pytest.raises(PluginError) as e:
        select()
    text = str(e.value)
    assert "\n" not in text and "fast = fast_b (gpudask-fast-b)" in text and "gpudask-fast-a declares too" in text
    assert "uninstall one of them" in text


def test_one_distribution_found_twice_on_the_path_is_not_a_clash(tmp_path, monkeypatch):
    from gpudask.plugin.registration import select

    _distribution(tmp_path / "a", "gpudask-fast", "fast", "fast_a")
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.setenv("GPUDASK_LOAD_PLUGINS", "fast")
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    assert ("fast", "gpudask-fast") in select().entry_points


def test_a_worker_with_another_gpudask_version_is_a_warning():
    """Before: a worker publishing gpudask 0.0.9 to a 0.1.0 scheduler matched without a word."""
    import json
    import pathlib

    from conftest import host, plan_on

    from gpudask._version import __version__
    from gpudask.checks import evaluate_worker, local_side
    from gpudask.facts import load_facts

    facts_path = host("h200-single.json")
    plan = plan_on(facts_path, "tcp")
    manager, ctx = plan.ctx.manager, plan.ctx
    scheduler = local_side(load_facts(facts_path), "scheduler", "tcp://s:1", "tcp")
    facts = json.loads(pathlib.Path(facts_path).read_text())
    same = {"facts": facts, "protocol": "tcp", "version": __version__}
    other = {**same, "version": "0.0.9"}
    findings, _ = evaluate_worker(manager, ctx, scheduler, "tcp://w:1", {"gpudask": same})
    assert "gpudask-version" not in {f.code for f in findings}
    findings, _ = evaluate_worker(manager, ctx, scheduler, "tcp://w:1", {"gpudask": other})
    (f,) = [f for f in findings if f.code == "gpudask-version"]
    assert f.severity == "warning" and f.subject == "tcp://w:1"
    assert f"the worker runs gpudask 0.0.9, the scheduler gpudask {__version__}" in f.message

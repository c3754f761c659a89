"""The published shape of a process's plan and applied state is a typed part of the plugin
API (``gpudask.pluginapi.Published`` and the types it names): what a worker publishes holds
to it, key for key."""

from __future__ import annotations

import typing
from typing import Any, get_args, get_origin, get_type_hints, is_typeddict

from conftest import host

from gpudask import pluginapi


def _problems(value: Any, kind: Any, where: str) -> list[str]:
    """Where ``value`` leaves ``kind`` (a TypedDict's keys, recursively; lists and dicts of them)."""
    if is_typeddict(kind):
        if not isinstance(value, dict):
            return [f"{where}: a {type(value).__name__}, not a dict"]
        hints = get_type_hints(kind)
        out = [f"{where}: no key {k!r}" for k in sorted(kind.__required_keys__ - set(value))]
        out += [f"{where}: key {k!r} is not in {kind.__name__}" for k in sorted(set(value) - set(hints))]
        for k in set(value) & set(hints):
            out += _problems(value[k], hints[k], f"{where}.{k}")
        return out
    origin, args = get_origin(kind), get_args(kind)
    if origin is list and args:
        return [p for i, item in enumerate(value or []) for p in _problems(item, args[0], f"{where}[{i}]")]
    if origin is dict and len(args) == 2:
        return [p for k, item in (value or {}).items() for p in _problems(item, args[1], f"{where}[{k!r}]")]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        typed = [a for a in args if is_typeddict(a)]
        return _problems(value, typed[0], where) if typed and value is not None else []
    return []


def _session(protocol: str = "ucx"):
    from gpudask.apply import process, state

    plan = process.plan_host(protocol, 2, facts_path=host("workstation-2gpu-pcie.json"))
    session = process.Session("worker", plan, plan.workers[1])
    session.state = state.read(session)
    session.mismatches = state.find_mismatches(session, session.state)
    return session


def test_what_a_worker_publishes_holds_to_the_published_type():
    published = _session().published()
    assert _problems(published, pluginapi.Published, "published") == []
    assert published["plan"]["role"] == "worker" and published["plan"]["index"] == 1
    assert published["mismatches"], "nothing applied here: the planned environment is a mismatch"
    assert _problems(published["mismatches"], list[pluginapi.Mismatch], "mismatches") == []


def test_a_plan_of_every_role_holds_to_the_published_plan_type():
    from gpudask.apply import process

    plan = process.plan_host("ucx", 2, facts_path=host("dgx-8gpu-nvswitch-4ib.json"))
    for proc in [plan.scheduler, plan.nanny, plan.client, *plan.workers]:
        assert _problems(proc.to_dict(), pluginapi.PublishedPlan, proc.role) == []
    assert _problems(plan.plugins, list[pluginapi.PluginInfo], "plugins") == []


def test_the_checker_sees_a_missing_and_an_unknown_key():
    published = dict(_session("tcp").published())
    published.pop("applied")
    published["extra"] = 1
    assert _problems(published, pluginapi.Published, "p") == ["p: no key 'applied'", "p: key 'extra' is not in Published"]


def test_the_published_key_is_the_one_the_checks_read():
    from gpudask.checks import PUBLISHED_KEY

    assert pluginapi.PUBLISHED_KEY == PUBLISHED_KEY == "gpudask"

"""What gpudask holds for this one process, in one object (the base stage).

Modules keep no registries of their own: they ask :func:`current`, so one :func:`reset`
forgets everything (tests, a process that must start clean).  The counts of the costly
steps are described in docs/architecture.md.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")


@dataclass
class ProcessState:
    """This process's gpudask state: one object, made at first use, replaced by :func:`reset`."""

    # how many times this process took each costly step (module docstring)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    # key -> (value, words naming where gpudask's value came from); gpudask.config.label_source
    labels: dict[str, tuple[Any, str]] = field(default_factory=dict)
    # digests validated by any process of this user on this host (gpudask.facts.validated)
    validated: list[str] | None = None
    # the plugins' facts sections probed here (gpudask.facts.sections)
    probed_sections: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    # plan inputs built here, and their facts-free part (gpudask.bootstrap)
    plan_inputs: collections.OrderedDict[str, Any] = field(default_factory=collections.OrderedDict)
    plugins: collections.OrderedDict[str, Any] = field(default_factory=collections.OrderedDict)
    # the user's values of what gpudask applied here (gpudask.bootstrap.keep_user_values)
    kept: Any = None
    # key -> (file, value) as last merged from gpudask.toml / --config (gpudask.config_files)
    file_values: dict[str, tuple[str, Any]] = field(default_factory=dict)
    # the apply stage's session: the plan applied here, or a plan-only one (gpudask.apply.process)
    applied: Any = None
    # what gpudask_setup_memory returned, by pid: a forked child sets up its own
    memory_setup: dict[int, dict[str, Any]] = field(default_factory=dict)
    # plan-only sessions by (role, inputs), and the config keys they depend on (gpudask.apply.preload)
    plan_only: dict[tuple[str, str], Any] = field(default_factory=dict)
    plan_keys: set[str] = field(default_factory=set)
    # dask-cuda options taken from this command line: {setting: the option as given}
    taken_options: dict[str, str] = field(default_factory=dict)
    # this worker process's number once claimed late (gpudask.apply.server_plugins)
    late_index: int | None = None
    # what gpudask_preimport named that the fork server had imported (process.start_worker)
    preimported: list[str] = field(default_factory=list)
    # what each plugin keeps for this process, by the plugin's name (:func:`plugin_state`)
    plugin_states: dict[str, Any] = field(default_factory=dict)
    # results of pure computations kept by name, each bounded (:func:`remembered`)
    memos: dict[str, collections.OrderedDict[Any, Any]] = field(default_factory=dict)

    def startup_counts(self) -> dict[str, Any]:
        """The counts published with a process's applied state."""
        with _LOCK:
            counts = dict(self.counts)
        return {"bootstrap": counts.get("bootstrap", 0), "facts_read": counts.get("facts read", 0),
                "facts_schema": counts.get("facts schema", 0),
                "parsed": {k[len("parsed "):]: n for k, n in sorted(counts.items()) if k.startswith("parsed ")},
                "preimported": list(self.preimported)}


_LOCK = threading.RLock()  # the scheduler check plans off the event loop, in threads
_STATE: ProcessState | None = None


def current() -> ProcessState:
    """This process's state (made at first use)."""
    global _STATE
    with _LOCK:
        if _STATE is None:
            _STATE = ProcessState()
        return _STATE


def reset() -> ProcessState:
    """Forget everything this process held; the new state."""
    global _STATE
    with _LOCK:
        _STATE = ProcessState()
        return _STATE


def count(what: str) -> None:
    """Count one costly step of this process (module docstring)."""
    state = current()
    with _LOCK:
        state.counts[what] += 1


def plugin_state(name: str, make: Callable[[], _T]) -> _T:
    """What plugin ``name`` keeps for this process: ``make()`` at first use, forgotten by :func:`reset`."""
    state = current()
    with _LOCK:
        if name not in state.plugin_states:
            state.plugin_states[name] = make()
        return state.plugin_states[name]  # type: ignore[no-any-return]


def remembered(name: str, key: Any, make: Callable[[], _T], limit: int = 64) -> _T:
    """``make()``, kept in this process under ``name`` and ``key`` (hashable; None: not kept), for
    results that depend on the key alone: at most ``limit`` per name, the oldest forgotten
    first, all by :func:`reset`.  An exception from ``make`` is raised and nothing is kept."""
    if key is None:
        return make()
    state = current()
    with _LOCK:
        memo = state.memos.setdefault(name, collections.OrderedDict())
        if key in memo:
            return memo[key]  # type: ignore[no-any-return]
    value = make()  # outside the lock: a check plans in threads and make() may be slow
    with _LOCK:
        memo[key] = value
        while len(memo) > limit:
            memo.popitem(last=False)
    return value

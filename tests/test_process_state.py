"""The one per-process state keeps the plugins' memos too (issue 41: no module registries)."""

from __future__ import annotations

import pytest

from gpudask import session
from gpudask.pluginapi import remembered


def test_a_remembered_result_is_made_once_per_key_bounded_and_forgotten_by_reset():
    made: list[int] = []

    def make(n: int) -> int:
        made.append(n)
        return n * n

    assert [remembered("squares", n, lambda n=n: make(n), limit=2) for n in (1, 2, 1)] == [1, 4, 1]
    assert made == [1, 2]  # 1 was kept
    remembered("squares", 3, lambda: make(3), limit=2)  # the oldest (1) is forgotten
    assert remembered("squares", 1, lambda: make(1), limit=2) == 1 and made == [1, 2, 3, 1]
    assert remembered("squares", None, lambda: make(5)) == 25 and remembered("squares", None, lambda: make(5)) == 25
    assert made[-2:] == [5, 5]  # key None: never kept
    session.reset()
    remembered("squares", 2, lambda: make(2))
    assert made[-1] == 2  # the reset forgot it


def test_a_failing_computation_is_raised_and_not_kept():
    calls: list[str] = []

    def fail() -> int:
        calls.append("x")
        raise ValueError("bad data")

    for _ in range(2):
        with pytest.raises(ValueError, match="bad data"):
            remembered("failing", "k", fail)
    assert calls == ["x", "x"] and remembered("failing", "k", lambda: 7) == 7


def test_the_scheduler_check_validates_the_same_published_facts_once(own_state_dir):
    from gpudask.checks.sides import _valid_facts
    from gpudask.facts import probe_facts

    published = probe_facts().to_dict()
    session.reset()
    first = _valid_facts(published, "worker")
    before = session.current().counts["facts schema"]
    again = _valid_facts(dict(published), "worker")  # equal data from another worker
    assert before >= 1 and again is first and session.current().counts["facts schema"] == before
    with pytest.raises(ValueError, match="facts of the worker"):
        _valid_facts({**published, "gpus": "eight"}, "worker")

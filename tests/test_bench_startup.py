"""The start-up bench (``python -m gpudask_bench.startup``): its figures are the pairs' own."""

from __future__ import annotations

import pytest

startup = pytest.importorskip("gpudask_bench.startup")


def test_the_ratio_is_taken_pair_by_pair_and_each_side_keeps_its_spread():
    plain = [1.0, 2.0, 4.0, 1.5]
    preloaded = [1.1, 2.4, 4.0, 3.0]  # a slow machine in pair 3 moves neither side's median much
    figures = startup.summarize(plain, preloaded)
    assert figures["pairs"] == 4
    assert figures["ratio"]["median"] == pytest.approx((1.1 + 1.2) / 2)
    assert figures["ratio"]["max"] == pytest.approx(2.0) and figures["ratio"]["min"] == pytest.approx(1.0)
    assert figures["plain_s"] == {"min": 1.0, "median": 1.75, "max": 4.0, "q1": 1.125, "q3": 3.5}
    assert figures["ratio_of_medians"] == pytest.approx(2.7 / 1.75)


def test_the_report_says_whether_gpudask_loads_from_bytecode(monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    found = startup.bytecode()
    assert set(found) == {"gpudask", "gpudask.plugins", "PYTHONDONTWRITEBYTECODE"}
    assert found["PYTHONDONTWRITEBYTECODE"] == "1" and all(isinstance(found[k], bool) for k in ("gpudask",
                                                                                                  "gpudask.plugins"))


def test_the_launch_ends_at_the_schedulers_own_line_for_the_last_worker():
    log = ("2026-12-02 21:56:21,100 - distributed.scheduler - INFO -   Scheduler at: tcp://127.0.0.1:1\n"
           "2026-12-02 21:56:21,877 - distributed.scheduler - INFO - Register worker addr: tcp://127.0.0.1:2 name: 0\n"
           "2026-12-02 21:56:21,883 - distributed.scheduler - INFO - Register worker addr: tcp://127.0.0.1:3 name: 1\n")
    first, second = startup.last_registration(log, 1), startup.last_registration(log, 2)
    assert second - first == pytest.approx(0.006, abs=1e-6)
    assert startup.last_registration(log, 3) is None  # fewer lines: the client's figure is used

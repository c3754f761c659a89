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

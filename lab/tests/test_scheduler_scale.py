"""lab/bench/scheduler-scale.py: the scale figure's harness (docs/benchmarks.md, "Scheduler cost at scale").

No figure is asserted (no timed tests): these hold that the harness measures what it says,
real gpudask workers as the scheduler sees them, every one of them checked.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from conftest import base_env

BENCH = pathlib.Path(__file__).parents[1] / "bench"  # lab/bench


@pytest.mark.process
def test_hosted_workers_look_to_the_scheduler_as_real_gpudask_workers():
    out = subprocess.run([sys.executable, str(BENCH / "scheduler-scale-compare.py")], env=base_env(),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "worker 0: 0 difference(s)" in out.stdout and "worker 1: 0 difference(s)" in out.stdout
    assert "2 real vs 2 hosted workers" in out.stdout


@pytest.mark.process
def test_every_gpudask_worker_is_checked_and_no_plain_one(tmp_path):
    result = tmp_path / "scale.json"
    out = subprocess.run([sys.executable, str(BENCH / "scheduler-scale.py"), "--workers", "3,5", "--repeat", "1",
                          "--hosts", "2", "--json", str(result), "--pycache", str(tmp_path / "pycache")],
                         env=base_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(result.read_text())
    trials = {(t["mode"], t["n"]): t for t in data["trials"]}
    assert set(trials) == {(m, n) for m in ("plain", "gpudask") for n in (3, 5)}
    for (mode, n), t in trials.items():
        assert t["checked"] == (n if mode == "gpudask" else 0)
        assert t["check_status"] == ({"ok": n} if mode == "gpudask" else {})
        assert t["cpu_total_s"] == pytest.approx(t["cpu_startup_s"] + t["cpu_joins_s"])
    assert [r["n"] for r in data["rows"]] == [3, 5]
    assert "N  plain CPU s  gpudask CPU s  ratio" in out.stdout

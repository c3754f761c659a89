"""bench/shapes.py: the shape matrix's harness (issue 29), in its CPU dry-run form.

No figure is asserted: this holds that one shape starts on both sides at once (on a CPU the
reference side is stock distributed: dask-cuda needs a GPU), every path of every size is measured
with the two sides' repetitions alternated and checked against its source, and the rows have the
keys the device record needs.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from conftest import base_env

BENCH = pathlib.Path(__file__).parent.parent / "bench"
PATHS = ["client-via-scheduler", "client-direct", "worker-pull", "submit-arg"]


@pytest.mark.process
def test_cpu_dry_run_of_one_shape_measures_and_checks_every_cell(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "shapes.py"), "--out", str(tmp_path), "--cpu",
                          "--shapes", "one-command-2w", "--sizes", "64KiB,1MiB", "--reps-client", "2",
                          "--reps-pull", "3", "--max-seconds", "80"],
                         env=base_env(), capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads((tmp_path / "shapes.json").read_text())
    meta, rows = data[0]["meta"], data[1:]
    assert meta["cpu_dry_run"] is True and "distributed" in meta["versions"] and meta["date"]
    side = meta["sides"]["one-command-2w/gpudask"]
    assert side["errors"] is None, side
    assert side["workers"] == 2
    assert side["commands"] == ["dask scheduler --protocol ucx --preload gpudask",
                                "dask worker --nworkers 2 --preload gpudask"]
    ref = meta["sides"]["one-command-2w/dask-cuda"]
    assert ref["errors"] is None and ref["workers"] == 2, ref
    assert ref["commands"] == ["dask scheduler --protocol ucx", "dask worker --nworkers 1  # --cpu: no dask-cuda",
                               "dask worker --nworkers 1  # --cpu: no dask-cuda"]
    assert [(r["path"], r["size"]) for r in rows] == [(p, s) for s in ("64KiB", "1MiB") for p in PATHS]
    for r in rows:
        assert {"shape", "path", "size", "size_bytes", "gpudask_s", "dask-cuda_s", "ratio", "result_match",
                "gpudask_env", "dask-cuda_env", "notes"} <= set(r), r
        assert r["shape"] == "one-command-2w"
        assert r["gpudask_s"] > 0, r
        assert r["gpudask"]["checksum_ok"] is True, r
        assert r["gpudask"]["checksum"].startswith(f"numpy:float64:{r['size_bytes']}:")
        assert r["dask-cuda_s"] > 0 and r["ratio"] is not None, r
        assert r["result_match"] is True and r["notes"] is None, r
        # alternated: both sides ran the same number of rounds, each one timed repetition a round
        assert r["gpudask"]["reps"] == r["dask-cuda"]["reps"] >= 1, r
        assert set(r["gpudask_env"]) == {"w0", "w1"} and "UCX_TLS" in r["gpudask_env"]["w0"]
    lines = [json.loads(ln) for ln in (tmp_path / "shapes.jsonl").read_text().splitlines()]
    assert [ln["type"] for ln in lines].count("row") == len(rows)
    assert "one-command-2w" in out.stdout and "worker-pull" in out.stdout

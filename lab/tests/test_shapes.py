"""lab/bench/shapes.py: the shape matrix's harness (issue 29), in its CPU dry-run form.

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

BENCH = pathlib.Path(__file__).parents[1] / "bench"  # lab/bench
PATHS = ["client-via-scheduler", "client-direct", "worker-pull", "submit-arg"]


@pytest.mark.process
def test_cpu_dry_run_of_one_shape_measures_and_checks_every_cell(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "shapes.py"), "--out", str(tmp_path), "--cpu",
                          "--shapes", "one-command-2w", "--sizes", "64KiB,1MiB", "--reps-client", "2",
                          "--reps-pull", "3", "--max-seconds", "80",
                          "--gpudask-env", "DASK_GPUDASK__RMM__POOL_SIZE=false", "--sample", "client-direct",
                          "--work", str(tmp_path / "work")],
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
        # a lever reaches every process of the gpudask side, and only those
        assert r["gpudask_env"]["w1"]["DASK_GPUDASK__RMM__POOL_SIZE"] == "false"
        assert "DASK_GPUDASK__RMM__POOL_SIZE" not in r["dask-cuda_env"]["w1"]
    assert side["env"]["client"]["DASK_GPUDASK__RMM__POOL_SIZE"] == "false"
    assert side["env"]["scheduler"]["DASK_GPUDASK__RMM__POOL_SIZE"] == "false"
    lines = [json.loads(ln) for ln in (tmp_path / "shapes.jsonl").read_text().splitlines()]
    assert [ln["type"] for ln in lines].count("row") == len(rows)
    assert "one-command-2w" in out.stdout and "worker-pull" in out.stdout
    # --sample: each side's client process sampled during that path's timed repetitions, and only that path's
    for s in ("gpudask", "dask-cuda"):
        samples = json.loads((tmp_path / "work" / f"one-command-2w-{s}.jsonl.samples.json").read_text())
        assert samples["side"] == s and sorted(samples["cells"]) == ["client-direct/1MiB", "client-direct/64KiB"]
        threads = samples["cells"]["client-direct/1MiB"]["threads"]
        # the client's event loop runs in distributed's "IO loop" thread: its stacks were read
        assert threads["IO loop"]["samples"] > 0 and threads["IO loop"]["inclusive"], threads.keys()


def _run(rows: list[dict]) -> dict:
    return {"meta": {"date": "d"}}, rows


def _row(shape, g_times, d_times, g_sum="s", d_sum="s"):
    import statistics
    g, d = statistics.median(g_times), statistics.median(d_times)
    return {"shape": shape, "path": "client-direct", "size": "1MiB", "size_bytes": 2**20, "gpudask_s": g,
            "dask-cuda_s": d, "ratio": round(g / d, 3), "result_match": g_sum == d_sum, "notes": None,
            "gpudask": {"times": g_times, "reps": len(g_times), "checksum": g_sum, "checksum_ok": True},
            "dask-cuda": {"times": d_times, "reps": len(d_times), "checksum": d_sum, "checksum_ok": True}}


def test_pooled_runs_count_each_run_once_with_its_sides_paired_and_keep_each_run():
    sys.path.insert(0, str(BENCH))
    try:
        import shapes_pool
    finally:
        sys.path.remove(str(BENCH))
    first = [_row("local", [1.0, 1.2, 1.4], [1.0, 1.0, 1.0]), _row("one-command-2w", [2.0], [2.0])]
    second = [_row("local", [0.8, 0.9, 1.0], [1.1, 1.2, 1.3])]
    rows = shapes_pool.pool([({"meta": 1}, first), ({"meta": 2}, second)])
    local = rows[0]
    # each run once, its sides paired: geometric means of the runs' medians (1.2 and 0.9; 1.0 and 1.2),
    # whose ratio is the geometric mean of the runs' ratios (1.2 and 0.75), whatever the repetitions
    assert (local["gpudask_s"], local["dask-cuda_s"], local["ratio"]) == (1.03923, 1.095445, 0.949)
    assert local["ratio"] == round((1.2 * 0.75) ** 0.5, 3)
    assert local["reps"] == {"gpudask": 6, "dask-cuda": 6}
    assert [r["ratio"] for r in local["runs"]] == [1.2, 0.75] and local["result_match"] is True
    assert rows[1]["notes"] == "not in run(s) [1]"
    # a checksum that differs between the runs is a mismatch, whatever each run said
    odd = shapes_pool.pool([({}, [_row("local", [1.0], [1.0])]), ({}, [_row("local", [1.0], [1.0], "t", "t")])])
    assert odd[0]["result_match"] is False


def test_one_lever_run_of_a_levers_file_is_pooled_as_a_run_with_its_meta(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import shapes_pool
    finally:
        sys.path.remove(str(BENCH))
    lines = [{"lever": "base-1", "run": 1, "meta": {"versions": {"gpudask": "x"}}},
             {"lever": "base-1", "run": 1, **_row("local", [1.0], [2.0])},
             {"lever": "pool-off-1", "run": 2, **_row("local", [9.0], [1.0])},
             {"lever": "base-2", "run": 3, **_row("local", [4.0], [2.0])}]
    levers = tmp_path / "levers.jsonl"
    levers.write_text("".join(json.dumps(x) + "\n" for x in lines))
    meta, rows = shapes_pool.load(f"{levers}#base-1")
    assert meta == {"lever": "base-1", "source": str(levers), "versions": {"gpudask": "x"}}
    assert rows == [_row("local", [1.0], [2.0])]
    # a file without the meta line (written before it was kept) still names where the run came from
    assert shapes_pool.load(f"{levers}#base-2")[0] == {"lever": "base-2", "source": str(levers)}
    pooled = shapes_pool.pool([shapes_pool.load(f"{levers}#{name}") for name in ("base-1", "base-2")])
    assert [r["ratio"] for r in pooled[0]["runs"]] == [0.5, 2.0] and pooled[0]["ratio"] == 1.0
    with pytest.raises(ValueError, match="no rows of lever 'base-9'"):
        shapes_pool.load(f"{levers}#base-9")


@pytest.mark.process
def test_a_side_that_cannot_start_is_recorded_and_the_other_side_is_measured(tmp_path):
    # a lever gpudask refuses: its scheduler stops with one line, the stock side goes on alone
    out = subprocess.run([sys.executable, str(BENCH / "shapes.py"), "--out", str(tmp_path), "--cpu",
                          "--shapes", "two-commands-1w", "--sizes", "64KiB", "--reps-client", "2", "--reps-pull", "2",
                          "--max-seconds", "80", "--gpudask-env", "DASK_GPUDASK__RMM__POOL_SIZE=lots"],
                         env=base_env(), capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads((tmp_path / "shapes.json").read_text())
    meta, rows = data[0]["meta"], data[1:]
    (error,) = meta["sides"]["two-commands-1w/gpudask"]["errors"]
    assert error["stage"] == "start" and "gpudask.rmm.pool-size = 'lots'" in error["error"], error
    assert meta["sides"]["two-commands-1w/dask-cuda"]["errors"] is None
    assert [r["path"] for r in rows] == PATHS
    for r in rows:
        assert r["gpudask_s"] is None and r["dask-cuda_s"] > 0 and r["ratio"] is None, r
        assert r["notes"].startswith("gpudask: not measured: RuntimeError: scheduler did not start"), r

"""Pool several runs of the shape matrix (lab/bench/shapes.py) into one record: each side's figure is
the geometric mean of the runs' medians, so the ratio is the geometric mean of the runs' ratios.

Why: lab/bench/shapes.py alternates the two sides' repetitions within one pair of clusters, which
takes the machine's drift out of each ratio; what is left is the pair itself.  On one H200 the
same cell of the same dask-cuda shape, started twice, differed by up to 40 % (client-direct 1 MiB:
1.86 and 2.59 ms in one call), on both sides alike: where a process lands (CPU, the moment UCX's
progress thread wakes) is fixed for a cluster's life.  Fresh pairs of clusters, pooled, average
that out.  Each run counts once, whatever its number of repetitions, and its two sides stay
paired (they were measured in the same seconds): the geometric mean of each side's per-run
medians, whose ratio is the geometric mean of the runs' ratios.  Not the median of all
repetitions together -- two runs at different levels (17 ms and 25 ms, both sides alike) made
that one bimodal, and its median fell wherever the split of each side's repetitions put it --
and not each side's median of the runs' medians, which may take the two sides from different
runs (1.17, 1.35 and 0.98 gave 1.32).  Each run's own figures stay in the row
(``runs``), so nothing is hidden.

Usage: python lab/bench/shapes_pool.py OUT.json RUN1.json RUN2.json [...] [--markdown]
       (a run may also be one lever's run of lab/bench/device-shape-levers.sh: levers.jsonl#NAME)
Output: a list whose first element is ``{"meta": {"what": ..., "runs": [each run's meta]}}`` and
then one row per (shape, path, size) with ``gpudask_s`` and ``dask-cuda_s`` (the geometric means of
the runs' medians, over the runs that measured both sides), ``ratio``, ``result_match`` (every run's checksums equal, on both sides), ``reps`` and
``runs`` ([{gpudask_s, dask-cuda_s, ratio, reps} per run]); a cell one run lacks is pooled from the
others, and says so in ``notes``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from typing import Any

SIDES = ("gpudask", "dask-cuda")


def _open_text(path: str) -> Any:
    """A run's file as text; the raw runs kept in lab/device-runs/ are gzipped (a device call carries
    the tree, 64 MiB at most)."""
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def load_lever_run(path: str, lever: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One run of lab/bench/device-shape-levers.sh (``levers.jsonl#NAME``): its rows, and its meta when the
    file holds it (earlier files did not: then the meta names the file and the run)."""
    meta: dict[str, Any] = {"lever": lever, "source": path}
    rows = []
    with _open_text(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("lever") != lever:
                continue
            if "meta" in r:
                meta = {"lever": lever, "source": path, **r["meta"]}
            elif "shape" in r:
                rows.append({k: v for k, v in r.items() if k not in ("lever", "run")})
    if not rows:
        raise ValueError(f"{path}: no rows of lever {lever!r}")
    return meta, rows


def load(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if "#" in path:
        file, _, lever = path.rpartition("#")
        return load_lever_run(file, lever)
    with _open_text(path) as f:
        data = json.load(f)
    if not (isinstance(data, list) and data and isinstance(data[0], dict) and "meta" in data[0]):
        raise ValueError(f"{path}: not a lab/bench/shapes.py record (a list whose first element is {{'meta': ...}})")
    return data[0]["meta"], data[1:]


def pool(runs: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    order: list[tuple[str, str, str]] = []
    cells: dict[tuple[str, str, str], list[tuple[int, dict[str, Any]]]] = {}
    for i, (_, rows) in enumerate(runs):
        for r in rows:
            key = (r["shape"], r["path"], r["size"])
            if key not in cells:
                cells[key] = []
                order.append(key)
            cells[key].append((i, r))
    out = []
    for key in order:
        shape, path, size = key
        got = cells[key]
        times: dict[str, list[float]] = {s: [] for s in SIDES}
        medians: dict[str, list[float]] = {s: [] for s in SIDES}
        sums: dict[str, set[str]] = {s: set() for s in SIDES}
        per_run = []
        notes = []
        ok = True
        for i, r in got:
            for s in SIDES:
                detail = r.get(s) or {}
                times[s].extend(detail.get("times") or [])
                if detail.get("checksum"):
                    sums[s].add(detail["checksum"])
                if detail.get("checksum_ok") is False:
                    ok = False
            if r.get("gpudask_s") and r.get("dask-cuda_s"):  # paired: a run counts where it measured both
                for s in SIDES:
                    medians[s].append(r[f"{s}_s"])
            per_run.append({"run": i, "gpudask_s": r.get("gpudask_s"), "dask-cuda_s": r.get("dask-cuda_s"),
                            "ratio": r.get("ratio"),
                            "reps": [(r.get(s) or {}).get("reps") for s in SIDES]})
            if r.get("notes"):
                notes.append(f"run {i}: {r['notes']}")
            if r.get("result_match") is False:
                ok = False
        med = {s: round(statistics.geometric_mean(medians[s]), 6) if medians[s] else None for s in SIDES}
        g, d = med["gpudask"], med["dask-cuda"]
        match = None
        if sums["gpudask"] and sums["dask-cuda"]:
            match = ok and len(sums["gpudask"] | sums["dask-cuda"]) == 1
        missing = [i for i in range(len(runs)) if i not in {j for j, _ in got}]
        if missing:
            notes.append(f"not in run(s) {missing}")
        out.append({"shape": shape, "path": path, "size": size, "size_bytes": got[0][1].get("size_bytes"),
                    "gpudask_s": g, "dask-cuda_s": d, "ratio": round(g / d, 3) if g and d else None,
                    "result_match": match, "reps": {s: len(times[s]) for s in SIDES}, "runs": per_run,
                    "notes": " | ".join(notes) if notes else None})
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| shape | path | size | gpudask ms | dask-cuda ms | ratio | runs' ratios | same result |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def ms(v: Any) -> str:
            return f"{v * 1e3:.3f}" if isinstance(v, (int, float)) else "-"
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        each = " / ".join(f"{x['ratio']:.2f}" if x["ratio"] is not None else "-" for x in r["runs"])
        lines.append(f"| {r['shape']} | {r['path']} | {r['size']} | {ms(r['gpudask_s'])} | {ms(r['dask-cuda_s'])} | "
                     f"{ratio} | {each} | {r['result_match']} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("runs", nargs="+")
    p.add_argument("--what", default="the shape matrix, pooled over runs of lab/bench/shapes.py")
    p.add_argument("--markdown", action="store_true", help="also print the table")
    p.add_argument("--skip-shape", action="append", default=[], metavar="PREFIX",
                   help="leave out the rows of shapes whose name starts so (e.g. control-: the controls measured "
                        "in the same runs, recorded apart)")
    args = p.parse_args()
    try:
        runs = [load(path) for path in args.runs]
    except (OSError, ValueError, json.JSONDecodeError) as e:
        print(f"shapes_pool: {e}", file=sys.stderr)
        return 2
    runs = [(meta, [r for r in rows if not r["shape"].startswith(tuple(args.skip_shape))]) for meta, rows in runs]
    rows = pool(runs)
    meta = {"what": args.what, "pooled": "each side's figure: the geometric mean of its medians in the runs that "
                                         "measured both sides (the ratio: the geometric mean of the runs' ratios); "
                                         "reps: the timed repetitions of all runs",
            "runs": [m for m, _ in runs]}
    with open(args.out, "w") as f:
        json.dump([{"meta": meta}, *rows], f, indent=1)
    both = [r for r in rows if r["ratio"] is not None]
    over = [r for r in both if r["ratio"] > 1.1]
    print(f"{len(rows)} cells, {len(both)} with both medians, {len(over)} over 1.1x, "
          f"{sum(1 for r in rows if r['result_match'] is False)} result mismatch(es); median ratio "
          f"{statistics.median(r['ratio'] for r in both) if both else '-'}")
    if args.markdown:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

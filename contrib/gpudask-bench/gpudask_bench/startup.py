"""Start-up cost of ``--preload gpudask``: stock ``dask scheduler`` + ``dask worker --nworkers N``,
plain and preloaded, launched in turn (plain, preloaded, plain, ...), each timed from the
scheduler's launch until the scheduler has registered every worker.

    python -m gpudask_bench.startup --pairs 20 [--nworkers 2] [--facts host.json] [--scheduler-first] [--json out.json]

Interleaving pairs keeps the ratio meaningful on a machine whose speed drifts (other jobs): the
figure is the median of the pair ratios.  ``--facts`` describes the host (``GPUDASK_FACTS``) for
both sides.  The waiting client is one, in this process: its imports are paid once.  Whether
gpudask loads from bytecode matters more than anything it does at start; the report says which
(``bytecode``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Any

_REGISTERED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) - distributed\.scheduler - INFO - "
                         r"Register worker ", re.MULTILINE)


def last_registration(scheduler_log: str, nworkers: int) -> float | None:
    """The epoch time of the ``nworkers``-th "Register worker" line of a scheduler's log
    (distributed's default format, local time, milliseconds), or None when there are fewer."""
    found = _REGISTERED.findall(scheduler_log)
    if len(found) < nworkers:
        return None
    stamp, millis = found[nworkers - 1]
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def _launch(preload: bool, nworkers: int, env: dict[str, str], timeout: float, scheduler_first: bool = False) -> float:
    """One cluster launch; the seconds from the scheduler's launch until it has registered
    ``nworkers`` workers, from the scheduler's log (the client's ``wait_for_workers`` asks every
    0.1 s, which would round each launch up); the client's time only if the log says nothing.
    ``scheduler_first``: the worker command is launched once the scheduler has written its file,
    and timed from its own launch (nothing of its start overlaps the scheduler's)."""
    from gpudask.testing.processes import ProcessCluster, wait_for_scheduler_file

    extra = ["--preload", "gpudask"] if preload else []
    with tempfile.TemporaryDirectory(prefix="gpudask-startup-") as d:
        cluster = ProcessCluster(d, env=env, grace=20.0)
        sched_file = cluster.scheduler_file
        wall0, t0 = time.time(), time.perf_counter()
        try:
            cluster.spawn("scheduler", [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                        "--port", "0", "--no-dashboard", "--scheduler-file", sched_file, *extra])
            if scheduler_first:
                wait_for_scheduler_file(sched_file, cluster.procs, timeout)
                wall0, t0 = time.time(), time.perf_counter()
            cluster.spawn("workers", [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                      sched_file, "--nworkers", str(nworkers), "--nthreads", "1", "--no-dashboard",
                                      *extra])
            wait_for_scheduler_file(sched_file, cluster.procs, timeout)
            with cluster.client(timeout) as client:
                client.wait_for_workers(nworkers, timeout=timeout)
                seen = time.perf_counter() - t0
            registered = last_registration(cluster.log("scheduler"), nworkers)
            return seen if registered is None else registered - wall0
        finally:
            cluster.stop()


def spread(values: list[float]) -> dict[str, float]:
    """min, median, max and the interquartile range of ``values``."""
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    return {"min": ordered[0], "median": statistics.median(ordered), "max": ordered[-1],
            "q1": quartiles[0], "q3": quartiles[2]}


def bytecode() -> dict[str, Any]:
    """Do gpudask and its plugins load from bytecode here (an installed wheel), or are their
    sources compiled in every process (an editable install without ``__pycache__``)?"""
    import importlib.util

    found = {}
    for name in ("gpudask", "gpudask.plugins"):
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        found[name] = bool(origin) and os.path.exists(importlib.util.cache_from_source(origin))
    return {**found, "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE")}


def summarize(plain: list[float], preloaded: list[float]) -> dict[str, Any]:
    """The figures of paired runs: each side's spread and the pair ratios' (preloaded / plain)."""
    ratios = [b / a for a, b in zip(plain, preloaded)]
    return {"pairs": len(ratios), "plain_s": spread(plain), "preloaded_s": spread(preloaded),
            "ratio": spread(ratios), "ratio_of_medians": statistics.median(preloaded) / statistics.median(plain)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m gpudask_bench.startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--nworkers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1, help="pairs run first and not counted")
    parser.add_argument("--facts", help="a facts file describing the host (GPUDASK_FACTS) for both sides")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one launch may take")
    parser.add_argument("--scheduler-first", action="store_true",
                        help="launch each worker command once its scheduler is up, timed from its own launch")
    parser.add_argument("--json", help="write the runs and figures to this file")
    args = parser.parse_args(argv)
    from gpudask_bench.configs import GPUDASK_INTERNAL_ENV

    env = {k: v for k, v in os.environ.items() if k not in GPUDASK_INTERNAL_ENV}
    if args.facts:
        env["GPUDASK_FACTS"] = os.path.abspath(args.facts)
    load_before = os.getloadavg()
    plain: list[float] = []
    preloaded: list[float] = []
    for i in range(args.warmup + args.pairs):
        a = _launch(False, args.nworkers, env, args.timeout, args.scheduler_first)
        b = _launch(True, args.nworkers, env, args.timeout, args.scheduler_first)
        if i >= args.warmup:
            plain.append(a)
            preloaded.append(b)
            print(f"pair {i - args.warmup + 1}: plain {a:.3f} s, preloaded {b:.3f} s, ratio {b / a:.3f}",
                  flush=True)
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
              "nworkers": args.nworkers, "scheduler_first": args.scheduler_first, "facts": args.facts,
              "bytecode": bytecode(), "loadavg_before": load_before,
              "loadavg_after": os.getloadavg(), **summarize(plain, preloaded), "runs": {"plain": plain,
                                                                                       "preloaded": preloaded}}
    r, p, q = report["ratio"], report["plain_s"], report["preloaded_s"]
    print(f"{report['pairs']} pairs: plain median {p['median']:.3f} s (min {p['min']:.3f}, max {p['max']:.3f}), "
          f"preloaded median {q['median']:.3f} s (min {q['min']:.3f}, max {q['max']:.3f}); "
          f"pair ratio median {r['median']:.3f} (IQR {r['q1']:.3f}-{r['q3']:.3f}); "
          f"load {load_before[0]:.2f} -> {report['loadavg_after'][0]:.2f}; bytecode {report['bytecode']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()

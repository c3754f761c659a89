#!/usr/bin/env python
"""Do hosted workers look to the scheduler as real gpudask workers do?  (lab/bench/scheduler-scale.py)

    python lab/bench/scheduler-scale-compare.py [--facts tests/hosts/dgx-8gpu-nvswitch-4ib.json]

One ``dask scheduler --preload gpudask``; two real workers (``dask worker --nworkers 2
--preload gpudask``: a nanny host that plans, two worker processes, each claiming its
number) and two workers hosted in one process the way scheduler-scale.py hosts them
(``--per-node 2``: the same node plan).  For each worker number it compares what the
scheduler holds: ``WorkerState.extra`` (gpudask's published plan, facts, applied state,
mismatches, and the check's result) and the worker's resources.  What differs between any
two processes is left out, and listed: the pid in the applied state and the worker's
address in the check's findings.  Exit 0 when nothing else differs.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
scale = runpy.run_path(os.path.join(HERE, "scheduler-scale.py"))  # its helpers; its main() does not run

PER_PROCESS = {("gpudask", "applied", "pid")}  # differs between any two processes


def _held(dask_scheduler=None) -> dict:
    return {addr: {"nanny": ws.nanny, "extra": ws.extra, "resources": dict(ws.resources)}
            for addr, ws in dask_scheduler.workers.items()}


def diff(a, b, path=()) -> list[tuple]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in diff(a.get(k), b.get(k), (*path, k))]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, (*path, i))]
    return [] if a == b else [(path, a, b)]


def leaves(value) -> int:
    if isinstance(value, dict):
        return sum(leaves(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(leaves(v) for v in value)
    return 1


def without_address(held: dict, address: str) -> dict:
    """The check names the worker it compared (``subject``): that is its address."""
    text = json.dumps(held, default=list).replace(address, "<worker>")
    return json.loads(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--facts", default=scale["DEFAULT_FACTS"])
    ap.add_argument("--pycache", default=os.path.join(tempfile.gettempdir(), "gpudask-bench-pycache"))
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="sched-scale-compare-")
    sf = os.path.join(d, "scheduler.json")
    env = scale["bench_env"](args, d)
    from gpudask.testing import processes

    sched = processes.spawn(scale["scheduler_argv"]("gpudask", sf, None), env, os.path.join(d, "scheduler.log"), d)
    procs = [sched]
    try:
        address = processes.wait_for_scheduler_file(sf, [sched], timeout=60)
        procs.append(processes.spawn(processes.dask_command(
            "worker", "--scheduler-file", sf, "--nworkers", "2", "--nthreads", "1", "--host", "127.0.0.1",
            "--no-dashboard", "--preload", "gpudask"), env, os.path.join(d, "real.log"), d))
        hosts = scale["start_hosts"]("gpudask", 2, 2, 1, d, env)
        procs += hosts
        assert scale["join"](hosts, address) == 2
        from distributed import Client

        with Client(scheduler_file=sf, timeout=60) as c:
            c.wait_for_workers(4, timeout=120)
            held = c.run_on_scheduler(_held)
    finally:
        processes.stop(procs)
    by_kind: dict[str, dict[int, dict]] = {"real": {}, "hosted": {}}
    for address, h in held.items():
        kind = "real" if h["nanny"] else "hosted"
        by_kind[kind][h["extra"]["gpudask"]["plan"]["index"]] = without_address(
            {"extra": h["extra"], "resources": h["resources"]}, address)
    status = 0
    for index in sorted(by_kind["real"]):
        found = diff(by_kind["real"][index]["extra"], by_kind["hosted"].get(index, {}).get("extra"))
        found += diff(by_kind["real"][index]["resources"], by_kind["hosted"].get(index, {}).get("resources"))
        left_out = [f for f in found if f[0] in PER_PROCESS]
        other = [f for f in found if f[0] not in PER_PROCESS]
        print(f"worker {index}: {len(other)} difference(s)"
              + (f"; left out: {', '.join('.'.join(map(str, f[0])) for f in left_out)}" if left_out else ""))
        for path, real, hosted in other:
            print(f"  {'.'.join(map(str, path))}: real {real!r}, hosted {hosted!r}")
        status |= bool(other)
    keys = sorted(by_kind["real"][0]["extra"])
    print(f"compared: WorkerState.extra {keys} ({leaves(by_kind['real'][0])} values per worker) and resources, "
          f"{len(by_kind['real'])} real vs {len(by_kind['hosted'])} hosted workers")
    shutil.rmtree(d, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())

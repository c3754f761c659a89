"""Ready time of `dask scheduler` + `dask worker --nworkers N --preload gpudask` with the
workers forked by a fork server or spawned, interleaved run by run (docs/benchmarks.md).

    GPUDASK_FACTS=tests/hosts/h200-single.json python lab/bench/start-method.py [PAIRS] [NWORKERS] [PROTOCOL]

Ready: from launching the scheduler (the workers start right after it) until a client sees
N workers.  The only difference between the two sides is gpudask.forkserver.enabled.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time


def ready_seconds(forkserver: bool, nworkers: int, protocol: str) -> float:
    from distributed import Client

    from gpudask.testing.processes import dask_command, spawn, stop, wait_for_scheduler_file

    env = {**os.environ, "DASK_GPUDASK__FORKSERVER__ENABLED": str(forkserver).lower(),
           "UCX_WARN_UNUSED_ENV_VARS": "n"}
    with tempfile.TemporaryDirectory() as d:
        sf, log, cwd = os.path.join(d, "s.json"), os.path.join(d, "cluster.log"), os.getcwd()  # cwd: relative facts
        t0 = time.perf_counter()
        procs = [spawn(dask_command("scheduler", "--port", "0", "--no-dashboard", "--protocol", protocol,
                                    "--scheduler-file", sf, "--preload", "gpudask"), env, log, cwd),
                 spawn(dask_command("worker", "--scheduler-file", sf, "--nworkers", str(nworkers), "--nthreads", "1",
                                    "--no-dashboard", "--preload", "gpudask", "--death-timeout", "30"), env, log, cwd)]
        try:
            wait_for_scheduler_file(sf, procs, timeout=60)
            with Client(scheduler_file=sf, timeout=60) as client:
                client.wait_for_workers(nworkers, timeout=120)
                return time.perf_counter() - t0
        finally:
            stop(procs)


if __name__ == "__main__":
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    protocol = sys.argv[3] if len(sys.argv) > 3 else "tcp"
    if protocol == "ucx":
        os.environ.setdefault("UCX_TLS", "tcp")  # this process is the client
    ready_seconds(True, n, protocol)  # warm-up: file caches
    fork, spawn = [], []
    for _ in range(pairs):
        fork.append(ready_seconds(True, n, protocol))
        spawn.append(ready_seconds(False, n, protocol))
    ratios = [a / b for a, b in zip(fork, spawn)]
    print(f"{protocol}, {n} workers, {pairs} pairs, facts {os.environ.get('GPUDASK_FACTS', 'probed')}")
    print(f"fork server  median {statistics.median(fork):.2f} s  runs {' '.join(f'{x:.2f}' for x in fork)}")
    print(f"spawn        median {statistics.median(spawn):.2f} s  runs {' '.join(f'{x:.2f}' for x in spawn)}")
    print(f"ratio        median {statistics.median(ratios):.2f}")

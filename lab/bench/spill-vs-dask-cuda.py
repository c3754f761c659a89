"""The spill figure on a GPU machine: the same CuPy working set (2.5x the limit) on gpudask
workers (gpudask.spill.device-memory-limit) and on dask-cuda workers (--device-memory-limit),
one after the other in one run; spill_s and the workers' peak GPU memory (NVML) for each.

    python lab/bench/spill-vs-dask-cuda.py [LIMIT_BYTES] [OUT.json]

Needs cupy, dask-cuda and gpudask; one worker per visible GPU on each side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from gpudask_bench.spill import spill_figure


def side(name: str, worker_argv: list[str], env: dict[str, str], limit: int) -> dict:
    d = tempfile.mkdtemp(prefix=f"spill-{name}-")
    sf = os.path.join(d, "scheduler.json")
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--port", "0", "--no-dashboard",
                               "--scheduler-file", sf], stdout=open(os.path.join(d, "scheduler.log"), "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)]
    while not os.path.exists(sf):
        time.sleep(0.1)
    procs.append(subprocess.Popen([sys.executable, "-m", "dask", *worker_argv, "--scheduler-file", sf,
                                   "--death-timeout", "60"], env={**os.environ, **env},
                                  stdout=open(os.path.join(d, "worker.log"), "w"), stderr=subprocess.STDOUT,
                                  start_new_session=True))
    from distributed import Client

    try:
        with Client(scheduler_file=sf, timeout=60) as client:
            import pynvml

            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            client.wait_for_workers(n, timeout=120)
            result = spill_figure(client, limit)
            result["side"] = name
            return result
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)


def main() -> None:
    limit = int(float(sys.argv[1])) if len(sys.argv) > 1 else 8 * 10**9
    import pynvml

    pynvml.nvmlInit()
    n = pynvml.nvmlDeviceGetCount()
    results = [
        side("gpudask", ["worker", "--preload", "gpudask", "--nworkers", str(n), "--nthreads", "1"],
             {"DASK_GPUDASK__SPILL__DEVICE_MEMORY_LIMIT": str(limit)}, limit),
        side("dask-cuda", ["cuda", "worker", "--device-memory-limit", str(limit)], {}, limit),
    ]
    for r in results:
        print(f"{r['side']:10s} spill_s {r['spill_s']:.2f} s (fill {r['fill_s']:.2f}, reduce {r['reduce_s']:.2f}); "
              f"working set {r['working_set_bytes'] / 1e9:.1f} GB over {len(r['workers'])} worker(s); "
              f"peak worker GPU memory {(r['peak_worker_gpu_bytes'] or 0) / 2**30:.2f} GiB; limit {limit / 1e9:.1f} GB")
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()

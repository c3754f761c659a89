"""A small dot workload on plain `dask worker`s and on gpudask workers with one default
changed at a time: which of gpudask's defaults costs time (issue 16's regression guard).

    python lab/bench/dot-variants.py [NWORKERS]

Each variant: a fresh `dask scheduler --protocol ucx`, NWORKERS workers (default: 2, on the
visible GPUs round-robin), `x.dot(x.T).sum()` on a 12000^2 CuPy array in 2000^2 chunks,
median of 3 runs after one warm-up.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "plain": None,  # pinned by hand: CUDA_VISIBLE_DEVICES per worker, gpudask's UCX_TLS, --memory-limit split
    "gpudask": {},
    "gpudask, CuPy not on RMM": {"DASK_GPUDASK__RMM__LIBRARIES": "[]"},
    "gpudask, no pool": {"DASK_GPUDASK__RMM__POOL_SIZE": "off"},
    "gpudask, no device tier": {"DASK_GPUDASK__SPILL__DEVICE_MEMORY_LIMIT": "false"},
}


def gpus() -> int:
    import pynvml

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetCount()


def dot_seconds(sf: str, n: int) -> list[float]:
    import cupy
    import dask.array as da
    from distributed import Client, wait

    with Client(scheduler_file=sf, timeout=60) as client:
        deadline = time.time() + 120
        while len(client.scheduler_info()["workers"]) < n and time.time() < deadline:
            time.sleep(0.3)
        rs = da.random.RandomState(RandomState=cupy.random.RandomState)
        x = rs.random_sample((12000, 12000), chunks=(2000, 2000)).persist()
        wait(x)
        times = []
        for _ in range(4):
            t0 = time.perf_counter()
            float(x.dot(x.T).sum().compute())
            times.append(time.perf_counter() - t0)
        return times[1:]


def run(name: str, env: dict | None, n: int, ngpus: int) -> None:
    d = tempfile.mkdtemp()
    sf = os.path.join(d, "s.json")
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--protocol", "ucx", "--port", "0",
                               "--no-dashboard", "--scheduler-file", sf], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)]
    while not os.path.exists(sf):
        time.sleep(0.1)
    if env is None:
        for i in range(n):
            e = {**os.environ, "CUDA_VISIBLE_DEVICES": str(i % ngpus), "UCX_TLS": "tcp,cuda_copy,cuda_ipc"}
            procs.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", "--scheduler-file", sf,
                                           "--nthreads", "1", "--memory-limit", str(1 / n), "--death-timeout", "30"],
                                          env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))
    else:
        procs.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", "--scheduler-file", sf,
                                       "--nworkers", str(n), "--nthreads", "1", "--preload", "gpudask",
                                       "--death-timeout", "30"], env={**os.environ, **env},
                                      stdout=open(os.path.join(d, "w.log"), "w"), stderr=subprocess.STDOUT,
                                      start_new_session=True))
    try:
        t = dot_seconds(sf, n)
        print(f"{name:28s} median {statistics.median(t):.3f} s  runs {', '.join(f'{x:.3f}' for x in t)}",
              flush=True)
    except Exception as e:  # noqa: BLE001 - report and go on with the next variant
        print(f"{name:28s} failed: {type(e).__name__}: {e}", flush=True)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    g = gpus()
    print(f"{n} workers on {g} GPU(s)")
    for name, env in VARIANTS.items():
        run(name, env, n, g)

"""Where one worker-to-worker pull spends its time, and what each lever a plugin layer may set does to it.

A pull is what ``gather_dep`` does: ``distributed.worker.get_data_from_worker`` run inside the
receiving worker (``client.run``), so no scheduling is in the figure.  For each configuration
(a fresh cluster of one scheduler and two workers sharing the host's first GPU, or two NumPy
workers without one) it records, as one JSON line in ``OUT/pull-levers.jsonl`` as soon as the
configuration is done:

* ``pull``: best and median milliseconds per size (3 warm-ups, then ``--repeat``);
* ``breakdown`` (``--breakdown``): one instrumented pull repeated, with ``time.monotonic_ns``
  stamps taken in *both* workers (CLOCK_MONOTONIC is one clock for every process of a host):
  the receiver's request write, the sender's handler, ``to_frames``, every ``ep.send`` /
  ``ep.recv``, frame allocation, stream synchronisation, ``from_frames``, the "OK" reply --
  the median offset of each stamp from the start of the pull, in microseconds;
* ``cpu_idle``: CPU seconds per second each worker process burns while idle (progress modes
  that poll spin a core).

Usage: python lab/bench/pull-levers.py --out DIR [--array cupy|numpy] [--configs a,b] [--repeat 20]
       [--sizes 1MiB,64MiB,1GiB] [--breakdown] [--max-seconds 400]
The configurations are in ``CONFIGS`` below; ``--list`` prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

from distributed import wait

from gpudask.testing.processes import ProcessCluster, stop_all
from gpudask_bench.workers import detached, make_array, pull_times

# name -> (worker kind, environment of every process of the cluster)
CONFIGS: dict[str, tuple[str, dict[str, str]]] = {
    "gpudask": ("gpudask", {}),
    "dask-cuda": ("dask-cuda", {}),
    "polling": ("gpudask", {"UCXPY_PROGRESS_MODE": "polling"}),
    "thread-polling": ("gpudask", {"UCXPY_PROGRESS_MODE": "thread-polling"}),
    "thread": ("gpudask", {"UCXPY_PROGRESS_MODE": "thread"}),
    "thread-no-delayed": ("gpudask", {"UCXPY_PROGRESS_MODE": "thread", "UCXPY_ENABLE_DELAYED_SUBMISSION": "0"}),
    "thread-python-future": ("gpudask", {"UCXPY_PROGRESS_MODE": "thread", "UCXPY_ENABLE_PYTHON_FUTURE": "1"}),
    "offload-off": ("gpudask", {"DASK_DISTRIBUTED__COMM__OFFLOAD": "False"}),
    # the same lever through gpudask's plan (gpu-dask-defaults), taking effect in the worker processes
    "plan-offload-off": ("gpudask", {"DASK_GPUDASK__COMM__OFFLOAD_THRESHOLD": "false"}),
    "plan-offload-512MiB": ("gpudask", {"DASK_GPUDASK__COMM__OFFLOAD_THRESHOLD": "512MiB"}),
    "ipc-cache-on": ("gpudask", {"UCX_CUDA_IPC_CACHE": "y"}),
    "polling-offload-off": ("gpudask", {"UCXPY_PROGRESS_MODE": "polling", "DASK_DISTRIBUTED__COMM__OFFLOAD": "False"}),
    "rndv-get": ("gpudask", {"UCX_RNDV_SCHEME": "get_zcopy"}),
    "rndv-put": ("gpudask", {"UCX_RNDV_SCHEME": "put_zcopy"}),
    "proto-v1": ("gpudask", {"UCX_PROTO_ENABLE": "n"}),
    "dask-cuda-polling": ("dask-cuda", {"UCXPY_PROGRESS_MODE": "polling"}),
}
DEFAULT = "gpudask,dask-cuda,polling,thread-polling,offload-off,polling-offload-off,rndv-get,proto-v1"


def _size(text: str) -> int:
    from dask.utils import parse_bytes  # "1MiB", "64MiB", "1GiB", bytes

    return int(parse_bytes(text.strip()))


def _label(n: int) -> str:
    return f"{n >> 30}GiB" if n >= 2**30 else f"{n >> 20}MiB" if n >= 2**20 else f"{n >> 10}KiB"


# -- run in the workers (client.run) ------------------------------------------------------------
# the array and the pull are gpudask bench's own (gpudask_bench.workers), sent by value (detached):
# the pull figures of this script and of `gpudask bench` are one measurement
make = detached(make_array)  # (nbytes, "cupy" | "numpy", seed)
pull = detached(pull_times)  # (addr, key, reps, "cupy" | "numpy") -> seconds of each pull


def instrument(dask_worker=None) -> str:
    """Stamp the pull's steps in this process (idempotent); events go to dask_worker._pull_events."""
    import functools

    if getattr(dask_worker, "_pull_events", None) is not None:
        dask_worker._pull_events.clear()
        return "already"
    events: list[tuple[int, str]] = []
    dask_worker._pull_events = events
    stamp = time.monotonic_ns

    def around_async(owner, name, label):
        orig = getattr(owner, name)

        @functools.wraps(orig)
        async def wrapped(*a, **k):
            events.append((stamp(), label + ">"))
            try:
                return await orig(*a, **k)
            finally:
                events.append((stamp(), label + "<"))
        setattr(owner, name, wrapped)

    def around_sync(owner, name, label):
        orig = getattr(owner, name)

        @functools.wraps(orig)
        def wrapped(*a, **k):
            events.append((stamp(), label + ">"))
            try:
                return orig(*a, **k)
            finally:
                events.append((stamp(), label + "<"))
        setattr(owner, name, wrapped)

    try:
        import distributed_ucxx.ucxx as du
        from ucxx._lib_async.endpoint import Endpoint
    except ImportError:
        return "no distributed-ucxx"
    around_async(du.UCXX, "write", "write")
    around_async(du.UCXX, "read", "read")
    around_async(du, "to_frames", "to_frames")
    around_async(du, "from_frames", "from_frames")
    around_sync(du, "synchronize_stream", "sync")
    if du.device_array is not None:
        around_sync(du, "device_array", "alloc_dev")
    around_sync(du, "host_array", "alloc_host")
    around_async(Endpoint, "send", "ep.send")
    around_async(Endpoint, "recv", "ep.recv")
    handler = dask_worker.handlers["get_data"]

    @functools.wraps(handler)
    async def get_data(*a, **k):
        events.append((stamp(), "handler>"))
        try:
            return await handler(*a, **k)
        finally:
            events.append((stamp(), "handler<"))
    dask_worker.handlers["get_data"] = get_data
    return "ok"


def take_events(t0: int, t1: int, dask_worker=None) -> list[tuple[int, str]]:
    """The stamps taken between t0 and t1 (the stamps of this very reply would otherwise grow the
    next one: only the window travels, and the rest is dropped)."""
    events = [e for e in dask_worker._pull_events if t0 <= e[0] <= t1]
    dask_worker._pull_events.clear()
    return events


async def stamped_pull(addr: str, key: str, array: str, dask_worker=None) -> tuple[int, int]:
    from distributed.worker import get_data_from_worker

    dask_worker._pull_events.clear()
    t0 = time.monotonic_ns()
    r = await get_data_from_worker(dask_worker.rpc, [key], addr, who=dask_worker.address)
    if array == "cupy":
        import cupy

        cupy.cuda.runtime.deviceSynchronize()
    t1 = time.monotonic_ns()
    assert r["status"] == "OK"
    return t0, t1


def cpu_seconds() -> float:
    import resource

    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def ucx_view() -> dict[str, object]:
    out: dict[str, object] = {k: v for k, v in os.environ.items() if k.startswith(("UCX_TLS", "UCXPY_"))}
    try:
        import rmm

        out["mr"] = type(rmm.mr.get_current_device_resource()).__name__
    except Exception as e:  # noqa: BLE001 - a report, not a check
        out["mr"] = type(e).__name__
    return out


# -- the driver ------------------------------------------------------------------------------------
def breakdown(c, a: str, b: str, key: str, array: str, reps: int) -> dict[str, object]:
    """Median offset (us from the pull's start) of every stamp, named R:/S: for receiver/sender."""
    c.run(instrument, workers=[a, b])
    runs: list[list[tuple[float, str]]] = []
    totals = []
    for _ in range(reps):
        t0, t1 = c.run(stamped_pull, a, key, array, workers=[b])[b]
        got = c.run(take_events, t0, t1, workers=[a, b])
        merged = [(t, "S:" + n) for t, n in got[a]] + [(t, "R:" + n) for t, n in got[b]]
        merged.sort()
        counts: dict[str, int] = {}
        named = []
        for t, n in merged:
            counts[n] = counts.get(n, 0) + 1
            named.append(((t - t0) / 1e3, f"{n}#{counts[n]}"))
        runs.append(named)
        totals.append((t1 - t0) / 1e3)
    # the runs whose steps came in the same order (an idle comm's own traffic can add a step)
    shapes: dict[tuple[str, ...], list[list[tuple[float, str]]]] = {}
    for r in runs:
        shapes.setdefault(tuple(n for _, n in r), []).append(r)
    shape, same = max(shapes.items(), key=lambda kv: len(kv[1]))
    steps = [[n, round(statistics.median(r[i][0] for r in same), 1)] for i, n in enumerate(shape)]
    return {"total_us_median": round(statistics.median(totals), 1), "runs_same_shape": len(same),
            "runs": len(runs), "steps_us": steps}


def run_config(name: str, args, out: pathlib.Path, env_base: dict[str, str]) -> dict[str, object]:
    kind, extra_env = CONFIGS[name]
    env = {**env_base, **extra_env}
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"pull-{name}-", dir=out))
    cluster = ProcessCluster(work, env=env, grace=5)
    result: dict[str, object] = {"config": name, "kind": kind, "env": extra_env}
    t = time.monotonic()
    try:
        if kind == "gpudask":
            cluster.scheduler("--preload", "gpudask", protocol="ucx")
            cluster.worker("--nworkers", "2", "--nthreads", "1", "--preload", "gpudask")
        elif kind == "dask-cuda":
            cluster.scheduler(protocol="ucx", env={**env, "DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT": "True"})
            for i in range(2):  # two workers on the one GPU, as gpudask places them
                cluster.spawn(f"cuda-worker-{i}", [sys.executable, "-m", "dask", "cuda", "worker", "--scheduler-file",
                                                   cluster.scheduler_file, "--host", "127.0.0.1", "--no-dashboard",
                                                   "--death-timeout", "60", "--rmm-pool-size", args.pool_size],
                              env={**env, "CUDA_VISIBLE_DEVICES": "0"})
        c = cluster.client(timeout=60)
        c.wait_for_workers(2, timeout=120)
        result["ready_s"] = round(time.monotonic() - t, 2)
        a, b = sorted(c.scheduler_info()["workers"])
        result["ucx"] = c.run(ucx_view)
        figures: dict[str, object] = {}
        for n in args.sizes:
            f = c.submit(make, n, args.array, 0, workers=[a], pure=False, key=f"src-{name}-{n}")
            wait(f, timeout=60)
            ts = sorted(c.run(pull, a, f.key, args.repeat + 3, args.array, workers=[b])[b][3:])
            med = statistics.median(ts)
            figures[_label(n)] = {"best_ms": round(ts[0] * 1e3, 3), "median_ms": round(med * 1e3, 3),
                                  "GBps_median": round(n / med / 1e9, 2)}
            if args.breakdown and n in args.breakdown_sizes:
                figures[_label(n)]["breakdown"] = breakdown(c, a, b, f.key, args.array, 10)
            del f
        result["pull"] = figures
        before = c.run(cpu_seconds)
        time.sleep(args.idle_seconds)
        after = c.run(cpu_seconds)
        result["cpu_idle"] = {w[-5:]: round((after[w] - before[w]) / args.idle_seconds, 3) for w in before}
        c.close(timeout=10)
    except Exception as e:  # noqa: BLE001 - one configuration's failure is its row
        result["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        result["log_tail"] = {label: cluster.log(label)[-1500:] for label in cluster.logs}
    finally:
        cluster.stop()
        if "error" not in result:
            shutil.rmtree(work, ignore_errors=True)  # the logs come back only for a failed configuration
        result["wall_s"] = round(time.monotonic() - t, 1)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--array", choices=("cupy", "numpy"), default="cupy")
    p.add_argument("--configs", default=DEFAULT)
    p.add_argument("--sizes", default="1MiB,64MiB,1GiB")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--breakdown", action="store_true")
    p.add_argument("--breakdown-sizes", default="1MiB,64MiB")
    p.add_argument("--pool-size", default="8GB")
    p.add_argument("--idle-seconds", type=float, default=3.0)
    p.add_argument("--max-seconds", type=float, default=420)
    p.add_argument("--list", action="store_true")
    args = p.parse_args()
    if args.list:
        for k, (kind, env) in CONFIGS.items():
            print(f"{k:24} {kind:10} {env}")
        return 0
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"pull-levers: unknown configuration(s) {', '.join(unknown)}; accepted: {', '.join(CONFIGS)}",
              file=sys.stderr)
        return 2
    args.sizes = [_size(s) for s in args.sizes.split(",")]
    args.breakdown_sizes = {_size(s) for s in args.breakdown_sizes.split(",")}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env_base = {**os.environ, "PYTHONUNBUFFERED": "1", "UCX_WARN_UNUSED_ENV_VARS": "n"}
    deadline = time.monotonic() + args.max_seconds
    rc = 0
    with open(out / "pull-levers.jsonl", "a") as sink:
        for name in names:
            if time.monotonic() > deadline - 30:
                row: dict[str, object] = {"config": name, "skipped": "time box"}
            else:
                row = run_config(name, args, out, env_base)
            rc |= 1 if "error" in row else 0
            sink.write(json.dumps(row) + "\n")
            sink.flush()
            brief = {k: v.get("median_ms") for k, v in row.get("pull", {}).items()}  # type: ignore[union-attr]
            print(f"pull-levers {name}: {brief or row.get('error') or row.get('skipped')} "
                  f"cpu_idle={row.get('cpu_idle')} ready={row.get('ready_s')}", flush=True)
    stop_all()
    return rc


if __name__ == "__main__":
    sys.exit(main())

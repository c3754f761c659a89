"""Issue 39's evidence on the GPU machine, in one call: a scheduler with and without a GPU.

    python3 lab/bench/gpu_less_scheduler.py OUT_DIR [--reps 5] [--mib 256]

Shapes (each a fresh cluster on the one GPU, UCX, two workers):

* ``gpudask-gpu-less``: ``CUDA_VISIBLE_DEVICES="" dask scheduler --preload gpudask`` +
  ``dask worker --nworkers 2 --preload gpudask``;
* ``gpudask-gpu``: the same scheduler with the GPU visible;
* ``dask-cuda``: stock ``dask scheduler`` + two ``dask cuda worker`` (the reference).

On each: the seed example ("does the Dask scheduler need a GPU?": ``da.arange(1000,
like=cupy.arange(10))``, persist, ``z[:10].compute()``; a CuPy argument to ``submit``; a
direct gather) from a plain client, then the data-in-graph paths -- a CuPy argument of
``--mib`` MiB to ``submit``, ``da.from_array`` of such an array summed, and the same array
``scatter(direct=True)`` then ``submit`` -- from a gpudask client (``gpudask.initialize()``)
and from a plain one, medians of ``--reps``, every answer checked; and the scheduler's GPU
memory (NVML's process list).  Records go to ``OUT_DIR/records.jsonl`` as they come.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from gpudask.testing.processes import ProcessCluster, dask_command  # noqa: E402

SEED = textwrap.dedent("""
    import json, sys, time
    import cupy
    from distributed import Client, wait
    import dask.array as da
    out = []
    with Client(scheduler_file=sys.argv[1], timeout=30) as client:
        client.wait_for_workers(2, timeout=60)
        def attempt(tag, fn, expected):
            t = time.perf_counter()
            try:
                r = fn()
                value = cupy.asnumpy(r).tolist() if hasattr(r, "tolist") else r
                out.append({"workload": tag, "ok": value == expected, "answer": str(value)[:80],
                            "type": type(r).__module__, "seconds": round(time.perf_counter() - t, 3)})
            except Exception as e:
                out.append({"workload": tag, "ok": False, "answer": f"{type(e).__name__}: {str(e)[:200]}",
                            "seconds": round(time.perf_counter() - t, 3)})
        x = cupy.arange(10)
        z = (da.arange(1000, like=x) * 2).persist()
        wait(z, timeout=30)
        attempt("seed: z[:10].compute()", lambda: client.compute(z[:10]).result(timeout=30), list(range(0, 20, 2)))
        attempt("seed: submit(cupy arg)", lambda: client.submit(lambda a: a * 2, cupy.ones(1000)).result(timeout=30),
                [2.0] * 1000)
        attempt("seed: gather direct", lambda: client.gather(client.compute(z[:10]), direct=True),
                list(range(0, 20, 2)))
        attempt("seed: scatter then submit", lambda: client.submit(lambda a: int(a.sum()),
                client.scatter(cupy.arange(100))).result(timeout=30), 4950)
    print("SEED", json.dumps(out), flush=True)
""")

PATHS = textwrap.dedent("""
    import json, statistics, sys, time
    import cupy
    if sys.argv[2] == "gpudask":
        import gpudask
        gpudask.initialize(protocol="ucx")
    from distributed import Client, wait
    import dask.array as da
    reps, mib = int(sys.argv[3]), int(sys.argv[4])

    def first(a):
        return float(a[0]) + float(a[-1])

    with Client(scheduler_file=sys.argv[1], timeout=30) as client:
        client.wait_for_workers(2, timeout=60)
        x = cupy.arange(mib * 2**20 // 8, dtype="float64")
        expected_first = float(x[0]) + float(x[-1])
        expected_sum = float(x.sum())
        paths = {
            "submit": lambda: client.submit(first, x, pure=False).result(timeout=60),
            "from_array": lambda: float(da.from_array(x, chunks=x.size // 4).sum().compute(timeout=60)),
            "scatter_then_submit": lambda: client.submit(first, client.scatter(x, direct=True),
                                                         pure=False).result(timeout=60),
            # without dask's tokenize of the array (a copy to the host and a hash): the transfers alone
            "from_array_name_false": lambda: float(da.from_array(x, chunks=x.size // 4, name=False).sum().compute(
                timeout=60)),
            "scatter_hash_false_then_submit": lambda: client.submit(first, client.scatter(x, direct=True, hash=False),
                                                                    pure=False).result(timeout=60),
        }
        expected = {"submit": expected_first, "from_array": expected_sum, "scatter_then_submit": expected_first,
                    "from_array_name_false": expected_sum, "scatter_hash_false_then_submit": expected_first}
        for name, call in paths.items():
            times, answers, error = [], set(), None
            for i in range(reps + 1):  # the first one warms up
                t = time.perf_counter()
                try:
                    answers.add(call())
                except Exception as e:
                    error = f"{type(e).__name__}: {str(e)[:200]}"
                    break
                if i:
                    times.append((time.perf_counter() - t) * 1000)
            rec = {"path": f"{name}_{mib}MiB", "median_ms": round(statistics.median(times), 2) if times else None,
                   "runs_ms": [round(t, 2) for t in times], "answers_ok": answers == {expected[name]},
                   "error": error}
            print("PATH", json.dumps(rec), flush=True)
""")


def scheduler_gpu_mib(pid: int) -> float:
    """The GPU memory NVML lists for ``pid`` (0 when it holds no CUDA context)."""
    try:
        q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return -1.0  # no nvidia-smi (a CPU dry run)
    for line in q.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return float(parts[1])
    return 0.0


def record_of(records: pathlib.Path, workloads: pathlib.Path, machine: str) -> list[dict]:
    """Issue 39's record: the seed and workload lines per shape, the paths per side, the memory."""
    out: list[dict] = [{"machine": machine, "what": __doc__.split("\n\n")[0].strip()}]
    for line in records.read_text().splitlines():
        r = json.loads(line)
        if "workload" in r:
            out.append({k: r.get(k) for k in ("shape", "scheduler_gpu", "client", "workload", "ok", "answer",
                                              "seconds")})
        elif "path" in r:
            out.append({k: r.get(k) for k in ("path", "side", "shape", "scheduler_gpu", "client", "median_ms",
                                              "runs_ms", "answers_ok", "error")})
        elif "scheduler_gpu_memory_mib" in r:
            out.append({k: r.get(k) for k in ("shape", "scheduler_gpu", "scheduler_gpu_memory_mib")})
    suites = {"processes-ucx-cupy-gpu-less-scheduler-gpudask-client": ("gpudask-gpu-less", False, "gpudask"),
              "processes-ucx-cupy-gpu-less-scheduler": ("gpudask-gpu-less", False, "plain"),
              "processes-ucx-cupy": ("gpudask-gpu", True, "plain"), "dask-cuda-ucx-cupy": ("dask-cuda", True, "plain")}
    for line in workloads.read_text().splitlines():
        r = json.loads(line)
        if r.get("suite") not in suites or "workflow" not in r or r["workflow"].endswith("-end"):
            continue
        shape, gpu, client = suites[r["suite"]]
        out.append({"shape": shape, "scheduler_gpu": gpu, "client": client, "workload": r["workflow"],
                    "ok": r["status"] == "ok", "status": r["status"], "answer": r.get("value", r.get("error")),
                    "seconds": r.get("seconds")})
    return out


def main() -> int:
    if sys.argv[1] == "--record":  # --record RECORDS.jsonl WORKLOADS.jsonl MACHINE > the docs record
        print(json.dumps(record_of(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]), sys.argv[4]), indent=1))
        return 0
    out = pathlib.Path(sys.argv[1])
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 5
    mib = int(sys.argv[sys.argv.index("--mib") + 1]) if "--mib" in sys.argv else 256
    only = sys.argv[sys.argv.index("--shapes") + 1].split(",") if "--shapes" in sys.argv else None
    out.mkdir(parents=True, exist_ok=True)
    records = open(out / "records.jsonl", "a")
    (out / "seed.py").write_text(SEED)
    (out / "paths.py").write_text(PATHS)
    env = dict(os.environ, PYTHONUNBUFFERED="1", UCX_WARN_UNUSED_ENV_VARS="n")

    def record(rec: dict) -> None:
        print(json.dumps(rec), flush=True)
        records.write(json.dumps(rec) + "\n")
        records.flush()

    shapes = [("gpudask-gpu-less", False, True), ("gpudask-gpu", True, True), ("dask-cuda", True, False)]
    for shape, scheduler_gpu, ours in shapes:
        if only and shape not in only:
            continue
        (out / shape).mkdir(exist_ok=True)
        c = ProcessCluster(out / shape, env=env, grace=5)
        t0 = time.monotonic()
        try:
            sched_env = env if scheduler_gpu else dict(env, CUDA_VISIBLE_DEVICES="")
            proc = c.scheduler(*(("--preload", "gpudask") if ours else ()), protocol="ucx", env=sched_env,
                               timeout=60)
            if ours:
                c.worker("--preload", "gpudask", "--protocol", "ucx", "--nworkers", "2", "--nthreads", "1", env=env)
            else:
                for i in range(2):
                    c.spawn(f"cuda-worker-{i}", dask_command("cuda", "worker", "--scheduler-file", c.scheduler_file,
                                                             "--protocol", "ucx", "--nthreads", "1",
                                                             "--death-timeout", "60", "--no-dashboard"), env)
            seed = subprocess.run([sys.executable, str(out / "seed.py"), c.scheduler_file], capture_output=True,
                                  text=True, env=env, timeout=150)
            got = [json.loads(line[5:]) for line in seed.stdout.splitlines() if line.startswith("SEED ")]
            if not got:
                record({"shape": shape, "scheduler_gpu": scheduler_gpu, "workload": "seed", "ok": False,
                        "answer": (seed.stdout + seed.stderr)[-400:], "seconds": None})
            for rec in (got[0] if got else []):
                record({"shape": shape, "scheduler_gpu": scheduler_gpu, "client": "plain", **rec})
            for client in (("gpudask", "plain") if ours else ("plain",)):
                run = subprocess.run([sys.executable, str(out / "paths.py"), c.scheduler_file, client, str(reps),
                                      str(mib)], capture_output=True, text=True, env=env, timeout=240)
                lines = [json.loads(line[5:]) for line in run.stdout.splitlines() if line.startswith("PATH ")]
                if not lines:
                    record({"shape": shape, "side": client, "error": (run.stdout + run.stderr)[-600:]})
                for rec in lines:
                    record({"shape": shape, "scheduler_gpu": scheduler_gpu, "client": client,
                            "side": "gpudask" if ours else "dask-cuda", **rec})
            record({"shape": shape, "scheduler_gpu": scheduler_gpu, "scheduler_gpu_memory_mib":
                    scheduler_gpu_mib(proc.pid), "seconds": round(time.monotonic() - t0, 1)})
        except Exception as e:  # noqa: BLE001 - the next shape runs
            record({"shape": shape, "error": f"{type(e).__name__}: {e}"[:600]})
        finally:
            c.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The shape matrix (issue 29, item 4): every way a user starts a cluster, gpudask beside dask-cuda.

Each *shape* is started in both forms at once -- the gpudask form and the dask-cuda form a user
would pick instead, two clusters side by side on the host -- and in each the same *paths* are
timed for each *size* (float64 arrays made on a worker, CuPy on a GPU, NumPy with ``--cpu``),
the two sides' repetitions alternated one by one (ABBA), so that both medians come from the same
seconds of the machine: run one after the other, the same cell of the same dask-cuda shape moved
by up to 60 % between runs on the H200 (docs/benchmarks.md), more than the differences measured:

* ``client-via-scheduler``: ``future.result()`` with distributed's default
  ``direct-to-workers: null`` (the scheduler relays the data);
* ``client-direct``: ``client.gather(future, direct=True)`` (what ``Client(direct_to_workers=True)``
  does: ``Client._gather`` takes ``direct`` from it when the call gives none);
* ``worker-pull``: distributed's ``get_data_from_worker`` run inside the receiving worker
  (``client.run``), as ``gather_dep`` does and as ``lab/bench/pull-levers.py`` measures it;
* ``submit-arg``: the client makes the array and times ``client.submit(f, x).result()``, f
  returning the array's checksum.

Every received array's checksum (module, dtype, nbytes, sum, strided sums: the values are
multiples of 0.25, so the sums are exact in any order) is checked against the source's, and the
gpudask and dask-cuda cells against each other (``result_match``).

Each side runs in its own client process (``--_side``; UCX reads its environment once per
process, and gpudask's and dask-cuda's client set-ups must not meet) that takes one command at a
time from the driver on its stdin and writes its records to a file; it is killed with everything
it started when its time is up.  Every process started carries ``SHAPES_BENCH_RUN=<id>`` in its
environment; after each side, any process still carrying this run's id is killed by pid.

Output (in ``--out``): ``shapes.jsonl`` as it goes (one ``side`` record per cluster started,
one ``row`` per cell once both sides ran), ``shapes.json`` rewritten after each shape: a list
whose first element is ``{"meta": {...}}`` (machine, versions, date, arguments, each side's
start, commands, errors) and then one row per (shape, path, size) with ``gpudask_s`` and
``dask-cuda_s`` (medians), ``ratio``, ``result_match``, the workers' environments, notes.
With ``--sample PATH``: ``WORK/<shape>-<side>.jsonl.samples.json``, where each side's client process
spent that path's timed repetitions, thread by thread (lab/bench/stack_sampler.py).

Usage: python lab/bench/shapes.py --out DIR [--shapes a,b] [--sizes 1MiB,64MiB,1GiB] [--max-seconds 500]
       python lab/bench/shapes.py --out DIR --cpu --sizes 1MiB,8MiB      (CPU dry run: stock distributed as reference)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid

MARK = "SHAPES_BENCH_RUN"
PATHS = ("client-via-scheduler", "client-direct", "worker-pull", "submit-arg")
MEASURE_ORDER = ("client-direct", "worker-pull", "client-via-scheduler", "submit-arg")  # relayed paths last
SIDES = ("gpudask", "dask-cuda")

# shape -> side -> how that side starts.  scheduler: "gpudask" (--preload gpudask), "stock"
# (plain), "stock-cuda" (plain, with the CUDA context the dask-cuda docs have the scheduler create);
# workers: a list of commands, ("gpudask", nworkers) or ("dask-cuda",); env: every process's.
_DC = {"scheduler": "stock-cuda", "workers": [("dask-cuda",), ("dask-cuda",)], "client": "dask-cuda"}
SHAPES: dict[str, dict[str, dict]] = {
    "local": {
        "gpudask": {"local": True, "client": "gpudask"},
        "dask-cuda": {"local": True, "client": "dask-cuda"},
    },
    "one-command-2w": {
        "gpudask": {"scheduler": "gpudask", "workers": [("gpudask", 2)], "client": "gpudask"},
        "dask-cuda": _DC,
    },
    "two-commands-1w": {
        "gpudask": {"scheduler": "gpudask", "workers": [("gpudask", 1), ("gpudask", 1)], "client": "gpudask"},
        "dask-cuda": _DC,
    },
    "stock-scheduler": {
        "gpudask": {"scheduler": "stock", "workers": [("gpudask", 1), ("gpudask", 1)], "client": "gpudask"},
        "dask-cuda": _DC,
    },
    "gpudask-scheduler-dask-cuda-workers": {
        "gpudask": {"scheduler": "gpudask", "workers": [("dask-cuda",), ("dask-cuda",)], "client": "gpudask"},
        "dask-cuda": _DC,
    },
    "ucx-tls-all": {
        "gpudask": {"scheduler": "gpudask", "workers": [("gpudask", 1), ("gpudask", 1)], "client": "gpudask",
                    "env": {"UCX_TLS": "all"}},
        "dask-cuda": {**_DC, "env": {"UCX_TLS": "all"}},
    },
}
# Controls (not in the default matrix): dask-cuda on both sides, to show the spread this harness
# measures where there is no difference at all -- the "gpudask" columns of their rows are a second
# dask-cuda cluster started beside the first.
CONTROLS: dict[str, dict[str, dict]] = {
    "control-dask-cuda-commands": {"gpudask": _DC, "dask-cuda": _DC},
    "control-local-cuda-cluster": {
        "gpudask": {"local": True, "client": "dask-cuda", "dask_cuda": True},
        "dask-cuda": {"local": True, "client": "dask-cuda"},
    },
}
LOCAL_PULL_NA = ("not applicable: dask-cuda's LocalCUDACluster starts one worker per entry of CUDA_VISIBLE_DEVICES "
                 "and names each worker by its device (new_worker_spec: min(set(CUDA_VISIBLE_DEVICES) - names)), so "
                 "a repeated device cannot give a second worker ('Can not scale beyond visible devices'); on one GPU "
                 "the local shape has one worker on both sides and no worker-to-worker path")


def _size(text: str) -> int:
    from dask.utils import parse_bytes  # "1MiB", "64MiB", "1GiB", bytes

    return int(parse_bytes(text.strip()))


def _label(n: int) -> str:
    if n >= 2**30 and n % 2**30 == 0:
        return f"{n >> 30}GiB"
    if n >= 2**20 and n % 2**20 == 0:
        return f"{n >> 20}MiB"
    return f"{n >> 10}KiB" if n % 2**10 == 0 else f"{n}B"


def _err(e: BaseException, n: int = 600) -> str:
    """An exception in one line: its type, its first line and, from the rest (a log tail, a traceback),
    the lines that say what failed."""
    text = str(e).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "UCX  WARN" not in ln]
    if len(text) <= n and len(lines) <= 3:
        return f"{type(e).__name__}: {' / '.join(lines)}"
    head = lines[0][:200] if lines else ""
    said = [ln for ln in lines[1:] if re.search(r"ERROR|Error|Exception|failed|Reason|Killed|died", ln)
            and not ln.startswith(("Traceback", "File ", "raise ", "The above exception"))]
    tail = " / ".join((said or lines[1:])[-5:])[-(n - len(head)):]
    return f"{type(e).__name__}: {head} ... {tail}"


def _tail(text: str, n: int = 1500) -> str:
    lines = [ln for ln in text.splitlines() if "UCX  WARN" not in ln]
    return "\n".join(lines)[-n:]


# -- run in workers, the client and the scheduler ---------------------------------------------------------
def make(n: int, array: str):
    """n bytes of float64: (i mod 997) * 0.25, exact sums whatever the order."""
    if array == "cupy":
        import cupy as xp
    else:
        import numpy as xp
    x = (xp.arange(n // 8, dtype="i8") % 997).astype("f8") * 0.25
    if array == "cupy":
        xp.cuda.runtime.deviceSynchronize()
    return x


def checksum(x) -> str:
    """module:dtype:nbytes:sum:strided sums -- the same string for the same array wherever it is."""
    s0 = float(x.sum())
    s1 = float(x[::3].sum()) + 2.0 * float(x[1::5].sum()) + 3.0 * float(x[2::7].sum())
    return f"{type(x).__module__.split('.')[0]}:{x.dtype}:{x.nbytes}:{s0!r}:{s1!r}"


def sync_device(array: str) -> None:
    if array == "cupy":
        import cupy

        cupy.cuda.runtime.deviceSynchronize()


async def pull(addr: str, key: str, warmup: int, reps: int, cap: float, op_timeout: float, array: str,
               dask_worker=None) -> dict:
    """Pull ``key`` from ``addr`` into this worker: warm-ups, then up to ``reps`` timed pulls
    within ``cap`` seconds; the last pull's checksum."""
    import asyncio

    from distributed.worker import get_data_from_worker

    times: list[float] = []
    out: dict = {"times": times}

    async def once():
        t = time.perf_counter()
        r = await asyncio.wait_for(get_data_from_worker(dask_worker.rpc, [key], addr, who=dask_worker.address),
                                   op_timeout)
        sync_device(array)
        dt = time.perf_counter() - t
        if r.get("status") != "OK":
            raise RuntimeError(f"get_data_from_worker status {r.get('status')!r}")
        return dt, r

    try:
        for _ in range(warmup):
            await once()
        t_cell = time.perf_counter()
        for i in range(reps):
            if times and time.perf_counter() - t_cell + statistics.median(times) > cap:
                break
            dt, r = await once()
            times.append(dt)
            if i == 0:
                out["checksum"] = checksum(r["data"][key])  # not timed
            del r
    except BaseException as e:  # noqa: BLE001 - reported in the cell
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return out


def env_view(dask_worker=None, dask_scheduler=None) -> dict:
    """What a process runs with, as far as transports go."""
    keep = ("UCX_", "UCXPY_", "CUDA_VISIBLE_DEVICES", "DASK_DISTRIBUTED", "DASK_GPUDASK", "GPUDASK_", "RAPIDS_NO_INITIALIZE")
    out: dict = {k: v for k, v in sorted(os.environ.items()) if k.startswith(keep) and k != "UCX_WARN_UNUSED_ENV_VARS"}
    try:
        import dask.config

        cfg = dask.config.get("distributed-ucxx", default=None)
        if cfg:
            out["distributed-ucxx"] = {k: v for k, v in cfg.items() if v is not None}
    except Exception as e:  # noqa: BLE001 - a report
        out["distributed-ucxx"] = repr(e)[:100]
    if "rmm" in sys.modules:
        try:
            out["mr"] = type(sys.modules["rmm"].mr.get_current_device_resource()).__name__
        except Exception as e:  # noqa: BLE001
            out["mr"] = type(e).__name__
    out["pid"] = os.getpid()
    return out


def transfer_timeout(args, n: int | None = None) -> float:
    """One transfer at most: --op-timeout, less for small sizes (5 s + 20 s per GiB: a 1 MiB transfer
    that takes seconds is broken, and a relay that hangs must not eat the shape's budget)."""
    return args.op_timeout if n is None else min(args.op_timeout, 5.0 + 20.0 * n / 2**30)


# -- one side of one shape, in its own process (--_side) ----------------------------------------------------
class Side:
    def __init__(self, args, shape: str, side: str, out_file: str, budget: float):
        self.args, self.shape, self.side = args, shape, side
        self.spec = side_spec(args, shape, side)
        self.a: str | None = None
        self.b: str | None = None
        self.out_file = out_file
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget - args.teardown_reserve
        self.array = "numpy" if args.cpu else "cupy"
        self.cluster = None
        self.local = None
        self.client = None
        self.commands: list[str] = []
        self.samplers: dict = {}

    def emit(self, rec: dict) -> None:
        rec = {"shape": self.shape, "side": self.side, **rec}
        with open(self.out_file, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def op_timeout(self, n: int | None = None) -> float:
        """:func:`transfer_timeout`, and never far past this side's own deadline."""
        return max(3.0, min(transfer_timeout(self.args, n), self.left() + 5))

    # start ------------------------------------------------------------------------------------
    def start(self) -> int:
        """Start the cluster and the client; returns how many workers are wanted."""
        if self.spec.get("local"):
            return self._start_local()
        return self._start_processes()

    def _client_setup(self) -> None:
        if self.spec["client"] == "gpudask":
            if self.args.gpudask_client == "initialize":
                import gpudask

                gpudask.initialize(protocol="ucx")
        elif self.spec["client"] == "dask-cuda":
            from dask_cuda.initialize import initialize

            initialize()  # the client set-up dask-cuda's UCX page gives (create_cuda_context=True)

    def _start_local(self) -> int:
        kw = {"protocol": "ucx", "n_workers": 1, "dashboard_address": ":0"}
        if self.side == "gpudask" and not self.spec.get("dask_cuda"):
            import gpudask

            self.commands.append("gpudask.LocalGPUCluster(protocol='ucx', n_workers=1)")
            self.local = gpudask.LocalGPUCluster(**kw)
        elif self.spec.get("stock"):
            from distributed import LocalCluster

            self.commands.append("distributed.LocalCluster(protocol='ucx', n_workers=1)  # --cpu: no dask-cuda")
            self.local = LocalCluster(**kw)
        else:
            from dask_cuda import LocalCUDACluster

            self.commands.append("dask_cuda.LocalCUDACluster(protocol='ucx')  # one worker per visible GPU")
            kw.pop("n_workers")  # its default: one per GPU
            self.local = LocalCUDACluster(**kw)
        from distributed import Client

        self.client = Client(self.local, timeout=self.args.connect_timeout)
        return 1

    def _start_processes(self) -> int:
        from gpudask.testing.processes import ProcessCluster, clean_env, dask_command

        snapshot = dict(os.environ)  # before any client set-up changes this process's environment
        # clean_env drops DASK_GPUDASK__* / GPUDASK_* (a test sets its own): a lever is put back
        env = clean_env(snapshot, **self.spec.get("env", {}),
                        **(dict(self.args.gpudask_env) if self.side == "gpudask" else {}))
        work = pathlib.Path(tempfile.mkdtemp(prefix=f"{self.shape}-{self.side}-", dir=self.args.work))
        self.cluster = cl = ProcessCluster(work, env=env, grace=5)
        sched = self.spec["scheduler"]
        # a start slower than this is a finding in itself; what is left of the budget measures
        start_timeout = max(20.0, min(self.args.start_timeout, self.left() - 3))
        prefix = " ".join(f"{k}={v}" for k, v in self.spec.get("env", {}).items())
        prefix = prefix + " " if prefix else ""
        if sched == "gpudask":
            self.commands.append(f"{prefix}dask scheduler --protocol ucx --preload gpudask")
            cl.scheduler("--preload", "gpudask", protocol="ucx", timeout=start_timeout)
        elif sched == "stock":
            self.commands.append(f"{prefix}dask scheduler --protocol ucx")
            cl.scheduler(protocol="ucx", timeout=start_timeout)
        else:
            self.commands.append(f"{prefix}DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT=True dask scheduler --protocol ucx")
            cl.scheduler(protocol="ucx", env={**env, "DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT": "True"},
                         timeout=start_timeout)
        wanted = 0
        extra_dc = self.args.dask_cuda_worker_args.split()
        for i, w in enumerate(self.spec["workers"]):
            if w[0] == "gpudask":
                cl.worker("--nworkers", str(w[1]), "--preload", "gpudask", label=f"worker-{i}")
                self.commands.append(f"{prefix}dask worker --nworkers {w[1]} --preload gpudask")
                wanted += w[1]
            elif w[0] == "stock":
                cl.worker("--nworkers", str(w[1]), label=f"worker-{i}")
                self.commands.append(f"{prefix}dask worker --nworkers {w[1]}  # --cpu: no dask-cuda")
                wanted += w[1]
            else:
                argv = dask_command("cuda", "worker", "--scheduler-file", cl.scheduler_file, "--host", "127.0.0.1",
                                    "--no-dashboard", "--death-timeout", "60", *extra_dc)
                cl.spawn(f"cuda-worker-{i}", argv, env={**env, "CUDA_VISIBLE_DEVICES": "0"})
                self.commands.append(f"{prefix}CUDA_VISIBLE_DEVICES=0 dask cuda worker {' '.join(extra_dc)}".rstrip())
                wanted += 1
        self._client_setup()
        self.client = cl.client(timeout=self.args.connect_timeout)
        self._wait_workers(wanted, start_timeout)
        return wanted

    def _wait_workers(self, wanted: int, timeout: float) -> None:
        """Until ``wanted`` workers are up; StartShort when a command exits, when the count stalls for
        ``--start-stall`` seconds after the first worker came (the workers of one host come within
        seconds of each other: a worker that keeps failing under a nanny that restarts it would
        otherwise eat the side's budget), or after ``timeout``."""
        end = time.monotonic() + timeout
        have, since = 0, time.monotonic()
        while True:
            now_have = len(self.client.scheduler_info(n_workers=-1)["workers"])
            if now_have >= wanted:
                return
            if now_have != have:
                have, since = now_have, time.monotonic()
            dead = [p for p in self.cluster.procs if p.poll() is not None]
            stalled = have > 0 and time.monotonic() - since > self.args.start_stall
            if dead or stalled or time.monotonic() > end:
                if dead:
                    time.sleep(min(3.0, max(0.0, end - time.monotonic())))  # the other commands' workers
                    have = len(self.client.scheduler_info(n_workers=-1)["workers"])
                    why = f"{len(dead)} command(s) exited (rc {[p.returncode for p in dead]})"
                elif stalled:
                    why = f"no new worker for {self.args.start_stall:.0f} s after the last one"
                else:
                    why = f"{timeout:.0f} s"
                raise StartShort(f"{have} of {wanted} workers after {why}", have)
            try:
                self.client.wait_for_workers(wanted, timeout=1.0)
            except Exception:  # noqa: BLE001 - a TimeoutError, polled again
                pass

    def logs(self) -> dict[str, str]:
        if self.cluster is None:
            return {}
        return {label: _tail(self.cluster.log(label)) for label in self.cluster.logs}

    def views(self) -> dict:
        c = self.client
        out: dict = {}
        try:
            got = c.sync(c._run, env_view, callback_timeout=20, on_error="return")
            # w0: the first address (the source of the arrays), w1: the second (the puller)
            out["workers"] = {f"w{i}": ({"address": a, **v} if isinstance(v, dict) else repr(v)[:200])
                              for i, (a, v) in enumerate(sorted(got.items()))}
        except Exception as e:  # noqa: BLE001
            out["workers"] = f"{type(e).__name__}: {str(e)[:200]}"
        try:
            out["scheduler"] = c.sync(c._run_on_scheduler, env_view, callback_timeout=20)
        except Exception as e:  # noqa: BLE001
            out["scheduler"] = f"{type(e).__name__}: {str(e)[:200]}"
        out["client"] = env_view()
        return out

    # measure: one operation per command from the driver ------------------------------------------------
    def run(self) -> None:
        """Start, say so, then serve the driver's commands (one JSON line each on stdin) until ``end``:
        the driver alternates the two sides' repetitions of every cell, so both sides of a shape are
        measured in the same seconds (the same drift of the machine), not one after the other."""
        stage = "start"
        start_note = None
        try:
            try:
                wanted = self.start()
            except StartShort as e:
                if e.have < 1:
                    raise
                start_note = str(e)
                wanted = e.have
            workers = sorted(self.client.scheduler_info(n_workers=-1)["workers"])
            self.a = workers[0]
            self.b = workers[1] if len(workers) > 1 else None
            self.emit({"type": "start", "ready_s": round(time.monotonic() - self.t0, 2), "workers": wanted,
                       "start_error": start_note, "commands": self.commands, "env": self.views(),
                       "logs": self.logs() if start_note else None})
            stage = "measure"
            self.serve()
        except BaseException as e:  # noqa: BLE001 - the side's failure is its record
            self.emit({"type": "error", "stage": stage, "error": _err(e),
                       "traceback": traceback.format_exc()[-2000:], "commands": self.commands,
                       "elapsed_s": round(time.monotonic() - self.t0, 1), "logs": self.logs()})
        finally:
            self.close()

    def serve(self) -> None:
        from distributed import wait

        c = self.client
        sources: dict[int, object] = {}
        for line in sys.stdin:
            if not line.strip():
                continue
            cmd = json.loads(line)
            op, seq = cmd["op"], cmd["seq"]
            if op == "end":
                return
            n = int(cmd.get("n", 0))
            rec: dict = {"type": "reply", "seq": seq, "op": op}
            try:
                if op == "source":
                    src = c.submit(make, n, self.array, workers=[self.a], pure=False,
                                   key=f"src-{_label(n)}-{uuid.uuid4().hex[:6]}")
                    wait(src, timeout=self.op_timeout())
                    rec["checksum"] = c.submit(checksum, src, workers=[self.a], pure=False).result(
                        timeout=self.op_timeout())
                    sources[n] = src
                elif op == "drop":
                    sources.pop(n, None)
                elif op == "reps":
                    sampler = self.sampler(cmd["path"], n) if int(cmd["reps"]) > 0 else None
                    with sampler or contextlib.nullcontext():
                        rec.update(self.path(cmd["path"], n, sources[n], int(cmd["warm"]), int(cmd["reps"])))
                else:
                    rec["error"] = f"unknown op {op!r}"
            except Exception as e:  # noqa: BLE001 - the cell's record
                rec["error"] = _err(e, 400)
            self.emit(rec)

    def path(self, p: str, n: int, src, warm: int, reps: int) -> dict:
        """``warm`` untimed then ``reps`` timed repetitions of path ``p``; the last result's checksum."""
        c = self.client
        a, b = self.a, self.b
        if p == "worker-pull":
            if b is None:
                raise RuntimeError("one worker only: no worker-to-worker path")
            budget = (warm + reps + 1) * self.op_timeout(n) + 10
            got = c.sync(c._run, pull, a, src.key, warm, reps, float("inf"), self.op_timeout(n), self.array,
                         workers=[b], callback_timeout=budget)
            out = got[b]
            if out.get("error"):
                raise RuntimeError(out["error"])
            return out
        if p == "submit-arg":
            x = make(n, self.array)

            def once():
                f = c.submit(checksum, x, pure=False)
                try:
                    return f.result(timeout=self.op_timeout(n))
                finally:
                    f.release()
        elif p == "client-via-scheduler":
            def once():
                return src.result(timeout=self.op_timeout(n))  # direct-to-workers: null (distributed's default)
        else:
            def once():
                return c.sync(c._gather, [src], direct=True, callback_timeout=self.op_timeout(n))[0]
        times: list[float] = []
        last = None
        for i in range(warm + reps):
            last = None
            t = time.perf_counter()
            last = once()
            sync_device(self.array)
            dt = time.perf_counter() - t
            if i >= warm:
                times.append(dt)
        out: dict = {"times": times}
        if p == "submit-arg":
            out["checksum"] = last
            out["client_checksum"] = checksum(x)
        elif last is not None:
            out["checksum"] = checksum(last)
        return out

    def sampler(self, p: str, n: int):
        """--sample PATH: the stack sampler of this cell (lab/bench/stack_sampler.py), around its timed
        repetitions only; None for the other paths."""
        if p not in self.args.sample:
            return None
        key = f"{p}/{_label(n)}"
        if key not in self.samplers:
            here = str(pathlib.Path(__file__).parent)
            if here not in sys.path:
                sys.path.insert(0, here)
            from stack_sampler import StackSampler

            self.samplers[key] = StackSampler()
        return self.samplers[key]

    def write_samples(self) -> None:
        if self.samplers:
            with open(self.out_file + ".samples.json", "w") as f:
                json.dump({"shape": self.shape, "side": self.side,
                           "cells": {k: v.result() for k, v in self.samplers.items()}}, f, indent=1)

    def close(self) -> None:
        try:
            self.write_samples()
        except Exception as e:  # noqa: BLE001 - a profile is never worth the side's record
            self.emit({"type": "note", "note": f"samples not written: {_err(e)}"})
        try:
            if self.client is not None:
                self.client.close(timeout=10)
        except Exception:  # noqa: BLE001
            pass
        try:
            if self.local is not None:
                self.local.close(timeout=15)
        except Exception:  # noqa: BLE001
            pass
        if self.cluster is not None:
            self.cluster.stop()


class StartShort(RuntimeError):
    def __init__(self, msg: str, have: int):
        super().__init__(msg)
        self.have = have


# -- the driver ---------------------------------------------------------------------------------------------------
def kill_marked(run_id: str) -> list[int]:
    """Kill, by pid, every process whose environment carries this run's id (not this one)."""
    import psutil

    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid"]):
        if p.pid == me:
            continue
        try:
            if p.environ().get(MARK) == run_id and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in found:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        _, found = psutil.wait_procs(found, timeout=3)
        if not found:
            break
    return [p.pid for p in found]


def kill_tree(proc: subprocess.Popen) -> None:
    import psutil

    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    for p in [*kids]:
        try:
            p.kill()
        except psutil.Error:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def gpu_used_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        return int(out.stdout.split()[0])
    except Exception:  # noqa: BLE001
        return None


def meta(args) -> dict:
    import importlib.metadata as md

    versions = {}
    for dist in ("gpudask", "dask", "distributed", "dask-cuda", "distributed-ucxx-cu13", "ucxx-cu13", "libucx-cu13",
                 "rmm-cu13", "cupy-cuda13x", "numpy", "psutil"):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    machine = None
    try:
        machine = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:  # noqa: BLE001
        machine = f"no nvidia-smi ({type(e).__name__})"
    commit = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=pathlib.Path(__file__).parent).stdout.strip() or None
    except Exception:  # noqa: BLE001
        pass
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": os.uname().nodename, "cpus": os.cpu_count(), "machine": machine, "python": sys.version.split()[0],
            "versions": versions, "commit": commit, "cpu_dry_run": args.cpu,
            "args": {k: v for k, v in vars(args).items() if not k.startswith("_")},
            "paths": {"client-via-scheduler": "future.result(), distributed.client.direct-to-workers null",
                      "client-direct": "client.gather(future, direct=True) (= Client(direct_to_workers=True))",
                      "worker-pull": "get_data_from_worker inside the receiving worker (client.run)",
                      "submit-arg": "client.submit(checksum, x).result(), x made in the client"},
            "timing": "both sides of a shape run at once (two clusters on the host); in each cell, warm-ups on "
                      "each side, then rounds of one timed repetition per side, the first side swapped each round "
                      "(ABBA), until --reps-* rounds or the cell's time cap; median seconds of each side's timed "
                      "repetitions (reps in the row)",
            "reference": ("stock distributed (dask scheduler / dask worker / LocalCluster): --cpu, dask-cuda needs "
                          "a GPU") if args.cpu else "dask-cuda",
            "sides": {}}


def merge(shape: str, recs: dict[str, list[dict]], args) -> list[dict]:
    rows = []
    start = {s: next((r for r in recs[s] if r.get("type") == "start"), None) for s in SIDES}
    errors = {s: [r for r in recs[s] if r.get("type") in ("error", "skipped")] for s in SIDES}
    for n in args.sizes:
        for p in PATHS:
            row: dict = {"shape": shape, "path": p, "size": _label(n), "size_bytes": n}
            notes = []
            cells = {}
            for s in SIDES:
                cell = next((r for r in recs[s] if r.get("type") == "cell" and r["path"] == p and r["size_bytes"] == n),
                            None)
                cells[s] = cell
                row[f"{s}_s"] = cell.get("median_s") if cell else None
            for s in SIDES:
                cell = cells[s]
                row[f"{s}_env"] = ((start[s] or {}).get("env") or {}).get("workers")  # scheduler, client: meta
                detail: dict = {}
                if cell:
                    detail = {k: cell.get(k) for k in ("reps", "times", "checksum", "checksum_ok", "cell_s", "error",
                                                       "skipped", "client_checksum", "rounds", "interleaved_with") if cell.get(k) is not None}
                    if cell.get("error"):
                        notes.append(f"{s}: {cell['error']}")
                    if cell.get("skipped"):
                        notes.append(f"{s} skipped: {cell['skipped']}")
                    if cell.get("checksum_ok") is False:
                        notes.append(f"{s}: checksum {cell.get('checksum')} != source {cell.get('source_checksum')}")
                else:
                    why = "; ".join(e.get("error") or e.get("skipped") or "" for e in errors[s]) or "no record"
                    detail = {"missing": why[:400]}
                    notes.append(f"{s}: not measured: {why[:300]}")
                if start[s] and start[s].get("start_error"):
                    notes.append(f"{s} start: {start[s]['start_error']}")
                row[s] = detail
            g, d = row["gpudask_s"], row["dask-cuda_s"]
            row["ratio"] = round(g / d, 3) if g and d else None
            cg, cd = cells["gpudask"], cells["dask-cuda"]
            if cg and cd and cg.get("checksum") and cd.get("checksum"):
                row["result_match"] = (cg["checksum"] == cd["checksum"] and cg.get("checksum_ok") is not False
                                       and cd.get("checksum_ok") is not False)
            else:
                row["result_match"] = None
            sk = {s: (cells[s] or {}).get("skipped") for s in SIDES}
            if sk["gpudask"] and sk["gpudask"] == sk["dask-cuda"]:  # one reason for both: said once
                notes = [n for n in notes if not n.endswith(f"skipped: {sk['gpudask']}")]
                notes.insert(0, f"both skipped: {sk['gpudask']}")
            row["notes"] = " | ".join(notes) if notes else None
            rows.append(row)
    return rows


def fmt(v: float | None) -> str:
    return f"{v * 1e3:10.3f}" if isinstance(v, (int, float)) else f"{'-':>10}"


class Terminated(Exception):
    pass


def driver(args) -> int:
    args.out = os.path.abspath(args.out)
    args.work = os.path.abspath(args.work) if args.work else None
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or str(out / "work")
    pathlib.Path(args.work).mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(args.work)
    run_id = uuid.uuid4().hex
    os.environ[MARK] = run_id
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    os.environ["PYTHONUNBUFFERED"] = "1"
    deadline = time.monotonic() + args.max_seconds
    info = meta(args)
    rows: list[dict] = []
    jsonl = open(out / "shapes.jsonl", "a")

    def log(rec: dict) -> None:
        jsonl.write(json.dumps(rec, default=str) + "\n")
        jsonl.flush()

    def save() -> None:
        tmp = out / "shapes.json.tmp"
        tmp.write_text(json.dumps([{"meta": info}, *rows], indent=1, default=str))
        tmp.replace(out / "shapes.json")

    log({"type": "meta", **info})
    save()

    def on_term(signum, frame):  # a time box around this script: stop the side running, save what there is
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    stopped: str | None = None
    print(f"shapes: {info['machine']} | {info['versions']} | budget {args.max_seconds:.0f} s", flush=True)
    print(f"{'shape':36} {'path':21} {'size':>6} {'gpudask ms':>10} {'dask-cuda ms':>12} {'ratio':>7} match",
          flush=True)
    try:
        for i_shape, shape in enumerate(args.shapes):
            left = deadline - time.monotonic()
            budget = min(args.max_shape_seconds, (left - args.teardown_grace - 5) / (len(args.shapes) - i_shape))
            recs = run_shape(args, shape, budget, work, run_id, info, stopped)
            shape_rows = merge(shape, recs, args)
            for row in shape_rows:
                log({"type": "row", **row})
                ratio = f"{row['ratio']:7.2f}" if row["ratio"] is not None else f"{'-':>7}"
                print(f"{shape:36} {row['path']:21} {row['size']:>6} {fmt(row['gpudask_s'])} {fmt(row['dask-cuda_s']):>12} "
                      f"{ratio} {row['result_match']}", flush=True)
            for side in SIDES:
                log({"type": "side", "shape": shape, "side": side, **info["sides"][f"{shape}/{side}"],
                     "cells": [r for r in recs[side] if r.get("type") == "cell"]})
            rows.extend(shape_rows)
            save()
            stopped = info.get("terminated")
    except Terminated as e:  # outside a side's wait: what was measured is saved below
        info["terminated"] = str(e)
        kill_marked(run_id)
    if stopped:
        info["terminated"] = stopped
    info["wall_s"] = round(args.max_seconds - (deadline - time.monotonic()), 1)
    save()
    jsonl.close()
    bad = [r for r in rows if r["result_match"] is False]
    print(f"shapes: {len(rows)} rows, {sum(1 for r in rows if r['ratio'] is not None)} with both medians, "
          f"{len(bad)} result mismatch(es); {info['wall_s']} s; {out / 'shapes.json'}", flush=True)
    return 0


class SideProc:
    """One side of a shape in its own process: commands on its stdin, records in its file."""

    def __init__(self, args, shape: str, side: str, work: pathlib.Path, budget: float):
        self.shape, self.side, self.key = shape, side, f"{shape}/{side}"
        self.file = work / f"{shape}-{side}.jsonl"
        self.file.unlink(missing_ok=True)
        pathlib.Path(f"{self.file}.samples.json").unlink(missing_ok=True)  # --sample's, of an earlier run
        self.console = work / f"{shape}-{side}.console"
        self.recs: list[dict] = []
        self.cells: list[dict] = []  # the driver's cell records for this side (measure_interleaved)
        self.seq = 0
        self._offset = 0
        self._partial = ""
        self.t0 = time.monotonic()
        env = {**os.environ, **side_spec(args, shape, side).get("env", {}),
               **(dict(args.gpudask_env) if side == "gpudask" else {})}
        argv = [sys.executable, os.path.abspath(__file__), "--_side", shape, side, "--_file", str(self.file),
                "--_budget", f"{budget:.1f}", *passthrough(args)]
        with open(self.console, "ab") as console:
            self.proc = subprocess.Popen(argv, env=env, stdout=console, stderr=subprocess.STDOUT, cwd=work,
                                         stdin=subprocess.PIPE, start_new_session=True)

    def _read(self) -> list[dict]:
        try:
            with open(self.file, "r") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except FileNotFoundError:
            return []
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for the rest
        got = [json.loads(ln) for ln in lines if ln.strip()]
        self.recs.extend(got)
        return got

    def wait_for(self, match, timeout: float) -> dict | None:
        """The first new record ``match`` accepts; None when the process exits or ``timeout`` passes."""
        end = time.monotonic() + timeout
        pause = 0.0002
        while True:
            for rec in self._read():
                if match(rec):
                    return rec
            if self.proc.poll() is not None:
                for rec in self._read():
                    if match(rec):
                        return rec
                return None
            if time.monotonic() > end:
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.005)

    def send(self, op: str, **kw) -> int:
        self.seq += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"op": op, "seq": self.seq, **kw}) + "\n").encode())
        self.proc.stdin.flush()
        return self.seq

    def call(self, op: str, timeout: float, **kw) -> dict:
        """Send one command and wait for its reply; a dead or silent side raises SideGone."""
        try:
            seq = self.send(op, **kw)
        except (BrokenPipeError, OSError) as e:
            raise SideGone(f"the side process is gone ({type(e).__name__}, rc {self.proc.poll()})") from None
        rec = self.wait_for(lambda r: r.get("type") == "reply" and r.get("seq") == seq, timeout)
        if rec is None:
            why = (f"the side process exited (rc {self.proc.returncode})" if self.proc.poll() is not None
                   else f"no reply to {op} within {timeout:.0f} s")
            raise SideGone(why)
        return rec

    def finish(self, grace: float) -> tuple[int | None, str | None]:
        try:
            self.send("end")
            self.proc.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError, AttributeError):
            pass
        try:
            rc = self.proc.wait(timeout=grace)
            killed = None
        except subprocess.TimeoutExpired:
            kill_tree(self.proc)
            rc, killed = self.proc.returncode, f"killed {grace:.0f} s after its end"
        self._read()
        return rc, killed


class SideGone(RuntimeError):
    pass


def run_shape(args, shape: str, budget: float, work: pathlib.Path, run_id: str, info: dict,
              stopped: str | None) -> dict[str, list[dict]]:
    """Both sides of one shape at once: each starts its cluster in its own process (at the same
    time: the GPU holds both), then every cell is measured with the sides' repetitions alternated
    -- warm-ups on each side, then one timed repetition on each, the first side swapped every
    round (ABBA) -- until ``--reps-*`` rounds or the cell's time cap.  Returns each side's records."""
    recs: dict[str, list[dict]] = {s: [] for s in SIDES}
    why_not: dict[str, str] = {}
    for side in SIDES:
        why = skip_reason(args, shape, side) or (f"not run: the script was stopped ({stopped})" if stopped else None)
        if not why and budget < args.min_side_seconds:
            why = f"time box: {budget:.0f} s left for this shape"
        if why:
            why_not[side] = why
            recs[side].append({"type": "skipped", "shape": shape, "side": side, "skipped": why})
            info["sides"][f"{shape}/{side}"] = {"skipped": why}
    t_shape = time.monotonic()
    end_shape = t_shape + budget - args.teardown_reserve
    procs = {s: SideProc(args, shape, s, work, budget + args.teardown_grace) for s in SIDES if s not in why_not}
    live: list[str] = []
    try:
        for s, sp in procs.items():
            rec = sp.wait_for(lambda r: r.get("type") in ("start", "error"),
                              max(1.0, min(args.start_timeout + args.connect_timeout + 10, end_shape - time.monotonic())))
            if rec is not None and rec["type"] == "start":
                live.append(s)
        measure_interleaved(args, shape, procs, live, end_shape)
    except Terminated as e:
        info["terminated"] = str(e)
    finally:
        for s, sp in procs.items():
            rc, killed = sp.finish(args.teardown_grace if not info.get("terminated") else 1.0)
            got = sp.recs
            recs[s] = [r for r in got if r.get("type") != "reply"] + sp.cells
            if killed:
                recs[s].append({"type": "error", "stage": "driver", "error": killed})
            if rc not in (0, None) and not any(r.get("type") == "error" for r in recs[s]):
                tail = _tail(sp.console.read_text(errors="replace"), 1500)
                recs[s].append({"type": "error", "stage": "process", "error": f"side process exit {rc}",
                                "console": tail})
            if not any(r.get("type") in ("start", "error") for r in recs[s]):
                recs[s].append({"type": "error", "stage": "process", "error": "no record from the side process"})
            start = next((r for r in recs[s] if r.get("type") == "start"), {})
            errs = [r for r in recs[s] if r.get("type") == "error"]
            info["sides"][sp.key] = {"budget_s": round(budget, 1), "wall_s": round(time.monotonic() - sp.t0, 1),
                                     "rc": rc, "ready_s": start.get("ready_s"), "workers": start.get("workers"),
                                     "start_error": start.get("start_error"),
                                     "commands": start.get("commands") or (errs[0].get("commands") if errs else None),
                                     "errors": [{k: e.get(k) for k in ("stage", "error", "traceback", "logs", "console")
                                                 if e.get(k)} for e in errs] or None,
                                     "start_logs": start.get("logs"), "env": start.get("env")}
            state = (f"error: {errs[0]['error'][:150]}" if errs else
                     f"ready {start.get('ready_s')} s, {start.get('workers')} worker(s)"
                     + (f" ({start['start_error']})" if start.get("start_error") else ""))
            print(f"-- {sp.key}: {state}; {info['sides'][sp.key]['wall_s']} s", flush=True)
        survivors = kill_marked(run_id)
        for sp in procs.values():
            info["sides"][sp.key]["survivors_killed"] = survivors or None
            info["sides"][sp.key]["gpu_used_mib_after"] = None if args.cpu else gpu_used_mib()
    return recs


def measure_interleaved(args, shape: str, procs: dict[str, SideProc], live: list[str], end_shape: float) -> None:
    def left() -> float:
        return end_shape - time.monotonic()

    def op_timeout(n: int | None = None) -> float:
        return transfer_timeout(args, n)

    def cell(s: str, p: str, n: int, **rec) -> None:
        times = rec.get("times") or []
        rec["reps"] = len(times)
        rec["median_s"] = round(statistics.median(times), 6) if times else None
        rec["times"] = [round(t, 6) for t in times]
        if rec.get("checksum") is not None and rec.get("source_checksum") is not None:
            rec["checksum_ok"] = rec["checksum"] == rec["source_checksum"]
        procs[s].cells.append({"type": "cell", "shape": shape, "side": s, "path": p, "size": _label(n),
                               "size_bytes": n, **rec})

    workers = {s: next(r for r in procs[s].recs if r.get("type") == "start")["workers"] for s in live}
    dead: dict[str, dict[str, str]] = {s: {} for s in live}  # side -> path -> why larger sizes are skipped
    cells_left = len(args.sizes) * len(PATHS)
    for n in args.sizes:
        label = _label(n)
        src_sum: dict[str, str] = {}
        for s in list(live):
            try:
                r = procs[s].call("source", op_timeout() * 2 + 5, n=n)
            except SideGone as e:
                live.remove(s)
                for p in PATHS:
                    cell(s, p, n, error=f"side lost: {e}")
                continue
            if r.get("error"):
                for p in PATHS:
                    cell(s, p, n, error=f"source array: {r['error']}")
            else:
                src_sum[s] = r["checksum"]
        for p in MEASURE_ORDER:
            cap = min(args.cell_cap, left() / max(cells_left, 1))
            cells_left -= 1
            sides: list[str] = []
            for s in live:
                if s not in src_sum:
                    continue
                if p in dead[s]:
                    cell(s, p, n, skipped=dead[s][p])
                elif p == "worker-pull" and workers[s] < 2:
                    cell(s, p, n, skipped=LOCAL_PULL_NA if side_spec(args, shape, s).get("local") else "one worker only (start)")
                elif left() < 1.0 or cap < 0.3:
                    cell(s, p, n, skipped=f"time box ({max(left(), 0):.1f} s left in this shape)")
                else:
                    sides.append(s)
            if not sides:
                continue
            if p == "worker-pull":
                warm, target = (args.pull_warmup if n < 2**30 else 1), args.reps_pull
            else:
                warm, target = (args.warmup if n < 2**30 else max(1, args.warmup - 1)), args.reps_client
            got: dict[str, dict] = {s: {"times": []} for s in sides}
            t_cell = {s: 0.0 for s in sides}
            failed: dict[str, str] = {}

            def one(s: str, w: int, k: int) -> None:
                t = time.monotonic()
                try:
                    r = procs[s].call("reps", (w + k + 1) * op_timeout(n) + 15, path=p, n=n, warm=w, reps=k)
                except SideGone as e:
                    failed[s] = f"side lost: {e}"
                    live.remove(s)
                    return
                finally:
                    t_cell[s] += time.monotonic() - t
                if r.get("error"):
                    failed[s] = r["error"]
                    return
                got[s]["times"].extend(r.get("times") or [])
                for k2 in ("checksum", "client_checksum"):
                    if r.get(k2) is not None:
                        got[s][k2] = r[k2]

            for s in sides:
                one(s, warm, 0)
            t0 = time.monotonic()
            rounds = 0
            while True:
                order = sides if rounds % 2 == 0 else sides[::-1]
                active = [s for s in order if s not in failed]
                if not active:
                    break
                for s in active:
                    one(s, 0, 1)
                rounds += 1
                spent = time.monotonic() - t0
                if rounds >= target or spent + spent / rounds > cap or left() < 1.0:
                    break
            for s in sides:
                err = failed.get(s)
                if err and ("TimeoutError" in err or "timed out" in err.lower() or "no reply" in err):
                    dead[s][p] = f"the {label} cell of this path timed out"
                cell(s, p, n, **got[s], source_checksum=src_sum[s], rounds=rounds, cell_s=round(t_cell[s], 2),
                     interleaved_with=[o for o in sides if o != s] or None, **({"error": err} if err else {}))
        for s in list(live):
            try:
                procs[s].call("drop", 30, n=n)
            except SideGone:
                live.remove(s)


def skip_reason(args, shape: str, side: str) -> str | None:
    spec = {**SHAPES, **CONTROLS}[shape][side]
    if args.cpu and side == "gpudask" and (spec.get("dask_cuda") or any(w[0] == "dask-cuda" for w in spec.get("workers", []))):
        return "--cpu: dask-cuda needs a GPU"
    return None


def side_spec(args, shape: str, side: str) -> dict:
    """How a side starts.  On a CPU (``--cpu``, the dry run) dask-cuda cannot run: its side is stock
    distributed instead -- the same processes without gpudask or dask-cuda -- so the alternation of
    two live sides is exercised there too (its figures name no dask-cuda; meta says so)."""
    spec = {**SHAPES, **CONTROLS}[shape][side]
    if not (args.cpu and side == "dask-cuda"):
        return spec
    if spec.get("local"):
        return {"local": True, "client": "plain", "stock": True}
    return {"scheduler": "stock", "client": "plain", "env": spec.get("env", {}),
            "workers": [("stock", 1) if w[0] == "dask-cuda" else ("stock", w[1]) for w in spec["workers"]]}


def passthrough(args) -> list[str]:
    out = ["--out", args.out, "--work", args.work, "--sizes", ",".join(str(n) for n in args.sizes)]
    for k in ("reps_client", "reps_pull", "warmup", "pull_warmup", "cell_cap", "op_timeout", "start_timeout", "start_stall",
              "connect_timeout", "teardown_reserve", "gpudask_client"):
        out += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    out += [f"--dask-cuda-worker-args={args.dask_cuda_worker_args}"]
    for key, value in args.gpudask_env:
        out += ["--gpudask-env", f"{key}={value}"]
    for path in args.sample:
        out += ["--sample", path]
    if args.cpu:
        out.append("--cpu")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--sizes", default=None, help="default 1MiB,64MiB,1GiB (--cpu: 1MiB,8MiB)")
    p.add_argument("--cpu", action="store_true", help="CPU dry run: NumPy arrays, stock distributed as the reference")
    p.add_argument("--max-seconds", type=float, default=500)
    p.add_argument("--max-shape-seconds", type=float, default=150, help="at most this much per shape (both sides)")
    p.add_argument("--min-side-seconds", type=float, default=20, help="skip a shape given less")
    p.add_argument("--reps-client", type=int, default=25, help="timed rounds per client cell at most")
    p.add_argument("--reps-pull", type=int, default=25, help="timed rounds per pull cell at most")
    p.add_argument("--warmup", type=int, default=2, help="client paths (one less at 1 GiB and up)")
    p.add_argument("--pull-warmup", type=int, default=3, help="(1 at 1 GiB and up)")
    p.add_argument("--cell-cap", type=float, default=14.0, help="seconds of timed rounds per cell at most")
    p.add_argument("--op-timeout", type=float, default=30.0, help="one gather/submit/pull at most")
    p.add_argument("--start-timeout", type=float, default=60.0)
    p.add_argument("--start-stall", type=float, default=12.0,
                   help="stop waiting when no worker joined for this long after the last one")
    p.add_argument("--connect-timeout", type=float, default=30.0)
    p.add_argument("--teardown-reserve", type=float, default=4.0, help="of each side's budget, kept to close")
    p.add_argument("--teardown-grace", type=float, default=20.0, help="past its budget, a side is killed")
    p.add_argument("--gpudask-client", choices=("initialize", "plain"), default="initialize",
                   help="the gpudask sides' client: gpudask.initialize(protocol='ucx') first (docs/usage.md) or not")
    p.add_argument("--dask-cuda-worker-args", default="", help="added to every `dask cuda worker`")
    p.add_argument("--sample", action="append", default=[], choices=PATHS, metavar="PATH",
                   help="sample the Python stacks of every thread of each side's client process during this path's "
                        "timed repetitions (lab/bench/stack_sampler.py) into WORK/<shape>-<side>.jsonl.samples.json")
    p.add_argument("--gpudask-env", action="append", default=[], metavar="KEY=VALUE",
                   help="a lever: this variable in every process of the gpudask sides (client, scheduler, workers), "
                        "e.g. DASK_GPUDASK__RMM__POOL_SIZE=false; repeatable; recorded in meta")
    p.add_argument("--work", default=None, help="logs and scratch of every cluster (default OUT/work)")
    p.add_argument("--list", action="store_true")
    p.add_argument("--_side", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--_file", help=argparse.SUPPRESS)
    p.add_argument("--_budget", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.list:
        for k, v in {**SHAPES, **CONTROLS}.items():
            print(k, json.dumps(v))
        return 0
    if args.sizes is None:
        args.sizes = "1MiB,8MiB" if args.cpu else "1MiB,64MiB,1GiB"
    try:
        args.sizes = [_size(s) for s in str(args.sizes).split(",") if s.strip()]
    except ValueError:
        print(f"shapes: --sizes {args.sizes!r} is not valid; accepted: e.g. 1MiB,64MiB,1GiB", file=sys.stderr)
        return 2
    pairs = []
    for item in args.gpudask_env:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not key.replace("_", "").isalnum():
            print(f"shapes: --gpudask-env {item!r} is not KEY=VALUE; accepted: e.g. DASK_GPUDASK__RMM__POOL_SIZE=false",
                  file=sys.stderr)
            return 2
        pairs.append((key.strip(), value))
    args.gpudask_env = pairs
    args.shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in args.shapes if s not in SHAPES and s not in CONTROLS]
    if unknown:
        print(f"shapes: unknown shape(s) {', '.join(unknown)}; accepted: {', '.join(SHAPES)} (the matrix) and "
              f"{', '.join(CONTROLS)} (controls: dask-cuda on both sides)", file=sys.stderr)
        return 2
    if args._side:
        import warnings

        warnings.filterwarnings("ignore")
        Side(args, args._side[0], args._side[1], args._file, args._budget).run()
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())

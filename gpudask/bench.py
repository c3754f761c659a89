"""``gpudask bench``: tcp, hand-set UCX, gpudask and dask-cuda side by side, on real processes.

For each configuration the bench starts a real ``dask scheduler`` and real workers as
separate process groups (``--port 0``, scheduler files), measures, and kills the groups.
Figures, each the best and the median of ``--repeat`` runs after a warm-up:

* ``ready_s``: from launching the scheduler until ``client.wait_for_workers(N)`` returns
  (one cluster launch per run; the first launch of a configuration is the warm-up);
* ``transfer_<size>_s``: end-to-end time of a task pinned to worker B that depends on an
  array created on worker A; ``transfer_<size>_GBps``: the bandwidth distributed records
  for that transfer in B's ``transfer_incoming_log``;
* ``transpose_sum_s``: ``(x + x.T).sum()`` on a persisted square array;
* ``gpu_mem_outside_workers_MiB``: GPU memory that NVML attributes to the cluster's
  processes other than the workers (scheduler, nanny hosts, helpers);
* per worker, the UCX transports in effect (``ucxx`` config and active transports, and
  with ``--ucx-proto-info`` the transports UCX reported selecting for endpoints).

Importing this module is cheap: numpy, cupy, dask, distributed, psutil and pynvml are
imported inside the functions that use them.  Functions that run on workers are sent by
value (never as ``gpudask.bench.*`` references) so that stock workers never import gpudask.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import click

CONFIGS = ("tcp", "ucx-stock", "gpudask", "dask-cuda")
MiB = 2**20

# sizes: (transfer sizes in bytes, square array side, chunk side)
FULL_SIZES = ((10**6, 64 * 10**6, 10**9), 20000, 2000)
SMALL_SIZES = ((10**6, 8 * 10**6, 64 * 10**6), 4000, 500)

# environment variables of gpudask's own bookkeeping between its processes: never
# inherited by the clusters the bench starts
_GPUDASK_INTERNAL_ENV = ("GPUDASK_PROTOCOL", "GPUDASK_NWORKERS", "GPUDASK_GROUP", "GPUDASK_SHADOWED",
                         "GPUDASK_PROBED_FACTS", "GPUDASK_WORKER_INDEX")

_PROFILE_LOG_FORMAT = "%(asctime)s - %(process)d - %(name)s - %(levelname)s - %(message)s"
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - (?:(\d+) - )?([\w.]+) - (\w+) - (.*)$")


class TimeBox(Exception):
    """The configuration's share of --max-seconds is spent."""


class Interrupted(Exception):
    """SIGTERM / SIGINT: stop measuring, tear down, report what was measured."""


# --------------------------------------------------------------------------------------
# functions that run on workers: written as ordinary functions, sent as detached copies
# (module "__main__", no module globals) so that cloudpickle sends them by value
# --------------------------------------------------------------------------------------
def _w_make_array(nbytes, backend, seed):
    if backend == "cupy":
        import cupy

        x = cupy.random.default_rng(seed).random(nbytes // 8)
        cupy.cuda.get_current_stream().synchronize()
        return x
    import numpy

    return numpy.random.default_rng(seed).random(nbytes // 8)


def _w_consume(x):
    return float(x.sum())


def _w_random_block(block, backend, block_info=None):
    seed = 0
    if block_info is not None:
        seed = hash(tuple(block_info[0]["chunk-location"])) & 0xFFFFFFFF
    if backend == "cupy":
        import cupy

        return cupy.random.default_rng(seed).random(block.shape)
    import numpy

    return numpy.random.default_rng(seed).random(block.shape)


def _w_to_float(x):
    return float(x)


def _w_incoming(key, dask_worker=None):
    """This worker's transfer_incoming_log entries that brought ``key``."""
    out = []
    for entry in list(dask_worker.transfer_incoming_log):
        keys = entry.get("keys") or {}
        if key in keys:
            out.append({"duration": float(entry["duration"]), "total": int(entry["total"]),
                        "bandwidth": float(entry["bandwidth"]), "who": str(entry.get("who"))})
    return out


def _w_info(dask_worker=None):
    """What this worker process uses: UCX config and transports, GPU, gpudask."""
    import os
    import sys

    info = {"pid": os.getpid(), "gpudask_loaded": "gpudask" in sys.modules,
            "env": {k: v for k, v in sorted(os.environ.items())
                    if k.startswith("UCX_") or k in ("CUDA_VISIBLE_DEVICES", "RAPIDS_NO_INITIALIZE")}}
    try:
        import dask

        cfg = dask.config.get("distributed-ucxx", default=None)
        info["distributed_ucxx"] = {k: v for k, v in (cfg or {}).items() if k != "version"} or None
    except Exception as e:  # pragma: no cover - reported, never fatal
        info["distributed_ucxx"] = f"error: {e}"
    mod = sys.modules.get("distributed_ucxx.ucxx")
    ucxx = getattr(mod, "ucxx", None) if mod is not None else None
    if ucxx is not None:
        try:
            info["ucx_tls"] = ucxx.get_config().get("TLS")
        except Exception as e:
            info["ucx_tls"] = f"error: {e}"
        try:
            info["active_transports"] = sorted(ucxx.get_active_transports())
        except Exception as e:
            info["active_transports"] = f"error: {e}"
    try:
        from distributed.diagnostics.nvml import has_cuda_context

        ctx = has_cuda_context()
        info["cuda_context"] = bool(ctx.has_context)
        if ctx.has_context and ctx.device_info is not None:
            info["cuda_device"] = str(ctx.device_info.uuid)
    except Exception:
        info["cuda_context"] = None
    rmm = sys.modules.get("rmm")
    if rmm is not None and info.get("cuda_context"):
        try:
            info["rmm_resource"] = type(rmm.mr.get_current_device_resource()).__name__
        except Exception:
            pass
    return info


def _w_getpid():
    import os

    return os.getpid()


def _detached(f: Callable) -> Callable:
    """A copy of ``f`` that belongs to no importable module, so distributed/cloudpickle
    ship its code by value and the receiving worker never imports ``gpudask``."""
    import builtins
    import types

    g = types.FunctionType(f.__code__, {"__name__": "__main__", "__builtins__": builtins}, f.__name__,
                           f.__defaults__, f.__closure__)
    g.__kwdefaults__ = f.__kwdefaults__
    g.__qualname__ = f"_bench{f.__name__}"
    return g


# --------------------------------------------------------------------------------------
# host facts the bench needs (NVML only: never a CUDA context in this process)
# --------------------------------------------------------------------------------------
def _nvml_processes() -> list[dict[str, Any]] | None:
    """Compute processes on every GPU: pid, GPU index, used MiB.  None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                used = p.usedGpuMemory
                out.append({"pid": int(p.pid), "gpu": i, "MiB": None if used is None else used / MiB})
        return out
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    names = ["gpudask", "dask", "distributed", "distributed-ucxx-cu13", "distributed-ucxx-cu12", "ucxx-cu13",
             "ucxx-cu12", "libucx-cu13", "libucx-cu12", "rmm-cu13", "rmm-cu12", "cupy-cuda13x", "cupy-cuda12x",
             "cupy", "dask-cuda", "numpy", "nvidia-ml-py"]
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return out


def _proc_start_epoch(pid: int) -> float | None:
    """When process ``pid`` started, in time.time() seconds (10 ms resolution; psutil's
    create_time is off by up to a second because /proc/stat's btime is whole seconds)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        hz = os.sysconf("SC_CLK_TCK")
        offset = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return offset + ticks / hz
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# --------------------------------------------------------------------------------------
# process groups
# --------------------------------------------------------------------------------------
_LIVE: list[subprocess.Popen] = []
_USER_ENV: dict[str, str] | None = None  # os.environ before the bench changed it
_PRCTL: Any = None


def _set_pdeathsig() -> None:  # runs in the child between fork and exec: keep it trivial
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the bench, even if it is SIGKILLed


def _spawn(argv: list[str], env: dict[str, str], log_path: str, cwd: str) -> subprocess.Popen:
    global _PRCTL
    if _PRCTL is None and sys.platform.startswith("linux"):
        try:
            import ctypes

            _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _PRCTL = False
    log = open(log_path, "ab")
    try:
        p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             cwd=cwd, start_new_session=True, preexec_fn=_set_pdeathsig if _PRCTL else None)
    finally:
        log.close()
    _LIVE.append(p)
    return p


def _kill_groups(popens: list[subprocess.Popen], grace: float = 1.0) -> list[int]:
    """SIGTERM every process group (and every descendant, wherever it went), SIGKILL what
    is left after ``grace`` seconds.  Returns pids that survived (should be none)."""
    import psutil

    procs: dict[int, Any] = {}
    for p in popens:
        try:
            root = psutil.Process(p.pid)
            procs[root.pid] = root
            for c in root.children(recursive=True):
                procs[c.pid] = c
        except psutil.Error:
            pass
    groups = {p.pid for p in popens}
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in procs.values():
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(list(procs.values()), timeout=wait)
        procs = {p.pid: p for p in alive}
        for p in popens:
            try:
                p.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        if not procs:
            break
    for p in popens:
        if p in _LIVE:
            _LIVE.remove(p)
    return sorted(procs)


def _kill_all_live() -> None:
    if _LIVE:
        _kill_groups(list(_LIVE), grace=1.0)


# --------------------------------------------------------------------------------------
# configurations
# --------------------------------------------------------------------------------------
@dataclass
class Host:
    gpus: list[dict[str, Any]]
    driver: str | None
    tokens: list[str]  # visible GPUs, as CUDA_VISIBLE_DEVICES entries
    backend: str
    has_ucxx: bool
    has_dask_cuda: bool


@dataclass
class Options:
    nworkers: int
    nthreads: int
    repeat: int
    quick: bool
    pool_size: str
    death_timeout: int
    launch_timeout: float
    profile: bool
    proto_info: bool
    sizes: tuple[tuple[int, ...], int, int]


@dataclass
class Spec:
    name: str
    protocol: str
    scheduler_argv: list[str]
    scheduler_env: dict[str, str]
    workers: list[tuple[list[str], dict[str, str]]]  # one CLI process each
    notes: list[str] = field(default_factory=list)


def _dask(*args: str) -> list[str]:
    # `python -m dask`: the `dask` script need not be on PATH (pip --target installs)
    return [sys.executable, "-m", "dask", *args]


def _rotate(tokens: list[str], i: int) -> str:
    return ",".join(tokens[i:] + tokens[:i])


def _hand_placement(host: Host, n: int, argv: Callable[[int], list[str]]) -> list[tuple[list[str], dict[str, str]]]:
    """What users write by hand without gpudask: one CLI for all workers when they share
    one GPU (or there is none), else one CLI per worker with its GPU first in
    CUDA_VISIBLE_DEVICES (round-robin when there are more workers than GPUs)."""
    g = len(host.tokens)
    if g <= 1:
        return [(argv(n), {})]
    return [(argv(1), {"CUDA_VISIBLE_DEVICES": _rotate(host.tokens, i % g)}) for i in range(n)]


def build_spec(name: str, host: Host, opts: Options, sched_file: str, local_dir: str) -> Spec | str:
    """The commands and environment of one configuration, or why it is skipped."""
    n = opts.nworkers
    common = ["--scheduler-file", sched_file, "--nthreads", str(opts.nthreads), "--no-dashboard",
              "--death-timeout", str(opts.death_timeout), "--local-directory", local_dir]

    def scheduler(protocol: str, *extra: str) -> list[str]:
        return _dask("scheduler", "--port", "0", "--no-dashboard", "--protocol", protocol,
                     "--scheduler-file", sched_file, *extra)

    def stock(k: int, *extra: str) -> list[str]:
        return _dask("worker", *common, "--nworkers", str(k), *extra)

    gpu = bool(host.tokens)
    if name == "tcp":
        return Spec(name, "tcp", scheduler("tcp"), {}, _hand_placement(host, n, stock))
    if name == "ucx-stock":
        if not host.has_ucxx:
            return "distributed-ucxx is not installed"
        env = {"DASK_DISTRIBUTED_UCXX__TCP": "True"}
        if gpu:
            env.update({"DASK_DISTRIBUTED_UCXX__NVLINK": "True", "DASK_DISTRIBUTED_UCXX__CUDA_COPY": "True"})
        workers = _hand_placement(host, n, stock)
        notes = []
        if gpu:
            pool = {"DASK_DISTRIBUTED_UCXX__RMM__POOL_SIZE": opts.pool_size}
            workers = [(argv, {**wenv, **env, **pool}) for argv, wenv in workers]
        else:
            workers = [(argv, {**wenv, **env}) for argv, wenv in workers]
            notes.append("no GPU: tcp only, no RMM pool")
        return Spec(name, "ucx", scheduler("ucx"), dict(env), workers, notes)
    if name == "gpudask":
        protocol = "ucx" if host.has_ucxx else "tcp"
        notes = [] if host.has_ucxx else ["distributed-ucxx is not installed: protocol tcp"]
        return Spec(name, protocol, scheduler(protocol, "--preload", "gpudask"), {},
                    [(stock(n, "--preload", "gpudask"), {})], notes)
    if name == "dask-cuda":
        if not host.has_dask_cuda:
            return "dask-cuda is not installed"
        if not gpu:
            return "no GPU visible"
        if not host.has_ucxx:
            return "distributed-ucxx is not installed"

        def cuda(*extra: str) -> list[str]:
            return _dask("cuda", "worker", *common, "--rmm-pool-size", opts.pool_size, *extra)

        g = len(host.tokens)
        notes = []
        if n <= g:
            workers = [(cuda(), {"CUDA_VISIBLE_DEVICES": ",".join(host.tokens[:n])})]
        else:  # dask cuda worker starts one worker per listed GPU: one CLI per worker
            workers = [(cuda(), {"CUDA_VISIBLE_DEVICES": host.tokens[i % g]}) for i in range(n)]
            notes.append(f"{n} workers on {g} GPU(s): one `dask cuda worker` per worker")
        # dask-cuda's documented scheduler for UCX with automatic transport selection
        return Spec(name, "ucx", scheduler("ucx"), {"DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT": "True"},
                    workers, notes)
    raise click.BadParameter(f"unknown configuration {name!r}; accepted: {', '.join(CONFIGS)}",
                             param_hint="--configs")


def base_env(host: Host, opts: Options, protocol: str) -> dict[str, str]:
    env = {k: v for k, v in (_USER_ENV or os.environ).items() if k not in _GPUDASK_INTERNAL_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    env["UCX_WARN_UNUSED_ENV_VARS"] = "n"
    if protocol == "ucx" and not host.tokens:
        env.setdefault("UCX_TLS", "tcp")  # no GPU: UCX over TCP only
    if protocol == "ucx" and opts.proto_info:
        env["UCX_PROTO_INFO"] = "y"
    if opts.profile:
        env["DASK_DISTRIBUTED__ADMIN__LOG_FORMAT"] = _PROFILE_LOG_FORMAT
        env["DASK_LOGGING__GPUDASK"] = "info"
    return env


# --------------------------------------------------------------------------------------
# a running cluster
# --------------------------------------------------------------------------------------
class Cluster:
    def __init__(self, spec: Spec, host: Host, opts: Options, workdir: str):
        self.spec, self.host, self.opts, self.workdir = spec, host, opts, workdir
        self.sched_file = os.path.join(workdir, "scheduler.json")
        self.scheduler: subprocess.Popen | None = None
        self.worker_clis: list[subprocess.Popen] = []
        self.client: Any = None
        self.t_launch = 0.0  # time.time() at launch
        self.ready_s: float | None = None
        self.workers: list[str] = []
        self.worker_pids: dict[str, int] = {}
        self.nanny_pids: dict[str, int] = {}

    @property
    def popens(self) -> list[subprocess.Popen]:
        return [p for p in [self.scheduler, *self.worker_clis] if p is not None]

    def logs(self) -> list[str]:
        return sorted(os.path.join(self.workdir, f) for f in os.listdir(self.workdir) if f.endswith(".log"))

    def log_tail(self, lines: int = 12) -> str:
        out = []
        for path in self.logs():
            try:
                with open(path, errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
            except OSError:
                continue
            out.append(f"--- {os.path.basename(path)}\n" + "\n".join(tail))
        return "\n".join(out)

    def start(self, timeout: float) -> float:
        """Launch everything, wait for all workers; return the ready time in seconds."""
        from distributed import Client

        env = base_env(self.host, self.opts, self.spec.protocol)
        t0 = time.perf_counter()
        self.t_launch = time.time()
        self.scheduler = _spawn(self.spec.scheduler_argv, {**env, **self.spec.scheduler_env},
                                os.path.join(self.workdir, "scheduler.log"), self.workdir)
        for i, (argv, wenv) in enumerate(self.spec.workers):
            self.worker_clis.append(_spawn(argv, {**env, **wenv}, os.path.join(self.workdir, f"workers-{i}.log"),
                                           self.workdir))
        deadline = t0 + timeout
        while True:  # workers wait for the file themselves; the client needs it complete
            self._check_alive()
            try:
                with open(self.sched_file) as f:
                    if json.load(f).get("address"):
                        break
            except (OSError, ValueError):
                pass
            if time.perf_counter() > deadline:
                raise TimeoutError(f"no scheduler file after {timeout:.0f} s")
            time.sleep(0.02)
        self.client = Client(scheduler_file=self.sched_file, timeout=max(5.0, deadline - time.perf_counter()),
                             set_as_default=False)
        while True:
            try:
                step = min(2.0, max(0.1, deadline - time.perf_counter()))
                self.client.wait_for_workers(self.opts.nworkers, timeout=step)
                break
            except TimeoutError:
                self._check_alive()
                if time.perf_counter() > deadline:
                    have = len(self.client.scheduler_info(n_workers=-1)["workers"])
                    raise TimeoutError(f"{have} of {self.opts.nworkers} workers after {timeout:.0f} s") from None
        self.ready_s = time.perf_counter() - t0
        self.workers = sorted(self.client.scheduler_info(n_workers=-1)["workers"])
        return self.ready_s

    def _check_alive(self) -> None:
        for p in self.popens:
            if p.poll() is not None:
                what = "scheduler" if p is self.scheduler else "worker CLI"
                raise RuntimeError(f"{what} exited with {p.returncode}")

    def collect_pids(self) -> None:
        getpid = _detached(_w_getpid)
        self.worker_pids = dict(self.client.run(getpid))
        try:
            self.nanny_pids = dict(self.client.run(getpid, nanny=True))
        except Exception:
            self.nanny_pids = {}

    def stop(self) -> list[int]:
        if self.client is not None:
            try:
                self.client.close(timeout=5)
            except Exception:
                pass
            self.client = None
        return _kill_groups(self.popens)

    # -- process roles (for NVML accounting and the profile) --------------------------
    def roles(self) -> dict[int, str]:
        import psutil

        roles: dict[int, str] = {}
        for p in self.popens:
            try:
                for c in psutil.Process(p.pid).children(recursive=True):
                    roles[c.pid] = "helper"
            except psutil.Error:
                pass
        for p in self.worker_clis:
            roles[p.pid] = "nanny"
        if self.scheduler is not None:
            roles[self.scheduler.pid] = "scheduler"
        for pid in self.nanny_pids.values():
            roles[pid] = "nanny"
        for pid in self.worker_pids.values():
            roles[pid] = "worker"
        return roles


# --------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------
LOWER, HIGHER = "lower", "higher"


def _label(nbytes: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if nbytes >= size and nbytes % size == 0:
            return f"{nbytes // size}{unit}"
    return f"{nbytes}B"


def _figure(label: str, unit: str, better: str) -> dict[str, Any]:
    return {"label": label, "unit": unit, "better": better, "runs": [], "warmup": [], "best": None,
            "median": None, "note": None}


def _finish(fig: dict[str, Any]) -> None:
    runs = [r for r in fig["runs"] if r is not None]
    if runs:
        fig["best"] = min(runs) if fig["better"] == LOWER else max(runs)
        fig["median"] = statistics.median(runs)


class Runner:
    """Measures one configuration within its time box."""

    def __init__(self, spec: Spec, host: Host, opts: Options, workdir: str, deadline: float,
                 echo: Callable[[str], None], log_dir: str | None = None):
        self.spec, self.host, self.opts, self.workdir = spec, host, opts, workdir
        self.log_dir = log_dir
        self.deadline = deadline
        self.echo = echo
        self.figures: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = list(spec.notes)
        self.result: dict[str, Any] = {"name": spec.name, "protocol": spec.protocol, "status": "ok",
                                       "commands": {"scheduler": _argv_text(spec.scheduler_argv),
                                                    "workers": [_argv_text(a) for a, _ in spec.workers]},
                                       "env": {"scheduler": spec.scheduler_env,
                                               "workers": [e for _, e in spec.workers]}}
        self.launches = 0
        self.profiles: list[dict[str, Any]] = []
        self.strays: list[int] = []

    # -- time box ----------------------------------------------------------------------
    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def timeout(self, at_least: float) -> float:
        """A timeout for one step: what the time box leaves (plus a margin), never below
        ``at_least``, never more than 10 minutes."""
        return min(600.0, max(at_least, self.left() + 10.0))

    def _loop(self, fig: dict[str, Any], run: Callable[[], float | None], warmup: bool = True,
              estimate: float = 0.0) -> None:
        """Warm-up (unless --quick) then --repeat runs, each only if time is left."""
        total = self.opts.repeat + (1 if warmup and not self.opts.quick else 0)
        for i in range(total):
            last = fig["runs"][-1] if fig["runs"] else (fig["warmup"][-1] if fig["warmup"] else estimate)
            if self.left() < (last or 0.0) * 1.2 + 0.5:
                done = len(fig["runs"])
                fig["note"] = f"time box: {done} of {self.opts.repeat} runs"
                if not fig["runs"]:
                    raise TimeBox(fig["label"])
                return
            value = run()
            (fig["warmup"] if warmup and not self.opts.quick and i == 0 else fig["runs"]).append(value)

    # -- the configuration -------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        ready = self.figures["ready_s"] = _figure("ready", "s", LOWER)
        launches = 1 if self.opts.quick else self.opts.repeat + 1
        launch_budget = self.left() * (0.5 if launches > 1 else 1.0)
        t_start = time.perf_counter()
        for i in range(launches):
            if i > 0 and (time.perf_counter() - t_start + (ready["runs"] or ready["warmup"])[-1] * 1.5 > launch_budget
                          or self.left() < 30):
                ready["note"] = f"time box: {len(ready['runs'])} of {self.opts.repeat} launches"
                last = True
            else:
                last = i == launches - 1
            cluster = self._launch(i)
            if cluster is None:
                break  # failed, noted
            try:
                warm = i == 0 and not self.opts.quick
                (ready["warmup"] if warm else ready["runs"]).append(cluster.ready_s)
                self.echo(f"[{self.spec.name}] launch {i + 1}: ready in {cluster.ready_s:.2f} s"
                          + (" (warm-up)" if warm else ""))
                if self.opts.profile:
                    try:
                        cluster.collect_pids()
                        self.profiles.append(profile_launch(cluster))
                    except Exception as e:
                        self.notes.append(f"profile of launch {i + 1} failed: {type(e).__name__}: {e}")
                if last:
                    if not ready["runs"]:  # only the warm-up launch fitted: report it, say so
                        ready["runs"] = list(ready["warmup"])
                        ready["note"] = "time box: warm-up launch only"
                    try:
                        self._workloads(cluster)
                    except (Interrupted, TimeBox):
                        raise
                    except Exception as e:
                        self.result["status"] = "partial"
                        self.notes.append(f"workloads failed: {type(e).__name__}: {e}")
                        self.echo(f"[{self.spec.name}] workloads failed: {type(e).__name__}: {e}")
            finally:
                t_stop = time.perf_counter()
                self.strays += cluster.stop()
                self.keep_logs(cluster, i)
                self.echo(f"[{self.spec.name}] teardown {time.perf_counter() - t_stop:.1f} s")
            if last:
                break
        _finish(ready)
        for fig in self.figures.values():
            _finish(fig)
        self.result["figures"] = self.figures
        self.result["notes"] = self.notes
        if self.opts.profile:
            self.result["profile"] = summarize_profiles(self.profiles)
        if self.strays:
            self.notes.append(f"processes that survived SIGKILL: {self.strays}")
        return self.result

    def _launch(self, i: int) -> Cluster | None:
        workdir = os.path.join(self.workdir, f"launch-{i}")
        os.makedirs(workdir, exist_ok=True)
        # the scheduler file and local directory are per launch: rebuild the commands
        spec = build_spec(self.spec.name, self.host, self.opts, os.path.join(workdir, "scheduler.json"),
                          os.path.join(workdir, "local"))
        assert isinstance(spec, Spec)
        cluster = Cluster(spec, self.host, self.opts, workdir)
        timeout = min(self.opts.launch_timeout, max(20.0, self.left()))
        try:
            cluster.start(timeout)
            self.launches += 1
            return cluster
        except Interrupted:
            self.strays += cluster.stop()
            self.keep_logs(cluster, i)
            raise
        except Exception as e:
            self.strays += cluster.stop()
            self.keep_logs(cluster, i)
            self.result["status"] = "failed" if i == 0 else "partial"
            self.notes.append(f"launch {i + 1} failed: {type(e).__name__}: {e}")
            self.result["log_tail"] = cluster.log_tail()
            self.echo(f"[{self.spec.name}] launch {i + 1} failed: {e}\n{cluster.log_tail()}")
            return None

    def keep_logs(self, cluster: Cluster, i: int) -> None:
        if not self.log_dir:
            return
        dest = os.path.join(self.log_dir, self.spec.name, f"launch-{i}")
        os.makedirs(dest, exist_ok=True)
        for path in cluster.logs():
            shutil.copy(path, dest)

    def _workloads(self, cluster: Cluster) -> None:
        cluster.collect_pids()
        self.result["workers"] = {addr: {"pid": pid} for addr, pid in cluster.worker_pids.items()}
        self._transports(cluster)
        mem_ready = gpu_memory(cluster, self.host)
        steps: list[tuple[str, Callable[[], None]]] = []
        sizes, side, chunk = self.opts.sizes
        if len(cluster.workers) < 2:
            self.notes.append("fewer than 2 workers: no transfers")
        else:
            for nbytes in sizes:
                steps.append((f"transfer {_label(nbytes)}", lambda nbytes=nbytes: self._transfer(cluster, nbytes)))
        steps.append((f"transpose-sum {side}^2", lambda: self._transpose_sum(cluster, side, chunk)))
        for i, (label, step) in enumerate(steps):
            try:
                with cluster.client.as_current():  # distributed.wait() looks for the default client
                    step()
            except TimeBox:
                skipped = [s for s, _ in steps[i:]]
                self.notes.append("time box: skipped " + ", ".join(skipped))
                self.echo(f"[{self.spec.name}] time box: skipped {', '.join(skipped)}")
                break
            except Interrupted:
                raise
            except Exception as e:
                self.result["status"] = "partial"
                self.notes.append(f"{label} failed: {type(e).__name__}: {e}")
                self.echo(f"[{self.spec.name}] {label} failed: {type(e).__name__}: {e}")
        mem_end = gpu_memory(cluster, self.host)
        if self.opts.proto_info:
            self.result["proto_info"] = proto_info(cluster)
        mems = [m for m in (mem_ready, mem_end) if m is not None]
        if mems:
            fig = self.figures["gpu_mem_outside_workers_MiB"] = _figure("GPU memory outside workers", "MiB", LOWER)
            worst = max(mems, key=lambda m: m["outside_workers_MiB"] if m["outside_workers_MiB"] is not None else -1)
            if worst["outside_workers_MiB"] is not None:
                fig["runs"] = [worst["outside_workers_MiB"]]
            fig["note"] = worst.get("note")
            self.result["gpu_memory"] = {"at_ready": mem_ready, "after_workloads": mem_end}

    def _transports(self, cluster: Cluster) -> None:
        info = cluster.client.run(_detached(_w_info))
        self.result["transports"] = info
        if self.spec.name != "gpudask":
            loaded = [a for a, i in info.items() if i.get("gpudask_loaded")]
            if loaded:
                self.notes.append(f"gpudask was imported in stock workers {loaded}: results are not stock")

    def _transfer(self, cluster: Cluster, nbytes: int) -> None:
        from distributed import wait

        client = cluster.client
        a, b = cluster.workers[0], cluster.workers[1]
        label = _label(nbytes)
        t_fig = self.figures[f"transfer_{label}_s"] = _figure(f"transfer {label} (end to end)", "s", LOWER)
        bw_fig = self.figures[f"transfer_{label}_GBps"] = _figure(f"transfer {label} (bandwidth)", "GB/s", HIGHER)
        make, consume, incoming = _detached(_w_make_array), _detached(_w_consume), _detached(_w_incoming)
        timeout = self.timeout(max(30.0, nbytes / 1e8))  # 10 s per GB at worst
        seq = iter(range(1_000_000))

        def once() -> float:
            i = next(seq)
            tag = uuid.uuid4().hex[:8]
            src = client.submit(make, nbytes, self.host.backend, i, key=f"bench-src-{label}-{tag}",
                                workers=[a], allow_other_workers=False, pure=False)
            wait(src, timeout=timeout)
            if src.status != "finished":
                src.result()  # raises the worker's error
            t0 = time.perf_counter()
            dst = client.submit(consume, src, key=f"bench-dst-{label}-{tag}", workers=[b],
                                allow_other_workers=False, pure=False)
            dst.result(timeout=timeout)
            elapsed = time.perf_counter() - t0
            entries = client.run(incoming, src.key, workers=[b]).get(b, [])
            bw = None
            if entries:
                total = sum(e["total"] for e in entries)
                duration = sum(e["duration"] for e in entries)
                bw = total / duration / 1e9 if duration > 0 else None
            is_warm = not self.opts.quick and not t_fig["warmup"] and not t_fig["runs"]
            (bw_fig["warmup"] if is_warm else bw_fig["runs"]).append(bw)
            del src, dst
            return elapsed

        self._loop(t_fig, once, estimate=nbytes / 1e9)
        if not bw_fig["runs"] or all(v is None for v in bw_fig["runs"]):
            bw_fig["note"] = "no transfer_incoming_log entry for the key"
        self.echo(f"[{self.spec.name}] transfer {label}: {_brief(t_fig, 's')}, {_brief(bw_fig, 'GB/s')}")

    def _transpose_sum(self, cluster: Cluster, side: int, chunk: int) -> None:
        import operator

        import dask
        import dask.array as da
        import numpy as np
        from distributed import wait

        client = cluster.client
        fig = self.figures["transpose_sum_s"] = _figure(f"(x + x.T).sum() {side}^2 chunks {chunk}", "s", LOWER)
        meta = np.empty((0, 0))
        x = da.empty((side, side), chunks=chunk, dtype="f8").map_blocks(
            _detached(_w_random_block), self.host.backend, dtype="f8", meta=meta)
        x = client.persist(x)
        wait(x, timeout=self.timeout(60.0))
        to_float = _detached(_w_to_float)

        def once() -> float:
            y = da.blockwise(operator.add, "ij", x, "ij", x.T, "ij", dtype="f8", meta=meta,
                             name=f"bench-xpxt-{uuid.uuid4().hex[:8]}")
            total = dask.delayed(to_float, pure=False)(y.sum())
            t0 = time.perf_counter()
            fut = client.compute(total)
            fut.result(timeout=self.timeout(60.0))
            elapsed = time.perf_counter() - t0
            del fut
            return elapsed

        try:
            self._loop(fig, once, estimate=1.0)
        finally:
            del x
        self.echo(f"[{self.spec.name}] transpose-sum: {_brief(fig, 's')}")


def _brief(fig: dict[str, Any], unit: str) -> str:
    runs = [r for r in fig["runs"] if r is not None]
    if not runs:
        return f"- {unit}"
    best = min(runs) if fig["better"] == LOWER else max(runs)
    return f"best {_num(best)} {unit}, median {_num(statistics.median(runs))} {unit}"


def _argv_text(argv: list[str]) -> str:
    out = list(argv)
    if out[:3] == [sys.executable, "-m", "dask"]:
        out = ["dask", *out[3:]]
    return " ".join(out)


# --------------------------------------------------------------------------------------
# GPU memory, transports seen by UCX, profile
# --------------------------------------------------------------------------------------
def gpu_memory(cluster: Cluster, host: Host) -> dict[str, Any] | None:
    if not host.gpus:
        return None
    procs = _nvml_processes()
    if procs is None:
        return {"outside_workers_MiB": None, "processes": [], "note": "NVML process query failed"}
    roles = cluster.roles()
    me = os.getpid()
    rows, outside, foreign = [], 0.0, []
    for p in procs:
        role = roles.get(p["pid"]) or ("bench client" if p["pid"] == me else None)
        rows.append({**p, "role": role or "not ours"})
        if role is None:
            foreign.append(p)
        elif role not in ("worker", "bench client") and p["MiB"] is not None:
            outside += p["MiB"]
    note = None
    ours = [r for r in rows if r["role"] not in ("not ours", "bench client")]
    if procs and not ours:
        # NVML reports pids of another PID namespace (containers): attribution impossible
        return {"outside_workers_MiB": None, "processes": rows,
                "note": "NVML pids are not this PID namespace's: no attribution"}
    if any(r["role"] == "bench client" for r in rows):
        note = "the bench client holds a CUDA context (not counted)"
    if foreign:
        note = (note + "; " if note else "") + f"{len(foreign)} other process(es) on the GPUs (not counted)"
    return {"outside_workers_MiB": round(outside, 1), "processes": rows, "note": note}


_TL = re.compile(r"\b(tcp|cuda_ipc|cuda_copy|gdr_copy|rc_mlx5|rc_verbs|dc_mlx5|ud_mlx5|ud_verbs|rc|dc|ud|posix|"
                 r"sysv|cma|knem|xpmem|self)/([\w:.\-]+)")
_UCX_PREFIX = re.compile(r"\[\d+\.\d+\]\s+\[[^:\]]+:(\d+):")


def proto_info(cluster: Cluster) -> dict[str, Any]:
    """Transports UCX reported choosing (UCX_PROTO_INFO=y), per worker process."""
    by_pid: dict[int, set[str]] = {}
    for path in cluster.logs():
        try:
            with open(path, errors="replace") as f:
                for line in f:  # "[time] [host:pid:thread]   | 0..inf | zero-copy | cuda_ipc/cuda |"
                    m = _UCX_PREFIX.search(line)
                    if m and "|" in line:
                        for tl, dev in _TL.findall(line):
                            by_pid.setdefault(int(m.group(1)), set()).add(f"{tl}/{dev}")
        except OSError:
            continue
    out = {}
    for addr, pid in cluster.worker_pids.items():
        out[addr] = sorted(by_pid.get(pid, set()))
    if not any(out.values()):
        return {"note": "no UCX_PROTO_INFO lines found in the logs", "workers": out}
    return {"workers": out}


_STAGES = {"scheduler": ("start", "gpudask", "listen"),
           "nanny": ("start", "gpudask", "listen"),
           "worker": ("start", "gpudask", "listen", "registered")}


def _parse_log_time(text: str) -> float | None:
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def profile_launch(cluster: Cluster) -> dict[str, Any]:
    """Per-process timestamps of one launch, in seconds after the launch: process start
    -> gpudask imported (its startup line) -> listening -> registered with the scheduler."""
    t0 = cluster.t_launch
    roles = cluster.roles()
    events: dict[int, dict[str, float]] = {}
    for path in cluster.logs():
        try:
            with open(path, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            m = _LOG_LINE.match(line)
            if not m or not m.group(2):
                continue
            t = _parse_log_time(m.group(1))
            if t is None:
                continue
            pid, logger, msg = int(m.group(2)), m.group(3), m.group(5)
            ev = events.setdefault(pid, {})
            stage = None
            if logger == "gpudask" and re.match(r"gpudask \S+ \(", msg):
                stage = "gpudask"
            elif "Scheduler at:" in msg or "Start Nanny at:" in msg or "Start worker at:" in msg:
                stage = "listen"
            elif "Registered to:" in msg:
                stage = "registered"
            if stage:
                ev[stage] = max(ev.get(stage, 0.0), t - t0)  # several nannies in one process: the last
    per_process = []
    for pid, role in sorted(roles.items()):
        if role not in _STAGES:
            continue
        start = _proc_start_epoch(pid)
        row = {"pid": pid, "role": role, "start": None if start is None else round(start - t0, 3)}
        for stage in _STAGES[role][1:]:
            v = events.get(pid, {}).get(stage)
            row[stage] = None if v is None else round(v, 3)
        per_process.append(row)
    return {"ready": round(cluster.ready_s or 0.0, 3), "processes": per_process}


def summarize_profiles(profiles: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over launches of each role's stage, the slowest process of a role counting."""
    table: dict[str, list[float]] = {}
    for prof in profiles:
        worst: dict[str, float] = {}
        for row in prof["processes"]:
            for stage in _STAGES[row["role"]]:
                v = row.get(stage)
                if v is not None:
                    k = f"{row['role']}.{stage}"
                    worst[k] = max(worst.get(k, -1e9), v)
        worst["ready"] = prof["ready"]
        for k, v in worst.items():
            table.setdefault(k, []).append(v)
    order = [f"{r}.{s}" for r, stages in _STAGES.items() for s in stages] + ["ready"]
    median = {k: round(statistics.median(table[k]), 3) for k in order if k in table}
    return {"median_s_after_launch": median, "launches": profiles}


# --------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------
def _num(v: float | None) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def add_ratios(results: list[dict[str, Any]]) -> None:
    """ratio = this configuration's value / the first configuration's (same figure)."""
    base = next((r for r in results if r.get("figures")), None)
    for r in results:
        for key, fig in (r.get("figures") or {}).items():
            ref = (base.get("figures") or {}).get(key) if base else None
            for stat in ("best", "median"):
                v, b = fig.get(stat), (ref or {}).get(stat)
                fig[f"ratio_{stat}"] = (v / b) if (v is not None and b) else None


def _transport_summary(r: dict[str, Any]) -> str:
    info = r.get("transports") or {}
    if not info:
        return "-"
    if r.get("protocol") != "ucx":
        return "tcp comm (no UCX)"
    parts = []
    proto = (r.get("proto_info") or {}).get("workers") or {}
    for i, (addr, w) in enumerate(sorted(info.items())):
        tl = w.get("active_transports")
        tls = ",".join(tl) if isinstance(tl, list) else (w.get("ucx_tls") or w.get("env", {}).get("UCX_TLS") or "?")
        used = proto.get(addr)
        parts.append(f"w{i}: {tls}" + (f" [endpoints: {','.join(sorted({u.split('/')[0] for u in used}))}]"
                                       if used else ""))
    return "; ".join(parts)


def render_table(report: dict[str, Any]) -> str:
    results = report["configs"]
    m = report["machine"]
    s = report["settings"]
    gpus = m.get("gpus") or []
    gpu_text = (f"{len(gpus)} x {gpus[0]['name']}" if gpus else "no GPU")
    lines = [f"gpudask bench, {report['date']}, {m['hostname']}: {m['cpu_count']} CPUs, {gpu_text}"
             + (f", driver {m['driver']}" if m.get("driver") else ""),
             f"{s['nworkers']} workers x {s['nthreads']} thread(s), backend {s['backend']}, repeat {s['repeat']}"
             + (", quick" if s["quick"] else "") + (f", max {s['max_seconds']:.0f} s" if s.get("max_seconds") else ""),
             "cells: best / median (median relative to the first configuration)", ""]
    names = [r["name"] for r in results]
    keys: list[str] = []
    for r in results:
        for k in r.get("figures") or {}:
            if k not in keys:
                keys.append(k)
    headers = ["figure", "unit", *names]
    rows = []
    for k in keys:
        label = unit = None
        cells = []
        for r in results:
            fig = (r.get("figures") or {}).get(k)
            if fig is None:
                cells.append("-" if r.get("status") != "skipped" else "skipped")
                continue
            label, unit = fig["label"], fig["unit"]
            if fig["best"] is None:
                cells.append("-")
                continue
            cell = _num(fig["best"]) if fig["best"] == fig["median"] and len(fig["runs"]) <= 1 else \
                f"{_num(fig['best'])} / {_num(fig['median'])}"
            ratio = fig.get("ratio_median")
            if ratio is not None and r is not results[0]:
                cell += f" (x{ratio:.2f})"
            cells.append(cell)
        rows.append([label or k, unit or "", *cells])
    rows.append(["UCX transports", "", *[_transport_summary(r) if r.get("status") != "skipped" else "skipped"
                                         for r in results]])
    from gpudask.report import table

    lines.append(table(headers, rows))
    notes = []
    for r in results:
        for n in r.get("notes") or []:
            notes.append(f"{r['name']}: {n}")
        for key, fig in (r.get("figures") or {}).items():
            if fig.get("note"):
                notes.append(f"{r['name']}: {fig['label']}: {fig['note']}")
        mem = (r.get("gpu_memory") or {}).get("after_workloads")
        if mem and mem.get("processes"):
            parts = [f"{p['role']} {p['pid']} {_num(p['MiB'])} MiB" for p in mem["processes"]]
            notes.append(f"{r['name']}: GPU processes: " + ", ".join(parts))
        prof = (r.get("profile") or {}).get("median_s_after_launch")
        if prof:
            notes.append(f"{r['name']}: profile (median s after launch): "
                         + ", ".join(f"{k} {v:.2f}" for k, v in prof.items()))
    notes += report.get("notes") or []
    if notes:
        lines += ["", "notes:"] + [f"- {n}" for n in notes]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------
def run_bench(configs: list[str], opts: Options, host: Host, max_seconds: float | None, log_dir: str | None,
              echo: Callable[[str], None]) -> dict[str, Any]:
    t_start = time.perf_counter()
    end = t_start + max_seconds if max_seconds else math.inf
    report: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"hostname": socket.gethostname(), "cpu_count": len(os.sched_getaffinity(0)),
                    "gpus": host.gpus, "visible": host.tokens, "driver": host.driver,
                    "python": sys.version.split()[0], "packages": _versions()},
        "settings": {"configs": configs, "nworkers": opts.nworkers, "nthreads": opts.nthreads,
                     "repeat": opts.repeat, "quick": opts.quick, "backend": host.backend,
                     "transfer_bytes": list(opts.sizes[0]), "array_side": opts.sizes[1],
                     "chunk_side": opts.sizes[2], "pool_size": opts.pool_size, "max_seconds": max_seconds,
                     "profile": opts.profile, "ucx_proto_info": opts.proto_info},
        "configs": [], "notes": []}
    if not host.tokens:
        report["notes"].append("no GPU visible: NumPy arrays, smaller sizes; ucx configurations get UCX_TLS=tcp")
    elif host.backend != "cupy":
        report["notes"].append("GPU visible but cupy is not importable: NumPy arrays, smaller sizes")
    root = tempfile.mkdtemp(prefix="gpudask-bench-")  # scheduler files, worker directories
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    results = report["configs"]
    try:
        todo = []
        for name in configs:  # skipped configurations take no share of the time box
            workdir = os.path.join(root, name)
            os.makedirs(workdir, exist_ok=True)
            todo.append((name, workdir, build_spec(name, host, opts, os.path.join(workdir, "scheduler.json"),
                                                   workdir)))
        runnable = sum(1 for _, _, spec in todo if not isinstance(spec, str))
        while todo:
            name, workdir, spec = todo.pop(0)
            if isinstance(spec, str):
                results.append({"name": name, "status": "skipped", "notes": [spec], "figures": {}})
                echo(f"[{name}] skipped: {spec}")
                continue
            left = end - time.perf_counter()
            if left < 20:
                results.append({"name": name, "status": "skipped", "figures": {},
                                "notes": ["time box: --max-seconds spent before this configuration"]})
                echo(f"[{name}] skipped: time box")
                runnable -= 1
                continue
            share = left / runnable
            runnable -= 1
            runner = Runner(spec, host, opts, workdir, time.perf_counter() + share, echo, log_dir)
            try:
                results.append(runner.run())
            except Interrupted:
                runner.result.update({"status": "interrupted", "figures": runner.figures, "notes": runner.notes})
                for fig in runner.figures.values():
                    _finish(fig)
                results.append(runner.result)
                for rest, _, _ in todo:
                    results.append({"name": rest, "status": "skipped", "figures": {}, "notes": ["interrupted"]})
                report["notes"].append("interrupted by a signal: partial results")
                break
    except Interrupted:
        report["notes"].append("interrupted by a signal: partial results")
    finally:
        _kill_all_live()
        shutil.rmtree(root, ignore_errors=True)
    add_ratios(results)
    report["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    return report


def detect_host(backend: str) -> Host:
    """The GPUs of this host from gpudask's own facts (NVML, no CUDA context)."""
    from gpudask.facts import probe_facts

    facts = probe_facts()
    visible = facts.visible_gpus()
    cvd = facts.cuda_visible_devices
    # the user's own CUDA_VISIBLE_DEVICES entries when set, so hand-set configurations use them as written
    tokens = ([t.strip() for t in cvd.split(",") if t.strip()][:len(visible)] if cvd
              else [str(g.index) for g in visible])
    gpus = [{"index": g.index, "name": g.name, "uuid": g.uuid, "memory_total_MiB": g.memory_total // MiB}
            for g in facts.gpus]
    driver = facts.driver_version
    if backend == "auto":
        backend = "cupy" if tokens and _has_module("cupy") else "numpy"
    return Host(gpus, driver, tokens, backend, _has_module("distributed_ucxx"), _has_module("dask_cuda"))


def _on_signal(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


@click.command(name="bench", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--configs", default=",".join(CONFIGS), show_default=True,
              help="Comma-separated configurations, the first one is the reference for ratios.")
@click.option("--nworkers", type=click.IntRange(min=1), default=None,
              help="Workers per configuration (default: one per visible GPU, at least 2).")
@click.option("--nthreads", type=click.IntRange(min=1), default=1, show_default=True,
              help="Threads per worker, the same for every configuration.")
@click.option("--repeat", type=click.IntRange(min=1), default=5, show_default=True,
              help="Measured runs per figure (after one warm-up run).")
@click.option("--quick", is_flag=True,
              help="Smoke test: small sizes, no warm-up, one cluster launch per configuration.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--max-seconds", type=click.FloatRange(min=1), default=None,
              help="Time box for the whole bench; figures that do not fit are skipped with a note.")
@click.option("--profile", is_flag=True,
              help="Record where ready time goes: per-process start, gpudask import, listen, registration.")
@click.option("--ucx-proto-info", "proto_info", is_flag=True,
              help="Set UCX_PROTO_INFO=y in ucx configurations and report the transports UCX selected.")
@click.option("--pool-size", default="1GB", show_default=True,
              help="RMM pool of the hand-set configurations (ucx-stock, dask-cuda); gpudask decides its own.")
@click.option("--backend", type=click.Choice(["auto", "cupy", "numpy"]), default="auto", show_default=True,
              help="Array library on the workers (auto: cupy with a GPU, numpy without).")
@click.option("--launch-timeout", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="Seconds to wait for a cluster to be ready.")
@click.option("--death-timeout", type=click.IntRange(min=1), default=60, show_default=True,
              help="Workers' --death-timeout (they exit when the scheduler is gone this long).")
@click.option("--log-dir", type=click.Path(file_okay=False), default=None,
              help="Keep the process logs here (default: a temporary directory, removed).")
@click.option("--table-file", type=click.Path(dir_okay=False), default=None,
              help="Also write the table to this file.")
@click.option("--show", "show", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Print the table of a previous --json result and exit (runs nothing).")
def bench_command(configs: str, nworkers: int | None, nthreads: int, repeat: int, quick: bool, as_json: bool,
                  max_seconds: float | None, profile: bool, proto_info: bool, pool_size: str, backend: str,
                  launch_timeout: float, death_timeout: int, log_dir: str | None, table_file: str | None,
                  show: str | None) -> None:
    """Benchmark tcp, ucx-stock, gpudask and dask-cuda side by side on real processes.

    Each configuration gets a real `dask scheduler` and N workers as separate processes,
    measured and then killed: ready time, worker-to-worker transfers, (x + x.T).sum(),
    GPU memory outside the workers, the UCX transports in use.  Progress goes to stderr.
    """
    if show:
        with open(show) as f:
            click.echo(render_table(json.load(f)))
        return
    # this process is the client: UCX must print nothing on stdout (--json) and, without
    # a GPU, use TCP only.  The clusters get the user's environment, not these.
    global _USER_ENV
    _USER_ENV = dict(os.environ)
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    names = [c.strip() for c in configs.split(",") if c.strip()]
    bad = [c for c in names if c not in CONFIGS]
    if bad or not names:
        raise click.BadParameter(f"{','.join(bad) or configs!r}: accepted: {', '.join(CONFIGS)}",
                                 param_hint="--configs")
    host = detect_host(backend)
    if not host.tokens:
        os.environ.setdefault("UCX_TLS", "tcp")
    if host.backend == "cupy" and not host.tokens:
        raise click.BadParameter("cupy needs a visible GPU", param_hint="--backend")
    sizes = FULL_SIZES if host.backend == "cupy" and not quick else SMALL_SIZES
    opts = Options(nworkers=nworkers or max(2, len(host.tokens)), nthreads=nthreads, repeat=repeat, quick=quick,
                   pool_size=pool_size, death_timeout=death_timeout, launch_timeout=launch_timeout,
                   profile=profile, proto_info=proto_info, sizes=sizes)

    def echo(msg: str) -> None:
        click.echo(msg, err=True)

    import cloudpickle  # noqa: F401  (distributed needs it; fail here, not in a worker)

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        report = run_bench(names, opts, host, max_seconds, log_dir, echo)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    text = render_table(report)
    if table_file:
        with open(table_file, "w") as f:
            f.write(text + "\n")
    click.echo(json.dumps(report, indent=1, default=str) if as_json else text)


def bench_main(args: list[str]) -> None:
    """Entry point of ``gpudask bench`` (the CLI passes its arguments through)."""
    bench_command.main(args=list(args), prog_name="gpudask bench")

"""What each configuration runs: the host, the options, the commands and environments."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from gpudask.testing.processes import dask_command

# raw-ucxx is not a cluster: two plain ucxx processes (gpudask_bench.raw_ucxx), the
# transfers' ceiling; last, so that it can compare its placement with gpudask's workers
CONFIGS = ("tcp", "ucx-stock", "gpudask", "dask-cuda", "raw-ucxx")
MiB = 2**20

# sizes: (transfer sizes in bytes, square array side, chunk side)
FULL_SIZES = ((10**6, 64 * 10**6, 10**9), 20000, 2000)
SMALL_SIZES = ((10**6, 8 * 10**6, 64 * 10**6), 4000, 500)

# gpudask's bookkeeping between its processes (docs/configuration.md), and the per-process
# variables: never inherited by the clusters the bench starts
GPUDASK_INTERNAL_ENV = ("GPUDASK_HOST_PLAN", "GPUDASK_GROUP", "GPUDASK_WARNED", "GPUDASK_PROBED_FACTS",
                         "GPUDASK_WORKER_INDEX")

_PROFILE_LOG_FORMAT = "%(asctime)s - %(process)d - %(name)s - %(levelname)s - %(message)s"


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
    # device memory limit of the spill launch (bytes; 0 = no spill figure)
    spill_limit: int = 0
    # the environment the bench was started with, before it changed its own: the clusters get this
    user_env: dict[str, str] | None = None
    pulls: int = 20
    config_env: dict[str, dict[str, str]] = field(default_factory=dict)
    workloads: bool = True


@dataclass
class Spec:
    name: str
    protocol: str
    scheduler_argv: list[str]
    scheduler_env: dict[str, str]
    workers: list[tuple[list[str], dict[str, str]]]  # one CLI process each
    notes: list[str] = field(default_factory=list)


def _hand_placement(host: Host, n: int, argv: Callable[[int], list[str]]) -> list[tuple[list[str], dict[str, str]]]:
    """What users write by hand without gpudask: one CLI for all workers when they share
    one GPU (or there is none), else one CLI per worker with its GPU first in
    CUDA_VISIBLE_DEVICES (round-robin when there are more workers than GPUs)."""
    g = len(host.tokens)
    if g <= 1:
        return [(argv(n), {})]
    return [(argv(1), {"CUDA_VISIBLE_DEVICES": ",".join(host.tokens[i % g:] + host.tokens[:i % g])})
            for i in range(n)]


# configurations that spill GPU objects above a device memory limit, and how each is told
# the limit of the spill launch: gpudask through its config, dask-cuda through its CLI
SPILLING = ("gpudask", "dask-cuda")


def build_spec(name: str, host: Host, opts: Options, sched_file: str, local_dir: str,
               spill: bool = False) -> Spec | str:
    """The commands and environment of one configuration, or why it is skipped; ``--config-env``
    added to every process of the configuration, and said in its notes.  ``spill``: the spill
    launch, workers started with ``opts.spill_limit`` as their device memory limit."""
    spec = _build_spec(name, host, opts, sched_file, local_dir, spill)
    extra = opts.config_env.get(name)
    if isinstance(spec, Spec) and extra:
        spec.scheduler_env = {**spec.scheduler_env, **extra}
        spec.workers = [(argv, {**wenv, **extra}) for argv, wenv in spec.workers]
        spec.notes.append("--config-env: " + " ".join(f"{k}={v}" for k, v in sorted(extra.items())))
    return spec


def parse_config_env(items: tuple[str, ...] | list[str], names: list[str]) -> dict[str, dict[str, str]]:
    """``--config-env NAME:KEY=VALUE`` items as {NAME: {KEY: VALUE}}; ValueError says what is wrong."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        name, sep, assignment = item.partition(":")
        key, eq, value = assignment.partition("=")
        if not sep or not eq or not key.strip() or not name.strip():
            raise ValueError(f"{item!r}: accepted: NAME:KEY=VALUE, e.g. gpudask:DASK_DISTRIBUTED__COMM__OFFLOAD=False")
        if name not in names:
            raise ValueError(f"{item!r}: {name!r} is not one of this run's configurations ({', '.join(names)})")
        if name == "raw-ucxx":
            raise ValueError(f"{item!r}: raw-ucxx starts no cluster; it takes the bench's own environment")
        out.setdefault(name, {})[key.strip()] = value
    return out


def _build_spec(name: str, host: Host, opts: Options, sched_file: str, local_dir: str,
                spill: bool = False) -> Spec | str:
    n = opts.nworkers
    if spill and name not in SPILLING:
        raise ValueError(f"{name} has no device memory limit")
    common = ["--scheduler-file", sched_file, "--nthreads", str(opts.nthreads), "--no-dashboard",
              "--death-timeout", str(opts.death_timeout), "--local-directory", local_dir]

    def scheduler(protocol: str, *extra: str) -> list[str]:
        return dask_command("scheduler", "--port", "0", "--no-dashboard", "--protocol", protocol,
                            "--scheduler-file", sched_file, *extra)

    def stock(k: int, *extra: str) -> list[str]:
        return dask_command("worker", *common, "--nworkers", str(k), *extra)

    gpu = bool(host.tokens)
    if name == "tcp":
        return Spec(name, "tcp", scheduler("tcp"), {}, _hand_placement(host, n, stock))
    if name == "ucx-stock":
        if not host.has_ucxx:
            return "distributed-ucxx is not installed"
        env = {"DASK_DISTRIBUTED_UCXX__TCP": "True"}
        if gpu:
            env.update({"DASK_DISTRIBUTED_UCXX__NVLINK": "True", "DASK_DISTRIBUTED_UCXX__CUDA_COPY": "True"})
        pool = {"DASK_DISTRIBUTED_UCXX__RMM__POOL_SIZE": opts.pool_size} if gpu else {}
        workers = [(argv, {**wenv, **env, **pool}) for argv, wenv in _hand_placement(host, n, stock)]
        return Spec(name, "ucx", scheduler("ucx"), dict(env), workers,
                    [] if gpu else ["no GPU: tcp only, no RMM pool"])
    if name == "gpudask":
        protocol = "ucx" if host.has_ucxx else "tcp"
        notes = [] if host.has_ucxx else ["distributed-ucxx is not installed: protocol tcp"]
        limit = {"DASK_GPUDASK__SPILL__DEVICE_MEMORY_LIMIT": str(opts.spill_limit)} if spill else {}
        return Spec(name, protocol, scheduler(protocol, "--preload", "gpudask"), {},
                    [(stock(n, "--preload", "gpudask"), limit)], notes)
    if name == "dask-cuda":
        if not host.has_dask_cuda:
            return "dask-cuda is not installed"
        if not gpu:
            return "no GPU visible"
        if not host.has_ucxx:
            return "distributed-ucxx is not installed"

        limit = ("--device-memory-limit", str(opts.spill_limit)) if spill else ()

        def cuda(*extra: str) -> list[str]:
            return dask_command("cuda", "worker", *common, "--rmm-pool-size", opts.pool_size, *limit, *extra)

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
    raise ValueError(f"unknown configuration {name!r}")  # the CLI accepts only CONFIGS


def base_env(host: Host, opts: Options, protocol: str) -> dict[str, str]:
    user_env = opts.user_env if opts.user_env is not None else os.environ
    env = {k: v for k, v in user_env.items() if k not in GPUDASK_INTERNAL_ENV}
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
        backend = "cupy" if tokens and has_module("cupy") else "numpy"
    return Host(gpus, driver, tokens, backend, has_module("distributed_ucxx"), has_module("dask_cuda"))


def has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def versions() -> dict[str, str | None]:
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

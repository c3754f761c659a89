"""RMM pools in worker processes.

Plan (pure, any process): :func:`gpudask_plan_memory` turns the ``gpudask.rmm.*``
settings, the worker's GPU and the UCX transports in effect into ``plan.memory``
(allocator, initial and maximum pool size in bytes, ...), or into no memory setup.
Apply (worker processes only): :func:`gpudask_setup_memory` builds that RMM memory
resource at import time of the preload, before ``listen()`` and the first task, points
CuPy / Numba / PyTorch at it and returns what it built (published in the worker's
startup information).  docs/memory.md is the user-facing description.

Nothing here imports rmm, cupy, numba or torch at module level: the plan runs in the
``dask worker`` CLI and in ``gpudask info`` too.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from gpudask import hookimpl
from gpudask.config import Option, parse_bool, parse_name_list
from gpudask.errors import ConfigError, GpudaskError

name = "rmm"
priority = 100

ALLOCATORS = ("pool", "async", "managed", "default")
LIBRARIES = ("cupy", "torch", "numba")
ALIGNMENT = 256
DEFAULT_FRACTION = 0.5
# distributed-ucxx builds a pool from these keys in *every* process that opens UCX
# (``init_once``); gpudask keeps them unset and builds worker pools itself.
UCXX_POOL_KEYS = ("distributed-ucxx.rmm.pool-size", "distributed.rmm.pool-size")

SIZE_FORM = ("a size (4GB = 4*10**9 bytes, 4GiB = 2**32, 4000000000) or a fraction of the GPU's memory "
             "(0.5, '0.5', '50%')")
_OFF_WORDS = ("off", "false", "no", "disabled")


# --------------------------------------------------------------------------- parsing
def _parse_size(value: Any) -> float | int:
    """A size: ``float`` in (0, 1] = fraction of the GPU, ``int`` > 1 = bytes, ``0`` = zero.

    Raises ValueError (the accepted form) for anything else.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(SIZE_FORM)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError(SIZE_FORM)
        if text.endswith("%"):
            try:
                number = float(text[:-1]) / 100
            except ValueError:
                raise ValueError(SIZE_FORM) from None
            if not 0 <= number <= 1:
                raise ValueError("a percentage from 0% to 100%, or " + SIZE_FORM)
            return number if number else 0
        try:
            number = float(text)
        except ValueError:
            from dask.utils import parse_bytes

            try:
                nbytes = parse_bytes(text)
            except (ValueError, KeyError, TypeError):
                raise ValueError(SIZE_FORM) from None
            if nbytes < 0:
                raise ValueError("a non-negative size: " + SIZE_FORM)
            return int(nbytes)
    else:
        number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise ValueError(SIZE_FORM)
    if number < 0:
        raise ValueError("a non-negative size: " + SIZE_FORM)
    if number == 0:
        return 0
    if number <= 1:
        return float(number)
    return int(number)


def parse_pool_size(value: Any) -> float | int | bool | None:
    """``None`` = auto (gpudask decides), ``False`` = no pool, else a size."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("auto", "")):
        return None
    if value is False or (isinstance(value, str) and value.strip().lower() in _OFF_WORDS):
        return False
    size = _parse_size(value)
    return False if size == 0 else size


def parse_optional_size(value: Any) -> float | int | None:
    """A size or null; zero is refused (a zero maximum or scheduler pool means nothing)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    size = _parse_size(value)
    if size == 0:
        raise ValueError("a size greater than 0 or null: " + SIZE_FORM)
    return size


def parse_threshold(value: Any) -> float | int | None:
    """A size or null; zero is allowed (release everything at each synchronisation)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    return _parse_size(value)


def parse_allocator(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return None
    if isinstance(value, str) and value.strip().lower() in ALLOCATORS:
        return value.strip().lower()
    raise ValueError(" | ".join(ALLOCATORS) + " or null (auto)")


def parse_libraries(value: Any) -> list[str]:
    if value is False or (isinstance(value, str) and value.strip().lower() in ("none", "off")):
        return []
    names = [n.lower() for n in parse_name_list(value)]
    bad = [n for n in names if n not in LIBRARIES]
    if bad:
        raise ValueError(f"a list of library names among {', '.join(LIBRARIES)} (not {', '.join(bad)})")
    return list(dict.fromkeys(names))


def parse_log_directory(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, (str, os.PathLike)):
        return os.path.expanduser(os.fspath(value))
    raise ValueError("a directory path or null")


@hookimpl
def gpudask_config_options():
    return [
        Option("gpudask.rmm.pool-size", None,
               "Initial RMM pool size of each worker: bytes ('4GB', '4GiB') or a fraction of its GPU (0.5); "
               "null/'auto': a pool of 0.5 of the GPU when UCX uses NVLink or InfiniBand, else none; "
               "false/'off'/0: no pool.",
               parse_pool_size, SIZE_FORM + ", 'auto'/null, or false/'off'/0 (no pool)",
               legacy=UCXX_POOL_KEYS),
        Option("gpudask.rmm.maximum-pool-size", None,
               "Largest size the pool may grow to (same forms as pool-size); null: no limit.",
               parse_optional_size, SIZE_FORM + " or null (no limit)"),
        Option("gpudask.rmm.allocator", None,
               "pool (RMM pool), async (cudaMallocAsync), managed (CUDA managed memory), "
               "default (cudaMalloc through RMM, no pool); null: pool when a pool is wanted.",
               parse_allocator, " | ".join(ALLOCATORS) + " or null (auto)"),
        Option("gpudask.rmm.managed-memory", False,
               "Back the pool with CUDA managed memory (like dask-cuda's --rmm-managed-memory).",
               parse_bool, "true or false"),
        Option("gpudask.rmm.release-threshold", None,
               "async allocator only: memory kept reserved by the driver's pool (same forms as pool-size).",
               parse_threshold, SIZE_FORM + " or null"),
        Option("gpudask.rmm.log-directory", None,
               "Write one RMM allocation log per worker into this directory "
               "(rmm-<host>-worker-<n>.dev0.log); slows allocation.",
               parse_log_directory, "a directory path or null"),
        Option("gpudask.rmm.track-allocations", False,
               "Wrap the allocator in RMM's TrackingResourceAdaptor: distributed's rmm-used metric then "
               "shows live bytes.", parse_bool, "true or false"),
        Option("gpudask.rmm.libraries", ["cupy"],
               "Libraries whose GPU allocations go through RMM in workers (cupy, numba, torch).",
               parse_libraries, "a list among cupy, numba, torch (or [])"),
        Option("gpudask.rmm.scheduler-pool-size", None,
               "A pool in the scheduler, built by distributed-ucxx when the scheduler uses UCX "
               "(it then receives CUDA frames into device memory); null: none.",
               parse_optional_size, SIZE_FORM + " or null (none)"),
    ]


# --------------------------------------------------------------------------- settings
@dataclass
class _Settings:
    pool_size: Any
    maximum: Any
    allocator: str | None
    managed: bool
    threshold: Any
    log_directory: str | None
    track: bool
    libraries: list[str]
    scheduler_pool: Any


def _settings(ctx: Any) -> _Settings:
    s = ctx.settings
    return _Settings(
        s["gpudask.rmm.pool-size"], s["gpudask.rmm.maximum-pool-size"], s["gpudask.rmm.allocator"],
        s["gpudask.rmm.managed-memory"], s["gpudask.rmm.release-threshold"], s["gpudask.rmm.log-directory"],
        s["gpudask.rmm.track-allocations"], s["gpudask.rmm.libraries"], s["gpudask.rmm.scheduler-pool-size"])


def _shown(ctx: Any, key: str) -> str:
    """``key = <value as the user wrote it> (from <source>)`` for messages and reasons."""
    import dask.config

    setting = ctx.settings.get(key)
    where = key
    if setting.source.startswith("legacy key "):
        where = setting.source[len("legacy key "):]
    raw = setting.value
    if setting.explicit and ctx.user_config:
        raw = dask.config.get(where, default=setting.value, config=dict(ctx.user_config))
    return f"{key} = {raw!r} (from {setting.source})"


def _explicit(ctx: Any, key: str) -> bool:
    return ctx.settings.get(key).explicit


@hookimpl
def gpudask_validate(ctx):
    """Settings-only checks (no GPU needed): contradictions between the rmm options."""
    s = _settings(ctx)
    allocator = s.allocator
    if allocator == "default":
        for key, value in (("gpudask.rmm.pool-size", s.pool_size), ("gpudask.rmm.maximum-pool-size", s.maximum)):
            if value not in (None, False):
                raise ConfigError(f"{_shown(ctx, key)} asks for a pool, but gpudask.rmm.allocator = 'default' "
                                  f"has none; accepted: allocator pool/async/managed, or no {key}")
        if s.managed:
            raise ConfigError("gpudask.rmm.managed-memory = true contradicts gpudask.rmm.allocator = 'default'; "
                              "accepted: allocator managed (or pool with managed-memory)")
    if allocator in ("pool", "async") and s.pool_size is False:
        raise ConfigError(f"{_shown(ctx, 'gpudask.rmm.pool-size')} turns the pool off, but "
                          f"gpudask.rmm.allocator = {allocator!r} is a pool; accepted: a size, 'auto', "
                          f"or allocator 'default'/'managed' for no pool")
    if allocator == "async" and s.managed:
        raise ConfigError("gpudask.rmm.allocator = 'async' cannot use managed memory "
                          "(gpudask.rmm.managed-memory = true): cudaMallocAsync has no managed pool; "
                          "accepted: allocator pool with managed-memory, or async without it")
    if s.threshold is not None and allocator != "async":
        raise ConfigError(f"{_shown(ctx, 'gpudask.rmm.release-threshold')} applies to the async allocator only "
                          f"(gpudask.rmm.allocator = {allocator!r}); accepted: allocator 'async', or no threshold")
    if s.maximum is not None and s.pool_size is False:
        raise ConfigError(f"{_shown(ctx, 'gpudask.rmm.maximum-pool-size')} needs a pool, but "
                          f"{_shown(ctx, 'gpudask.rmm.pool-size')} turns it off")
    # both sizes of the same kind can be compared without a GPU
    if _same_kind(s.pool_size, s.maximum) and s.maximum < s.pool_size:
        raise ConfigError(f"{_shown(ctx, 'gpudask.rmm.maximum-pool-size')} is below "
                          f"{_shown(ctx, 'gpudask.rmm.pool-size')}; accepted: a maximum >= the initial size")


def _same_kind(a: Any, b: Any) -> bool:
    return (isinstance(a, float) and isinstance(b, float)) or (
        type(a) is int and type(b) is int)


# --------------------------------------------------------------------------- planning
@dataclass
class _Target:
    """The device memory one worker's pool lives in."""

    label: str  # "GPU 0 (NVIDIA H200, GPU-…, 140.4 GiB)" -- used in every message
    memory: int
    uuid: str | None
    index: int
    shared_by: int = 1


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _target(ctx: Any, plan: Any) -> _Target | None:
    gpus = ctx.gpus
    if not gpus:
        return None
    gpu = None
    if plan.gpu_index is not None:
        gpu = next((g for g in ctx.facts.gpus if g.index == plan.gpu_index), None)
    if gpu is None and plan.gpu:
        gpu = next((g for g in ctx.facts.gpus if g.uuid == plan.gpu or any(
            i.get("uuid") == plan.gpu for i in g.mig.get("instances", []))), None)
    position = None
    if gpu is None:
        position = (plan.index or 0) % len(gpus)
        gpu = gpus[position]
    elif gpu in gpus:
        position = gpus.index(gpu)
    instances = gpu.mig.get("instances", []) if gpu.mig.get("enabled") else []
    if instances:
        chosen = next((i for i in instances if plan.gpu and i.get("uuid") == plan.gpu), None)
        if chosen is None:  # CUDA shows a process one MIG instance: the first
            chosen = instances[0]
        memory = int(chosen.get("memory_total") or 0)
        label = (f"MIG instance {chosen.get('uuid')} of GPU {gpu.index} ({gpu.name}, {_gib(memory)})")
        return _Target(label, memory, chosen.get("uuid"), gpu.index)
    shared = 1
    if position is not None and ctx.nworkers > len(gpus):
        shared = sum(1 for i in range(ctx.nworkers) if i % len(gpus) == position)
    label = f"GPU {gpu.index} ({gpu.name}, {gpu.uuid}, {_gib(gpu.memory_total)})"
    return _Target(label, int(gpu.memory_total), gpu.uuid, gpu.index, shared)


def _resolve(value: float | int, target: _Target) -> int:
    raw = int(value * target.memory) if isinstance(value, float) else int(value)
    return raw // ALIGNMENT * ALIGNMENT


def _describe_size(value: float | int, nbytes: int) -> str:
    if isinstance(value, float):
        return f"{value:g} of the GPU = {nbytes} bytes ({_gib(nbytes)})"
    return f"{nbytes} bytes ({_gib(nbytes)})"


def _parse_tls(value: str) -> set[str]:
    """UCX transport names enabled by a UCX_TLS value (aliases expanded, ^ negation)."""
    aliases = {"cuda": {"cuda_ipc", "cuda_copy"}, "ib": {"rc"}, "rc_x": {"rc"}, "rc_v": {"rc"},
               "rc_verbs": {"rc"}, "rc_mlx5": {"rc"}, "dc": {"rc"}, "dc_x": {"rc"}, "dc_mlx5": {"rc"},
               "ud": set(), "all": {"cuda_ipc", "cuda_copy", "rc"}}
    text = value.strip()
    negate = text.startswith("^")
    names = {n.strip().lower() for n in text.lstrip("^").split(",") if n.strip()}
    expanded = set()
    for n in names:
        expanded |= aliases.get(n, {n})
    if negate:
        return {"cuda_ipc", "cuda_copy", "rc"} - expanded
    return expanded


def _fast_transports(ctx: Any, plan: Any) -> list[str]:
    """Which of NVLink (cuda_ipc) and InfiniBand (rc) UCX will use in this process."""
    if not ctx.uses_ucx:
        return []
    tls = plan.env.get("UCX_TLS") or ctx.user_env.get("UCX_TLS")
    enabled = _parse_tls(tls) if tls else {t if not t.startswith("rc") else "rc" for t in plan.ucx_transports}
    return [t for t in ("cuda_ipc", "rc") if t in enabled]


_TRANSPORT_NAMES = {"cuda_ipc": "NVLink (cuda_ipc)", "rc": "InfiniBand (rc)"}


def _reset_ucxx_keys(ctx: Any, plan: Any, keep: tuple[str, ...] = ()) -> None:
    """Unset distributed-ucxx's pool keys so ``init_once`` builds no pool in this process."""
    import dask.config

    user = {k: dask.config.get(k, default=None, config=dict(ctx.user_config)) for k in UCXX_POOL_KEYS}
    if not ctx.uses_ucx and all(v is None for v in user.values()):
        return
    why = {
        "nanny": "distributed-ucxx builds a pool from this key in every process that opens UCX: the nanny "
                 "would hold one of its own (1472 MiB measured on an H200); gpudask builds worker pools itself",
        "worker": "gpudask builds this worker's pool itself, once, before listen() (plugin rmm); "
                  "distributed-ucxx would build another at the first UCX connection",
        "scheduler": "no worker pool in the scheduler (gpudask.rmm.scheduler-pool-size asks for one)",
        "client": "no pool in the client: pools belong to workers",
    }[plan.role]
    honoured = [f"{k}={v!r}" for k, v in user.items() if v is not None]
    if honoured and plan.role == "worker":
        why += f"; your {', '.join(honoured)} is honoured as gpudask.rmm.pool-size"
    for key in UCXX_POOL_KEYS:
        if key not in keep:
            plan.set_config(key, None, why)


@hookimpl
def gpudask_plan_memory(ctx, plan):
    if plan.role == "worker":
        _reset_ucxx_keys(ctx, plan)
        _plan_worker(ctx, plan)
    elif plan.role == "scheduler":
        kept = _plan_scheduler(ctx, plan)
        _reset_ucxx_keys(ctx, plan, keep=kept)
    else:  # nanny host and client: never a pool
        _reset_ucxx_keys(ctx, plan)


def _plan_scheduler(ctx: Any, plan: Any) -> tuple[str, ...]:
    s = _settings(ctx)
    if s.scheduler_pool is None:
        return ()
    key = "gpudask.rmm.scheduler-pool-size"
    if not ctx.uses_ucx:
        plan.note("no scheduler pool", f"{_shown(ctx, key)} ignored: only a UCX scheduler receives CUDA frames "
                                       f"into device memory (protocol {ctx.protocol})")
        return ()
    gpus = ctx.gpus
    if not gpus:
        plan.note("skipped", f"no GPU visible: no scheduler pool ({_shown(ctx, key)})")
        return ()
    tls = plan.env.get("UCX_TLS") or ctx.user_env.get("UCX_TLS")
    if tls and "cuda_copy" not in _parse_tls(tls):
        why = (f"{_shown(ctx, key)} ignored: the scheduler's UCX_TLS={tls} has no cuda transport, so it receives "
               f"no CUDA frames into device memory")
        ctx.warn(why)
        plan.note("no scheduler pool", why)
        return ()
    target = _Target(f"GPU {gpus[0].index} ({gpus[0].name}, {gpus[0].uuid}, {_gib(gpus[0].memory_total)})",
                     int(gpus[0].memory_total), gpus[0].uuid, gpus[0].index)
    size = _resolve(s.scheduler_pool, target)
    _check_fits(ctx, key, size, target, "the scheduler")
    if not ctx.facts.packages.get("rmm"):
        raise ConfigError(f"{_shown(ctx, key)} asks for an RMM pool in the scheduler on {target.label}, "
                          f"but rmm is not installed (pip install rmm-cu12 or rmm-cu13)")
    why = (f"{_shown(ctx, key)} = {_describe_size(s.scheduler_pool, size)} on {target.label}: the UCX scheduler "
           f"receives CUDA frames sent through it into device memory; distributed-ucxx builds this pool "
           f"right after UCX starts (first listen), so the scheduler holds a CUDA context on this GPU")
    plan.set_config("distributed-ucxx.rmm.pool-size", size, why)
    plan.set_memory({"allocator": "pool", "initial_pool_size": size, "maximum_pool_size": None,
                     "built_by": "distributed-ucxx", "gpu": target.uuid}, why)
    return ("distributed-ucxx.rmm.pool-size",)


def _check_fits(ctx: Any, key: str, nbytes: int, target: _Target, who: str, shared: bool = True) -> None:
    """``nbytes`` (times the workers sharing the GPU, for initial pools) must fit the GPU."""
    if nbytes <= 0:
        raise ConfigError(f"{_shown(ctx, key)} rounds down to 0 bytes on {target.label} of {who}; "
                          f"accepted: at least {ALIGNMENT} bytes")
    k = target.shared_by if shared else 1
    total = nbytes * k
    if total > target.memory:
        sharing = f" x {k} workers sharing it = {total} bytes" if k > 1 else ""
        raise ConfigError(f"{_shown(ctx, key)} is {nbytes} bytes ({_gib(nbytes)}){sharing}, larger than "
                          f"{target.label} of {who} ({target.memory} bytes); accepted: at most "
                          f"{target.memory // k // ALIGNMENT * ALIGNMENT} bytes or a fraction <= {1 / k:g}")


def _plan_worker(ctx: Any, plan: Any) -> None:
    s = _settings(ctx)
    who = f"worker {plan.index}"
    target = _target(ctx, plan)
    if target is None:
        plan.note("skipped", "no GPU visible: no RMM pool")
        return
    if target.memory <= 0:
        plan.note("skipped", f"{target.label} reports no memory: no RMM pool")
        return
    fast = _fast_transports(ctx, plan)
    fast_text = " and ".join(_TRANSPORT_NAMES[t] for t in fast)
    managed = s.managed or s.allocator == "managed"

    # -- is there a pool, and who asked for it ------------------------------------------
    reasons: list[str] = []
    by_default = False
    if s.pool_size is False:
        want_pool = False
        reasons.append(f"no pool: {_shown(ctx, 'gpudask.rmm.pool-size')}")
    elif s.allocator == "default":
        want_pool = False
        reasons.append(f"no pool: {_shown(ctx, 'gpudask.rmm.allocator')}")
    elif s.pool_size is not None:
        want_pool = True
    elif s.allocator in ("pool", "async"):
        want_pool = True
        reasons.append(f"{_shown(ctx, 'gpudask.rmm.allocator')} asks for a pool")
    elif s.maximum is not None:
        want_pool = True
        reasons.append(f"{_shown(ctx, 'gpudask.rmm.maximum-pool-size')} asks for a pool")
    elif fast:
        want_pool = by_default = True
        reasons.append(f"UCX uses {fast_text}: each buffer sent that way needs a mapping between every pair of "
                       f"processes (up to hundreds of ms each); with a pool it is one mapping, made once")
    else:
        want_pool = False
        what = "UCX without NVLink or InfiniBand" if ctx.uses_ucx else f"protocol {ctx.protocol}"
        reasons.append(f"no pool: {what}, and no gpudask.rmm.pool-size set")

    if s.allocator == "async":
        kind = "async"
    elif want_pool:
        kind = "pool"
    elif managed:
        kind = "managed"
    elif s.allocator == "default":
        kind = "default"
    else:
        plan.note("memory: none", "; ".join(reasons))
        return

    # -- sizes -------------------------------------------------------------------------
    initial = maximum = threshold = None
    if want_pool:
        if s.pool_size is not None and s.pool_size is not False:
            initial = _resolve(s.pool_size, target)
            _check_fits(ctx, "gpudask.rmm.pool-size", initial, target, who)
            reasons.append(f"{_shown(ctx, 'gpudask.rmm.pool-size')} = {_describe_size(s.pool_size, initial)} "
                           f"on {target.label}")
        elif kind == "pool" or by_default:
            fraction = DEFAULT_FRACTION / target.shared_by
            initial = _resolve(fraction, target)
            share = (f", split between the {target.shared_by} workers sharing it" if target.shared_by > 1 else "")
            reasons.append(f"default size {DEFAULT_FRACTION:g} of {target.label}{share} = {initial} bytes "
                           f"({_gib(initial)}): RMM's long-standing default, leaving the rest to CUDA contexts, "
                           f"UCX and allocators outside RMM (PyTorch's)")
    if s.maximum is not None:
        maximum = _resolve(s.maximum, target)
        _check_fits(ctx, "gpudask.rmm.maximum-pool-size", maximum, target, who, shared=False)
        if initial is not None and maximum < initial:
            if _explicit(ctx, "gpudask.rmm.pool-size"):
                raise ConfigError(
                    f"{_shown(ctx, 'gpudask.rmm.maximum-pool-size')} = {maximum} bytes is below "
                    f"{_shown(ctx, 'gpudask.rmm.pool-size')} = {initial} bytes on {target.label} of {who}; "
                    f"accepted: a maximum >= the initial size")
            initial = maximum
            reasons.append(f"initial size lowered to the maximum {maximum} bytes")
        reasons.append(f"{_shown(ctx, 'gpudask.rmm.maximum-pool-size')} = {_describe_size(s.maximum, maximum)}")
    elif kind == "pool":
        torch = ctx.facts.packages.get("torch")
        if torch and by_default and not _torch_through_rmm(ctx, s):
            maximum = initial
            reasons.append(f"maximum = initial size: PyTorch {torch} is installed and does not allocate through RMM "
                           f"(gpudask.rmm.libraries, the torch-rmm plugin), so a growing pool could starve it; set "
                           f"gpudask.rmm.maximum-pool-size, or add torch to gpudask.rmm.libraries")
        else:
            reasons.append("no maximum: the pool grows on demand and never shrinks "
                           "(gpudask.rmm.maximum-pool-size caps it)")
    if s.threshold is not None:
        threshold = _resolve(s.threshold, target) if s.threshold else 0
        if threshold > target.memory:
            _check_fits(ctx, "gpudask.rmm.release-threshold", threshold, target, who, shared=False)
        reasons.append(f"{_shown(ctx, 'gpudask.rmm.release-threshold')} = {threshold} bytes")

    # -- combinations that fail at run time ----------------------------------------------
    if managed and "cuda_ipc" in fast:
        key = "gpudask.rmm.allocator" if s.allocator == "managed" else "gpudask.rmm.managed-memory"
        raise ConfigError(f"{_shown(ctx, key)}: CUDA managed memory cannot be sent over NVLink (UCX cuda_ipc) "
                          f"on {target.label} of {who}; accepted: allocator pool/async without managed memory, "
                          f"or UCX without cuda_ipc")
    if not ctx.facts.packages.get("rmm"):
        what = f"an RMM {kind} allocator on {target.label} of {who}"
        if by_default:
            ctx.warn(f"UCX uses {fast_text} but rmm is not installed: no RMM pool in workers "
                     f"(pip install rmm-cu12 or rmm-cu13)")
            plan.note("memory: none", f"rmm is not installed; wanted {what}")
            return
        key = next((k for k in ("gpudask.rmm.pool-size", "gpudask.rmm.allocator", "gpudask.rmm.maximum-pool-size",
                                "gpudask.rmm.managed-memory") if _explicit(ctx, k)), "gpudask.rmm.allocator")
        raise ConfigError(f"{_shown(ctx, key)} asks for {what}, but rmm is not installed "
                          f"(pip install rmm-cu12 or rmm-cu13)")

    log_file = None
    if s.log_directory:
        host = str(ctx.facts.hostname).replace(os.sep, "_") or "host"
        log_file = os.path.join(s.log_directory, f"rmm-{host}-worker-{plan.index}.log")
        reasons.append(f"RMM log {log_file} (rmm adds .dev0 before the extension)")
    if s.track:
        reasons.append("allocations tracked (distributed's rmm-used metric shows live bytes)")
    if s.libraries:
        reasons.append(f"{', '.join(s.libraries)} allocate through RMM")
    memory = {
        "allocator": kind,
        "initial_pool_size": initial,
        "maximum_pool_size": maximum,
        "managed_memory": managed and kind in ("pool", "managed"),
        "release_threshold": threshold,
        "log_file": log_file,
        "track_allocations": s.track,
        "libraries": list(s.libraries),
        "gpu": target.uuid,
        "gpu_memory": target.memory,
    }
    plan.set_memory(memory, "; ".join(reasons))


# A plugin that points PyTorch at RMM may declare this setting (contrib/gpudask-torch-rmm does).
TORCH_RMM_SETTING = "gpudask.torch-rmm.enabled"


def _torch_through_rmm(ctx: Any, s: _Settings) -> bool:
    """Will PyTorch allocate from the pool: listed in gpudask.rmm.libraries, or a loaded
    torch-rmm plugin says it points PyTorch at RMM?"""
    if "torch" in s.libraries:
        return True
    if TORCH_RMM_SETTING in ctx.settings.options:
        return bool(ctx.settings[TORCH_RMM_SETTING])
    return False


# --------------------------------------------------------------------------- applying
_STATE: dict[str, Any] | None = None  # what this process set up on a real GPU (JSON-compatible)
_MR: Any = None  # the memory resource in use (for the metric)
_REPORT: dict[str, Any] | None = None  # the last report, whatever happened (for the metric)


@hookimpl
def gpudask_setup_memory(ctx, plan):
    """Build the planned memory resource in this worker process (or report why not)."""
    global _REPORT
    _REPORT = _setup(ctx, plan)
    return _REPORT


def _setup(ctx: Any, plan: Any) -> dict[str, Any]:
    global _STATE, _MR
    memory = plan.memory
    if _STATE is not None:
        # a second call (WorkerPlugin registered on a running worker): report, never rebuild
        return {**_STATE, "already_set_up": True}
    if memory is None or memory.get("allocator") is None:  # other plugins (spill) add keys of their own
        return {"allocator": None, "applied": False, "why": "no memory setup planned (see gpudask info)"}
    report: dict[str, Any] = dict(memory)
    if ctx.facts.described:
        report.update(applied=False, skipped=f"host described by {ctx.facts.origin}: no real GPU here, "
                                             f"RMM not initialised, no pool allocated")
        return report
    try:
        import rmm
    except ImportError as e:
        raise GpudaskError(f"gpudask.rmm: an RMM {memory['allocator']} allocator is planned for GPU "
                           f"{memory.get('gpu')} but rmm cannot be imported: {e}") from None
    existing = rmm.mr.get_current_device_resource()
    if not _is_default_resource(rmm, existing):
        # someone (a user, another plugin, a previous preload) set a resource: leave it
        report.update(applied=False, existing=_chain(existing), pool_size=_pool_size(rmm, existing),
                      why="a memory resource was already set in this process; gpudask does not replace it "
                          "(restart the worker to change it)")
        _STATE, _MR = report, existing
        return report
    mr = _build(rmm, memory)
    rmm.mr.set_current_device_resource(mr)
    report.update(applied=True, resource=_chain(mr), pool_size=_pool_size(rmm, mr))
    if memory.get("log_file"):
        report["log_file"] = _log_file(rmm, mr) or memory["log_file"]
    report["libraries"] = {lib: _point_library(lib) for lib in memory.get("libraries") or []}
    _STATE, _MR = report, mr
    return report


def _is_default_resource(rmm: Any, mr: Any) -> bool:
    return type(mr) is rmm.mr.CudaMemoryResource


def _build(rmm: Any, memory: dict[str, Any]) -> Any:
    kind = memory["allocator"]
    initial, maximum = memory.get("initial_pool_size"), memory.get("maximum_pool_size")
    what = f"RMM {kind} allocator" + (f" with a pool of {initial} bytes" if initial else "")
    if memory.get("log_file"):
        os.makedirs(os.path.dirname(memory["log_file"]) or ".", exist_ok=True)
    try:
        if kind == "async":
            mr = rmm.mr.CudaAsyncMemoryResource(initial_pool_size=initial,
                                                release_threshold=memory.get("release_threshold"))
            if maximum is not None:
                mr = rmm.mr.LimitingResourceAdaptor(mr, allocation_limit=maximum)
        elif kind == "pool":
            upstream = rmm.mr.ManagedMemoryResource() if memory.get("managed_memory") else rmm.mr.CudaMemoryResource()
            mr = rmm.mr.PoolMemoryResource(upstream, initial_pool_size=initial, maximum_pool_size=maximum)
        elif kind == "managed":
            mr = rmm.mr.ManagedMemoryResource()
        else:
            mr = rmm.mr.CudaMemoryResource()
        if memory.get("log_file"):
            mr = rmm.mr.LoggingResourceAdaptor(mr, log_file_name=memory["log_file"])
        if memory.get("track_allocations"):
            mr = rmm.mr.TrackingResourceAdaptor(mr)
    except (MemoryError, RuntimeError, OSError, ValueError) as e:
        raise GpudaskError(f"gpudask.rmm: could not build the {what} on GPU {memory.get('gpu')}: "
                           f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return mr


def _upstreams(mr: Any):
    seen = 0
    while mr is not None and seen < 16:
        yield mr
        mr = getattr(mr, "upstream_mr", None)
        seen += 1


def _chain(mr: Any) -> str:
    return " -> ".join(type(m).__name__ for m in _upstreams(mr))


def _pool_size(rmm: Any, mr: Any) -> int | None:
    for m in _upstreams(mr):
        if isinstance(m, rmm.mr.PoolMemoryResource):
            return int(m.pool_size())
    return None


def _allocated(mr: Any) -> int | None:
    for m in _upstreams(mr):
        if hasattr(m, "get_allocated_bytes"):
            return int(m.get_allocated_bytes())
    return None


def _log_file(rmm: Any, mr: Any) -> str | None:
    for m in _upstreams(mr):
        if isinstance(m, rmm.mr.LoggingResourceAdaptor):
            return m.get_file_name()
    return None


def _point_library(lib: str) -> str:
    """Make ``lib`` allocate through RMM; a short status for the report (never raises)."""
    try:
        if lib == "cupy":
            import cupy
            from rmm.allocators.cupy import rmm_cupy_allocator

            cupy.cuda.set_allocator(rmm_cupy_allocator)
        elif lib == "numba":
            from numba import cuda
            from rmm.allocators.numba import RMMNumbaManager

            cuda.set_memory_manager(RMMNumbaManager)
        elif lib == "torch":
            import torch
            from rmm.allocators.torch import rmm_torch_allocator

            if rmm_torch_allocator is None:
                return "not pointed: torch sees no CUDA device"
            torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
        return "rmm"
    except ImportError:
        return "not installed"
    except Exception as e:  # noqa: BLE001 - e.g. torch's allocator already initialised
        return f"not pointed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


@hookimpl
def gpudask_preload(ctx, plan, server):
    """Add a ``gpudask-rmm`` worker metric: allocator, initial and current pool size."""
    metrics = getattr(server, "metrics", None)
    if plan.role != "worker" or not isinstance(metrics, dict) or type(server).__name__ == "Nanny":
        return
    metrics.setdefault("gpudask-rmm", _metric)


def _metric(worker: Any = None) -> dict[str, Any] | None:
    if _REPORT is None:
        return None
    out = {k: _REPORT.get(k) for k in ("allocator", "initial_pool_size", "maximum_pool_size", "applied")}
    if _MR is not None:
        import rmm

        out["pool_size"] = _pool_size(rmm, _MR)
        out["used"] = _allocated(_MR)
    return out

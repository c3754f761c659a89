"""RMM pools in worker processes: planned (pure, any process) from the ``gpudask.rmm.*`` settings,
the worker's GPU and UCX's transports; built by :mod:`.setup` in the worker before ``listen()``.

Nothing here imports rmm, cupy, numba or torch at module level: the plan runs in the
``dask worker`` CLI and in ``gpudask info`` too.  docs/memory.md is the user-facing description."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import (ConfigError, Finding, hookimpl, parse_bytes, process_gpu, tls_enables,
                               workers_sharing_gpu)

# hooks of this plugin defined beside what they call (pluggy reads this module's names)
from .options import (ALIGNMENT, DEFAULT_FRACTION, SHARED_MAXIMUM_FRACTION, UCXX_POOL_KEYS, RmmSettings,
                      allocator_kind, gib, gpudask_config_options, parse_pool_size, read_settings, share_maximum,
                      share_of, shown)  # noqa: F401
from .setup import gpudask_applied_state, gpudask_server_setup, gpudask_setup_memory, reserve  # noqa: F401
from .shares import gpudask_facts_sections, holders_text, of_gpu  # noqa: F401

if TYPE_CHECKING:
    from gpudask.pluginapi import GPU, Facts, PlanContext, ProcessPlan, ProcessSide


name = "rmm"
# distributed-ucxx reads its rmm keys, and their legacy distributed.rmm.* names, once: when
# UCX initialises at the first listen/connect (set late in a running process, they need a new one)
config_read_at_start = ("distributed-ucxx.rmm.", "distributed.rmm.")
priority = 100

__all__ = ["name", "priority", "parse_pool_size", "SECTION_KEYS"]

# This plugin's section of a process plan (``plan.sections["rmm"]``), read by other plugins
# through ``plan.section("rmm")`` from gpudask_plan_finish on (the spill plugin reads
# maximum_pool_size, torch-rmm reads libraries): allocator (pool, async, managed, default),
# initial_pool_size and maximum_pool_size (bytes or None), then the details (managed_memory,
# release_threshold, log_file, track_allocations, libraries, gpu_memory; built_by for a
# scheduler pool distributed-ucxx builds) and gpu (the UUID the pool lives on).
SECTION_KEYS = ("allocator", "initial_pool_size", "maximum_pool_size", "gpu")

# The requests this plugin reads (``plan.request("rmm", {...}, why)``, made in
# gpudask_plan_process or gpudask_select_transport): ``allocates_through`` -- a list of
# libraries another plugin points at RMM's current resource (torch-rmm: ["torch"]), so a
# default pool need not be capped for them.
REQUEST_ALLOCATES_THROUGH = "allocates_through"


@hookimpl
def gpudask_facts_packages() -> dict[str, list[str]]:
    # pools only where rmm is installed; torch's allocator is pointed at RMM when asked
    return {"rmm": ["rmm", "rmm-cu12", "rmm-cu13"], "torch": ["torch"]}


@hookimpl
def gpudask_preimport(facts: Facts, role: str, protocol: str | None) -> list[str] | None:
    """A GPU worker's pool imports (about 0.9 s on an H200 host), made once by the fork server."""
    if role != "worker" or not facts.visible_gpus() or facts.packages.get("rmm") is None:
        return None
    return ["rmm", "rmm.allocators.cupy"]


@hookimpl
def gpudask_validate(ctx: PlanContext) -> None:
    """Settings-only checks (no GPU needed): contradictions between the rmm options."""
    s = read_settings(ctx)
    allocator = s.allocator
    if allocator == "default":
        for key, value in (("gpudask.rmm.pool-size", s.pool_size), ("gpudask.rmm.maximum-pool-size", s.maximum)):
            if value not in (None, False):
                raise ConfigError(f"{shown(ctx, key)} asks for a pool, but gpudask.rmm.allocator = 'default' "
                                  f"has none; accepted: allocator pool/async/managed, or no {key}")
        if s.managed:
            raise ConfigError("gpudask.rmm.managed-memory = true contradicts gpudask.rmm.allocator = 'default'; "
                              "accepted: allocator managed (or pool with managed-memory)")
    if allocator in ("pool", "async") and s.pool_size is False:
        raise ConfigError(f"{shown(ctx, 'gpudask.rmm.pool-size')} turns the pool off, but "
                          f"gpudask.rmm.allocator = {allocator!r} is a pool; accepted: a size, 'auto', "
                          f"or allocator 'default'/'managed' for no pool")
    if allocator == "async" and s.managed:
        raise ConfigError("gpudask.rmm.allocator = 'async' cannot use managed memory "
                          "(gpudask.rmm.managed-memory = true): cudaMallocAsync has no managed pool; "
                          "accepted: allocator pool with managed-memory, or async without it")
    if s.threshold is not None and allocator != "async":
        raise ConfigError(f"{shown(ctx, 'gpudask.rmm.release-threshold')} applies to the async allocator only "
                          f"(gpudask.rmm.allocator = {allocator!r}); accepted: allocator 'async', or no threshold")
    if s.maximum is not None and s.pool_size is False:
        raise ConfigError(f"{shown(ctx, 'gpudask.rmm.maximum-pool-size')} needs a pool, but "
                          f"{shown(ctx, 'gpudask.rmm.pool-size')} turns it off")
    # two fractions, or two byte counts, compare without a GPU
    if type(s.pool_size) is type(s.maximum) and type(s.maximum) in (int, float) and s.maximum < s.pool_size:
        raise ConfigError(f"{shown(ctx, 'gpudask.rmm.maximum-pool-size')} is below "
                          f"{shown(ctx, 'gpudask.rmm.pool-size')}; accepted: a maximum >= the initial size")


@hookimpl
def gpudask_plan_memory(ctx: PlanContext, plan: ProcessPlan) -> None:
    if plan.role == "scheduler":
        reset_ucxx_keys(ctx, plan, keep=_plan_scheduler(ctx, plan) or _scheduler_ucxx_pool(ctx, plan))
        return
    reset_ucxx_keys(ctx, plan)  # a nanny host or a client never has a pool
    if plan.role == "worker":
        _plan_worker(ctx, plan)


def _plan_scheduler(ctx: PlanContext, plan: ProcessPlan) -> tuple[str, ...]:
    s = read_settings(ctx)
    if s.scheduler_pool is None:
        return ()
    key = "gpudask.rmm.scheduler-pool-size"
    if not ctx.uses_ucx:
        plan.note("no scheduler pool", f"{shown(ctx, key)} ignored: only a UCX scheduler receives CUDA frames "
                                       f"into device memory (protocol {ctx.protocol})")
        return ()
    gpus = ctx.gpus
    if not gpus:
        plan.note("skipped", f"no GPU visible: no scheduler pool ({shown(ctx, key)})")
        return ()
    tls = plan.env.get("UCX_TLS") or ctx.user_env.get("UCX_TLS")
    if tls and not tls_enables(tls, "cuda_copy"):
        why = (f"{shown(ctx, key)} ignored: the scheduler's UCX_TLS={tls} has no cuda transport, so it receives "
               f"no CUDA frames into device memory")
        ctx.warn(why)
        plan.note("no scheduler pool", why)
        return ()
    target = Target(_label(gpus[0]), int(gpus[0].memory_total), gpus[0].uuid, gpus[0].index)
    size = resolve(s.scheduler_pool, target)
    check_fits(ctx, key, size, target, "the scheduler")
    if not ctx.facts.packages.get("rmm"):
        raise ConfigError(f"{shown(ctx, key)} asks for an RMM pool in the scheduler on {target.label}, "
                          f"but rmm is not installed (pip install rmm-cu12 or rmm-cu13)")
    why = (f"{shown(ctx, key)} = {describe_size(s.scheduler_pool, size)} on {target.label}: the UCX scheduler "
           f"receives CUDA frames sent through it into device memory; distributed-ucxx builds this pool "
           f"right after UCX starts (first listen), so the scheduler holds a CUDA context on this GPU")
    plan.set_config("distributed-ucxx.rmm.pool-size", size, why)
    _set_memory(plan, "pool", size, None, target.uuid, {"built_by": "distributed-ucxx"}, why)
    return ("distributed-ucxx.rmm.pool-size",)


def _scheduler_ucxx_pool(ctx: PlanContext, plan: ProcessPlan) -> tuple[str, ...]:
    """distributed-ucxx's own pool keys given to the scheduler: honoured where distributed-ucxx can
    build the pool, else refused in one line -- never dropped in silence."""
    user = _user_ucxx_keys(ctx)
    if not user:
        return ()
    given = ", ".join(f"{k}={v!r}" for k, v in user.items())
    problem = None
    if not ctx.uses_ucx:
        problem = f"only distributed-ucxx builds this pool, and protocol {ctx.protocol} does not start UCX"
    elif not ctx.gpus:
        problem = "the scheduler sees no GPU, so distributed-ucxx could not build it"
    elif not ctx.facts.packages.get("rmm"):
        problem = "rmm is not installed on the scheduler (distributed-ucxx would only warn)"
    size = None
    if problem is None:
        try:
            size = int(parse_bytes(next(iter(user.values()))))
        except (ValueError, TypeError, KeyError):
            problem = f"{next(iter(user.values()))!r} is not a size distributed-ucxx reads (e.g. '1GB' or bytes)"
    if problem is not None:
        why = (f"{given} given to the scheduler is refused: {problem}; accepted: a UCX scheduler with a GPU and rmm "
               "(or gpudask.rmm.scheduler-pool-size)")
        ctx.warn(why)
        for key in user:
            plan.set_config(key, None, why)
        return tuple(user)
    gpu = ctx.gpus[0]
    why = (f"{given} set by you: explicit settings win; distributed-ucxx builds this RMM pool of {size} bytes "
           f"({gib(int(size or 0))}) on the scheduler's GPU {gpu.index} when UCX starts (init_once, first listen), "
           "for the GPU frames the scheduler relays")
    for key, value in user.items():
        plan.set_config(key, value, why)
    _set_memory(plan, "pool", size, None, gpu.uuid, {"built_by": "distributed-ucxx"}, why)
    return UCXX_POOL_KEYS  # distributed-ucxx reads the other key first, then falls back to the one given


def _plan_worker(ctx: PlanContext, plan: ProcessPlan) -> None:
    s = read_settings(ctx)
    who = f"worker {plan.index}"
    target = target_of(ctx, plan)
    if target is None:
        plan.note("skipped", "no GPU visible: no RMM pool")
        return
    if target.memory <= 0:
        plan.note("skipped", f"{target.label} reports no memory: no RMM pool")
        return
    fast = fast_transports(ctx, plan)
    managed = s.managed or s.allocator == "managed"
    want_pool, by_default, reasons = _want_pool(ctx, s, fast)
    kind = allocator_kind(s, want_pool, managed)
    asked = [k for k in ("gpudask.rmm.track-allocations", "gpudask.rmm.log-directory", "gpudask.rmm.libraries")
             if ctx.require(k).explicit]
    if kind is None and asked:
        # dask-cuda honours these without a pool too: RMM's default resource, with them
        kind = "default"
        reasons.append(f"no pool, but {', '.join(shown(ctx, k) for k in asked)} asked for: RMM's default resource "
                       "(cudaMalloc) with them, as dask-cuda does without a pool")
    if kind is None:
        plan.note("memory: none", "; ".join(reasons))
        return
    initial, maximum, threshold, share = _sizes(ctx, plan, s, target, who, kind, want_pool, by_default, reasons)
    if managed and "cuda_ipc" in fast:  # refused here, not when the first transfer fails
        key = "gpudask.rmm.allocator" if s.allocator == "managed" else "gpudask.rmm.managed-memory"
        raise ConfigError(f"{shown(ctx, key)}: CUDA managed memory cannot be sent over NVLink (UCX cuda_ipc) "
                          f"on {target.label} of {who}; accepted: allocator pool/async without managed memory, "
                          f"or UCX without cuda_ipc")
    if not ctx.facts.packages.get("rmm"):
        what = f"an RMM {kind} allocator on {target.label} of {who}"
        if not by_default:
            key = next((k for k in ("gpudask.rmm.pool-size", "gpudask.rmm.allocator", "gpudask.rmm.maximum-pool-size",
                                    "gpudask.rmm.managed-memory") if ctx.require(k).explicit), "gpudask.rmm.allocator")
            raise ConfigError(f"{shown(ctx, key)} asks for {what}, but rmm is not installed "
                              f"(pip install rmm-cu12 or rmm-cu13)")
        ctx.warn(f"UCX uses {_fast_text(fast)} but rmm is not installed: no RMM pool in workers "
                 f"(pip install rmm-cu12 or rmm-cu13)")
        plan.note("memory: none", f"rmm is not installed; wanted {what}")
        return

    log_file = None
    if s.log_directory:
        host = str(ctx.facts.hostname).replace(os.sep, "_") or "host"
        log_file = os.path.join(s.log_directory, f"rmm-{host}-worker-{plan.index}.log")
        reasons.append(f"RMM log {log_file} (rmm adds .dev0 before the extension)")
    if s.track:
        reasons.append("allocations tracked (distributed's rmm-used metric shows live bytes)")
    if s.libraries:
        reasons.append(f"{', '.join(s.libraries)} allocate through RMM")
    details = {"managed_memory": managed and kind in ("pool", "managed"), "release_threshold": threshold,
               "log_file": log_file, "track_allocations": s.track, "libraries": list(s.libraries),
               "gpu_memory": target.memory,
               # a default initial size shrinks to fit what is free when the worker starts (setup.fit);
               # a size the user set is refused in one line if it does not fit
               "fit_to_free": initial is not None and s.pool_size is None,
               # a default pool's share of the GPU, counted again when the worker starts (setup.py):
               # a gpudask command started after this one adds its workers to the count
               "share": share, "release_wait": s.release_wait}
    _set_memory(plan, kind, initial, maximum, target.uuid, details, "; ".join(reasons))


def _set_memory(plan: ProcessPlan, kind: str, initial: int | None, maximum: int | None, gpu: str | None,
                details: dict[str, Any], why: str) -> None:
    plan.set_section({"allocator": kind, "initial_pool_size": initial, "maximum_pool_size": maximum, **details,
                      "gpu": gpu}, why, decision=f"memory: allocator={kind}, initial_pool_size={initial}, "
                                                 f"maximum_pool_size={maximum}")


def _fast_text(fast: list[str]) -> str:
    return " and ".join(TRANSPORT_NAMES[t] for t in fast)


def _want_pool(ctx: PlanContext, s: RmmSettings, fast: list[str]) -> tuple[bool, bool, list[str]]:
    """(a pool?, only because UCX uses NVLink/InfiniBand?, the reasons so far)."""
    if s.pool_size is False:
        return False, False, [f"no pool: {shown(ctx, 'gpudask.rmm.pool-size')}"]
    if s.allocator == "default":
        return False, False, [f"no pool: {shown(ctx, 'gpudask.rmm.allocator')}"]
    if s.pool_size is not None:
        return True, False, []
    if s.allocator in ("pool", "async"):
        return True, False, [f"{shown(ctx, 'gpudask.rmm.allocator')} asks for a pool"]
    if s.maximum is not None:
        return True, False, [f"{shown(ctx, 'gpudask.rmm.maximum-pool-size')} asks for a pool"]
    if fast:
        return True, True, [f"UCX uses {_fast_text(fast)}: a pool is one mapping per pair of processes, made once, "
                            f"not one per buffer"]
    what = "UCX without NVLink or InfiniBand" if ctx.uses_ucx else f"protocol {ctx.protocol}"
    return False, False, [f"no pool: {what}, and no gpudask.rmm.pool-size set"]


def _sizes(ctx: PlanContext, plan: ProcessPlan, s: RmmSettings, target: Target, who: str, kind: str, want_pool: bool, by_default: bool,
           reasons: list[str]) -> tuple[int | None, int | None, int | None, dict[str, Any] | None]:
    """(initial, maximum, release threshold) bytes, and a default pool's share record; adds the reasons."""
    initial = maximum = threshold = None
    shared = 0  # workers a default pool is planned for (0: not a default pool)
    if want_pool:
        if s.pool_size is not None and s.pool_size is not False:
            initial = resolve(s.pool_size, target)
            check_fits(ctx, "gpudask.rmm.pool-size", initial, target, who)
            reasons.append(f"{shown(ctx, 'gpudask.rmm.pool-size')} = {describe_size(s.pool_size, initial)} "
                           f"on {target.label}")
        elif kind == "pool" or by_default:
            initial, shared = default_initial(ctx, plan, target, reasons, s.workers_per_gpu)
    if s.maximum is not None:
        maximum = resolve(s.maximum, target)
        check_fits(ctx, "gpudask.rmm.maximum-pool-size", maximum, target, who, shared=False)
        if initial is not None and maximum < initial:
            if ctx.require("gpudask.rmm.pool-size").explicit:
                raise ConfigError(
                    f"{shown(ctx, 'gpudask.rmm.maximum-pool-size')} = {maximum} bytes is below "
                    f"{shown(ctx, 'gpudask.rmm.pool-size')} = {initial} bytes on {target.label} of {who}; "
                    f"accepted: a maximum >= the initial size")
            initial = maximum
            reasons.append(f"initial size lowered to the maximum {maximum} bytes")
        reasons.append(f"{shown(ctx, 'gpudask.rmm.maximum-pool-size')} = {describe_size(s.maximum, maximum)}")
    elif kind == "pool":
        torch = ctx.facts.packages.get("torch")
        if torch and by_default and not _torch_through_rmm(s, plan):
            maximum = initial
            reasons.append(f"maximum = initial size: PyTorch {torch} is installed and does not allocate through RMM "
                           f"(gpudask.rmm.libraries, the torch-rmm plugin), so a growing pool could starve it; set "
                           f"gpudask.rmm.maximum-pool-size, or add torch to gpudask.rmm.libraries")
        elif shared > 1 and initial is not None:
            maximum = max(initial, share_maximum(target.memory, shared) or 0)
            reasons.append(f"maximum {maximum} bytes ({gib(maximum)}): {SHARED_MAXIMUM_FRACTION:g} of the GPU split "
                           f"between its {shared} workers -- a task that runs this pool out of memory gets a "
                           "MemoryError, not its neighbours' planned memory (gpudask.rmm.maximum-pool-size sets it)")
        else:
            reasons.append("no maximum: the pool grows on demand and never shrinks "
                           "(gpudask.rmm.maximum-pool-size caps it)")
    if s.threshold is not None:
        threshold = resolve(s.threshold, target) if s.threshold else 0
        if threshold > target.memory:
            check_fits(ctx, "gpudask.rmm.release-threshold", threshold, target, who, shared=False)
        reasons.append(f"{shown(ctx, 'gpudask.rmm.release-threshold')} = {threshold} bytes")
    share = share_record(target, shared, s.workers_per_gpu, s.maximum is not None, initial, maximum)
    return initial, maximum, threshold, share


def _torch_through_rmm(s: RmmSettings, plan: ProcessPlan) -> bool:
    """Will PyTorch allocate from the pool (gpudask.rmm.libraries, or another plugin's ``allocates_through``)?"""
    return "torch" in s.libraries or any("torch" in (asked.get(REQUEST_ALLOCATES_THROUGH) or ())
                                         for asked in plan.requests_for(name).values())


@dataclass
class Target:
    """The device memory one worker's pool lives in."""

    label: str  # "GPU 0 (NVIDIA H200, GPU-…, 140.4 GiB)" -- used in every message
    memory: int
    uuid: str | None
    index: int
    shared_by: int = 1  # this command's workers on it
    free: int | None = None  # free when the facts were read (None: unknown, a MIG instance)
    others: dict[int, int] | None = None  # pid of another gpudask command -> its workers on this GPU
    processes: list[tuple[int, int | None]] | None = None  # (pid, bytes) on it when the facts were read

    @property
    def host_workers(self) -> int:
        return self.shared_by + sum((self.others or {}).values())


def target_of(ctx: PlanContext, plan: ProcessPlan) -> Target | None:
    if not ctx.gpus:
        return None
    gpu = None
    if plan.gpu_index is not None:
        gpu = next((g for g in ctx.facts.gpus if g.index == plan.gpu_index), None)
    if gpu is None and plan.gpu:
        gpu = next((g for g in ctx.facts.gpus if g.uuid == plan.gpu or any(
            i.get("uuid") == plan.gpu for i in g.mig.get("instances", []))), None)
    if gpu is None:
        gpu, _ = process_gpu(ctx, plan)  # no GPU of its own: CUDA device 0
        if gpu is None:
            return None
    instances = gpu.mig.get("instances", []) if gpu.mig.get("enabled") else []
    if instances:
        # not named by the plan: CUDA shows a process one MIG instance, the first
        chosen = next((i for i in instances if plan.gpu and i.get("uuid") == plan.gpu), instances[0])
        memory = int(chosen.get("memory_total") or 0)
        label = (f"MIG instance {chosen.get('uuid')} of GPU {gpu.index} ({gpu.name}, {gib(memory)})")
        return Target(label, memory, chosen.get("uuid"), gpu.index)
    shared = max(1, len(workers_sharing_gpu(ctx, plan)))
    return Target(_label(gpu), int(gpu.memory_total), gpu.uuid, gpu.index, shared, *of_gpu(ctx.facts, gpu.index))


def _label(gpu: GPU) -> str:
    return f"GPU {gpu.index} ({gpu.name}, {gpu.uuid}, {gib(gpu.memory_total)})"


def resolve(value: float | int, target: Target) -> int:
    raw = int(value * target.memory) if isinstance(value, float) else int(value)
    return raw // ALIGNMENT * ALIGNMENT


def describe_size(value: float | int, nbytes: int) -> str:
    if isinstance(value, float):
        return f"{value:g} of the GPU = {nbytes} bytes ({gib(nbytes)})"
    return f"{nbytes} bytes ({gib(nbytes)})"


def fast_transports(ctx: PlanContext, plan: ProcessPlan) -> list[str]:
    """Which of NVLink (cuda_ipc) and InfiniBand (rc) UCX will use in this process."""
    if not ctx.uses_ucx:
        return []
    tls = plan.env.get("UCX_TLS") or ctx.user_env.get("UCX_TLS")
    if tls:  # the same reading of UCX_TLS as the transport plugins'
        return [t for t in ("cuda_ipc", "rc") if tls_enables(tls, t)]
    enabled = {"rc" if t.startswith("rc") else t for t in plan.ucx_transports}
    return [t for t in ("cuda_ipc", "rc") if t in enabled]


TRANSPORT_NAMES = {"cuda_ipc": "NVLink (cuda_ipc)", "rc": "InfiniBand (rc)"}


def _user_ucxx_keys(ctx: PlanContext) -> dict[str, Any]:
    """distributed-ucxx's pool keys the user set (their values)."""
    return {k: v for k in UCXX_POOL_KEYS if (v := ctx.user_dask_config(k)) is not None}


def reset_ucxx_keys(ctx: PlanContext, plan: ProcessPlan, keep: tuple[str, ...] = ()) -> None:
    """Unset distributed-ucxx's pool keys so ``init_once`` builds no pool in this process."""
    user = _user_ucxx_keys(ctx)
    if not ctx.uses_ucx and not user:
        return
    why = {
        "nanny": "distributed-ucxx would build a pool from this key in the nanny too (1472 MiB on an H200)",
        "worker": "gpudask builds this worker's pool itself, once, before listen() (plugin rmm); "
                  "distributed-ucxx would build another at the first UCX connection",
        "scheduler": "no worker pool in the scheduler (gpudask.rmm.scheduler-pool-size asks for one)",
        "client": "no pool in the client: pools belong to workers",
    }[plan.role]
    if plan.role == "worker" and not ctx.gpus:  # gpudask builds no pool either: say so, not the GPU case
        why = "no GPU visible: no pool from gpudask, nor from distributed-ucxx at the first UCX connection"
    honoured = [f"{k}={v!r}" for k, v in user.items()]
    if honoured and plan.role == "worker":
        why += f"; your {', '.join(honoured)} is honoured as gpudask.rmm.pool-size"
    for key in UCXX_POOL_KEYS:
        if key not in keep:
            plan.set_config(key, None, why)


def check_fits(ctx: PlanContext, key: str, nbytes: int, target: Target, who: str, shared: bool = True) -> None:
    if nbytes <= 0:
        raise ConfigError(f"{shown(ctx, key)} rounds down to 0 bytes on {target.label} of {who}; "
                          f"accepted: at least {ALIGNMENT} bytes")
    k = target.shared_by if shared else 1
    total = nbytes * k
    if total > target.memory:
        sharing = f" x {k} workers sharing it = {total} bytes" if k > 1 else ""
        raise ConfigError(f"{shown(ctx, key)} is {nbytes} bytes ({gib(nbytes)}){sharing}, larger than "
                          f"{target.label} of {who} ({target.memory} bytes); accepted: at most "
                          f"{target.memory // k // ALIGNMENT * ALIGNMENT} bytes or a fraction <= {1 / k:g}")


def sharing_text(target: Target, declared: int | None) -> tuple[int, str]:
    """(workers the GPU's default pools are planned for, the line that says who they are)."""
    counted = target.host_workers
    mine = f"{target.shared_by} worker{'s' if target.shared_by > 1 else ''} of this command"
    others = target.others or {}
    parts = [mine] + [f"{n} of pid {pid}" for pid, n in sorted(others.items())]
    where = " + ".join(parts)
    if declared is not None:
        n = max(declared, counted)
        if counted > declared:
            return n, (f"gpudask.rmm.workers-per-gpu = {declared}, but {counted} workers are planned on it ({where}): "
                       f"planned for {counted}")
        return n, f"gpudask.rmm.workers-per-gpu = {declared} (declared; counted now: {where})"
    if others:
        return counted, (f"{where}; other gpudask commands of this user counted from their host plans in the "
                         "state directory")
    return counted, where


def default_initial(ctx: PlanContext, plan: ProcessPlan, target: Target, reasons: list[str],
                    declared: int | None = None) -> tuple[int, int]:
    """(initial size, workers it is planned for): half of the GPU's *total* memory split between every
    worker planned on it, never of what happens to be free, so pools are equal and stay so through restarts."""
    n, who = sharing_text(target, declared)
    initial = share_of(target.memory, n)
    split = f" split between the {n} workers sharing it" if n > 1 else ""
    reasons.append(f"default size {DEFAULT_FRACTION:g} of {target.label}{split} ({who}) = {initial} bytes "
                   f"({gib(initial)}){' each' if n > 1 else ''}: planned from the "
                   "GPU's total memory, not from what is free now: the same through restarts")
    if target.others and declared is None:
        ctx.warn(f"GPU {target.index} is shared with other gpudask commands ({who.split(';')[0]}): each default "
                 f"RMM pool is {gib(initial)} ({DEFAULT_FRACTION:g} of the "
                 f"GPU / {n}); workers started earlier keep their larger pool until they restart "
                 "(gpudask.rmm.workers-per-gpu declares the count for every command from the start)")
    if target.free is not None and target.free - reserve(target.memory) < initial:
        reasons.append(f"GPU {target.index} has {gib(target.free)} free now, less than this pool: the worker waits "
                       f"(gpudask.rmm.release-wait) for memory being released when it starts; holding it: "
                       f"{holders_text(target.processes) if target.processes is not None else 'unknown'}")
    return initial, n


def share_record(target: Target, shared: int, declared: int | None, maximum_set: bool, initial: int | None,
                 maximum: int | None) -> dict[str, Any] | None:
    """How a default pool's share was planned, for the worker to count again at start; None: not a default pool."""
    if not shared:
        return None
    return {"workers": shared, "fraction": DEFAULT_FRACTION, "command_workers": target.shared_by,
            "other_workers": {str(pid): n for pid, n in sorted((target.others or {}).items())},
            "declared": declared,
            # how the maximum follows a share counted again at start: set by you (kept), equal to
            # the initial size (PyTorch beside the pool), or the share of SHARED_MAXIMUM_FRACTION
            "maximum": "set" if maximum_set else ("initial" if maximum is not None and maximum == initial else "share")}


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    found = value.get(key) if isinstance(value, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _size(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@hookimpl
def gpudask_report_rows(plan: Mapping[str, Any],
                        published: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """The ``pool`` column: the planned initial size against the pool in place."""
    section = _mapping(_mapping(plan, "sections"), name)
    allocator = section.get("allocator")
    if not isinstance(allocator, str):
        return None
    planned = _size(section.get("initial_pool_size"))
    row: dict[str, Any] = {"column": "pool", "summary": allocator + (f" {planned / 2**30:.1f} GiB" if planned else ""),
                           "planned": planned, "actual": None, "note": None, "bytes": True, "keys": ["pool_size"]}
    if published is None:
        return [row]
    pair = _mapping(_mapping(_mapping(_mapping(published, "applied"), "plugins"), name), "pool_size")
    if pair:
        row["actual"] = pair.get("actual")
        if _size(pair.get("planned")) is not None:  # counted again at start: another command's workers joined
            row["planned"] = pair["planned"]
        return [row]
    report = _mapping(_mapping(published, "memory"), name)
    if report.get("pool_size") is not None:
        row["actual"] = report["pool_size"]
    elif report.get("applied") is False and planned is not None:
        note = report.get("skipped") or report.get("why") or "not built"
        row["note"] = note if isinstance(note, str) else repr(note)
    return [row]


@hookimpl
def gpudask_scheduler_check(ctx: PlanContext | None, reference: ProcessSide,
                            subject: ProcessSide | None) -> list[Finding] | None:
    """A worker whose default pool had to start smaller than planned (its GPU shared with other processes)."""
    fitted = _mapping(_mapping(subject, "memory"), name).get("fitted")
    if not isinstance(fitted, str):
        return []
    return [Finding("warning", "pool-fitted",
                    f"the worker's pool could not start at its planned size -- {fitted[:600]}: other processes "
                    "share its GPU; fix: one dask worker command per host with --nworkers N (its workers split "
                    "each GPU between them), or gpudask.rmm.pool-size for each command so the pools fit together",
                    details={"fitted": fitted[:600]})]

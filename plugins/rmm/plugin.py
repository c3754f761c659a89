"""RMM pools in worker processes: planned (pure, any process) from the ``gpudask.rmm.*`` settings,
the worker's GPU and UCX's transports; built by :mod:`.setup` in the worker before ``listen()``.

Nothing here imports rmm, cupy, numba or torch at module level: the plan runs in the
``dask worker`` CLI and in ``gpudask info`` too.  docs/memory.md is the user-facing description."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import ConfigError, hookimpl, parse_bytes, tls_enables

# hooks of this plugin defined beside what they call (pluggy reads this module's names)
from .facts import gpudask_facts_sections  # noqa: F401
from .options import (SHARED_MAXIMUM_FRACTION, UCXX_POOL_KEYS, RmmSettings, allocator_kind, gib,
                      gpudask_config_options, parse_pool_size, read_settings, shown)  # noqa: F401
from .report import gpudask_report_rows, gpudask_scheduler_check  # noqa: F401
from .setup import gpudask_applied_state, gpudask_server_setup, gpudask_setup_memory  # noqa: F401
from .target import (TRANSPORT_NAMES, Target, check_fits, describe_size, fast_transports, reset_ucxx_keys, resolve,
                     default_initial, share_maximum, share_record, target_of)

if TYPE_CHECKING:
    from gpudask.pluginapi import Facts, PlanContext, ProcessPlan

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
    target = Target(f"GPU {gpus[0].index} ({gpus[0].name}, {gpus[0].uuid}, {gib(gpus[0].memory_total)})",
                     int(gpus[0].memory_total), gpus[0].uuid, gpus[0].index)
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
    import dask.config

    user = {k: v for k in UCXX_POOL_KEYS
            if (v := dask.config.get(k, default=None, config=dict(ctx.user_config))) is not None}
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
               # a default initial size shrinks to fit what is free when the worker starts (fit.py);
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

"""The device memory a pool lives in, and its size arithmetic (part of the rmm plugin)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import ConfigError, process_gpu, tls_enables, workers_sharing_gpu

from .facts import of_gpu
from .fit import reserve
from .options import ALIGNMENT, DEFAULT_FRACTION, SHARED_MAXIMUM_FRACTION, UCXX_POOL_KEYS, gib, shown

if TYPE_CHECKING:
    from gpudask.pluginapi import PlanContext, ProcessPlan


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
    label = f"GPU {gpu.index} ({gpu.name}, {gpu.uuid}, {gib(gpu.memory_total)})"
    return Target(label, int(gpu.memory_total), gpu.uuid, gpu.index, shared, *of_gpu(ctx.facts, gpu.index))


def share_of(total: int, workers: int, fraction: float = DEFAULT_FRACTION) -> int:
    return int(fraction * total / max(1, workers)) // ALIGNMENT * ALIGNMENT


def share_maximum(total: int, workers: int) -> int | None:
    """A shared GPU's default pool stops growing at its share of :data:`SHARED_MAXIMUM_FRACTION` (None: one worker)."""
    return None if workers <= 1 else share_of(total, workers, SHARED_MAXIMUM_FRACTION)


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


def reset_ucxx_keys(ctx: PlanContext, plan: ProcessPlan, keep: tuple[str, ...] = ()) -> None:
    """Unset distributed-ucxx's pool keys so ``init_once`` builds no pool in this process."""
    import dask.config

    user = {k: dask.config.get(k, default=None, config=dict(ctx.user_config)) for k in UCXX_POOL_KEYS}
    if not ctx.uses_ucx and all(v is None for v in user.values()):
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
    honoured = [f"{k}={v!r}" for k, v in user.items() if v is not None]
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
    from .shares import holders_text

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

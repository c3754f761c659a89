"""The device memory a pool lives in, and its size arithmetic (part of the rmm plugin).

Which GPU (or MIG instance) a process's pool goes to, how many workers share it, a size
setting resolved to aligned bytes and checked against the GPU; which fast transports UCX
will use in the process; distributed-ucxx's own pool keys reset where gpudask builds pools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import ConfigError, process_gpu, tls_enables, workers_sharing_gpu

from .facts import memory_free
from .options import ALIGNMENT, DEFAULT_FRACTION, UCXX_POOL_KEYS, shown

if TYPE_CHECKING:
    from gpudask.pluginapi import PlanContext, ProcessPlan


@dataclass
class Target:
    """The device memory one worker's pool lives in."""

    label: str  # "GPU 0 (NVIDIA H200, GPU-…, 140.4 GiB)" -- used in every message
    memory: int
    uuid: str | None
    index: int
    shared_by: int = 1
    free: int | None = None  # free when the facts were read (None: unknown, a MIG instance)


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


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
        chosen = next((i for i in instances if plan.gpu and i.get("uuid") == plan.gpu), None)
        if chosen is None:  # CUDA shows a process one MIG instance: the first
            chosen = instances[0]
        memory = int(chosen.get("memory_total") or 0)
        label = (f"MIG instance {chosen.get('uuid')} of GPU {gpu.index} ({gpu.name}, {gib(memory)})")
        return Target(label, memory, chosen.get("uuid"), gpu.index)
    shared = max(1, len(workers_sharing_gpu(ctx, plan)))
    label = f"GPU {gpu.index} ({gpu.name}, {gpu.uuid}, {gib(gpu.memory_total)})"
    return Target(label, int(gpu.memory_total), gpu.uuid, gpu.index, shared, memory_free(ctx.facts, gpu.index))


# Other processes may hold this much of a GPU before gpudask plans for the host rather than for
# the command: a scheduler's or client's CUDA context (0.5-0.8 GiB on an H200) stays below it, a
# second command's pool does not.
OTHERS_SLACK = 0.05


def taken_by_others(target: Target) -> int:
    """Bytes of the GPU other processes hold now (0 when unknown or below the slack)."""
    if target.free is None:
        return 0
    taken = max(0, target.memory - target.free)
    return taken if taken > OTHERS_SLACK * target.memory else 0


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
        "nanny": "distributed-ucxx builds a pool from this key in every process that opens UCX: the nanny "
                 "would hold one of its own (1472 MiB measured on an H200); gpudask builds worker pools itself",
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
    """``nbytes`` (times the workers sharing the GPU, for initial pools) must fit the GPU."""
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


def default_initial(ctx: PlanContext, plan: ProcessPlan, target: Target, reasons: list[str]) -> int:
    """Half of the GPU for this command's default pools -- half of what is *free* when other
    processes (another command's workers, a cluster already running, a scheduler's pool) hold
    part of it, so that several commands on one GPU start with pools that fit together."""
    share = f", split between the {target.shared_by} workers of this command on it" if target.shared_by > 1 else ""
    taken = taken_by_others(target)
    base = target.memory - taken
    initial = int(DEFAULT_FRACTION / target.shared_by * base) // ALIGNMENT * ALIGNMENT
    if not taken:
        reasons.append(f"default size {DEFAULT_FRACTION:g} of {target.label}{share} = {initial} bytes "
                       f"({gib(initial)}): RMM's long-standing default, leaving the rest to CUDA contexts, "
                       f"UCX and allocators outside RMM (PyTorch's)")
        return initial
    sharing = workers_sharing_gpu(ctx, plan) or [i for i in (plan.index,) if i is not None]
    why = (f"GPU {target.index}: {gib(base)} of {gib(target.memory)} free when planned (other processes -- another "
           f"command's workers, a cluster already running -- hold {gib(taken)}): the default RMM pool of worker"
           f"{'s' if len(sharing) > 1 else ''} {', '.join(map(str, sharing))} is {DEFAULT_FRACTION:g} of what is "
           f"free, {gib(initial)} each, so the pools on this GPU fit together (gpudask.rmm.pool-size sets it)")
    ctx.warn(why)
    reasons.append(f"default size {DEFAULT_FRACTION:g} of the memory free on {target.label}{share} = {initial} "
                   f"bytes ({gib(initial)}): {why.split(': ', 1)[1]}")
    return initial

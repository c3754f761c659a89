"""Which GPU a process of the plan uses, and which workers share it, read from ``plan.gpu`` /
``plan.gpu_index`` (set by whichever plugin pins GPUs; meaningful once ``gpudask_plan_process``
has run for every process).  Re-exported by :mod:`gpudask.pluginapi`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudask.facts import GPU
    from gpudask.plan.context import PlanContext
    from gpudask.plan.model import ProcessPlan

# processes that move GPU data: the scheduler relays results and submit's GPU arguments
# (distributed.client.direct-to-workers: null by default); the nanny host never does
GPU_ROLES = ("worker", "client", "scheduler")


def process_gpu(ctx: PlanContext, plan: ProcessPlan) -> tuple[GPU | None, str]:
    """(GPU this process uses, how we know) for workers and clients; (None, why) otherwise."""
    if plan.role not in GPU_ROLES:
        return None, f"the {plan.role} process moves no GPU data"
    gpus = ctx.gpus
    if not gpus:
        return None, "no GPU visible"
    if plan.role == "worker" and plan.gpu_index is not None:
        return ctx.facts.gpu_by_index(plan.gpu_index), f"worker {plan.index} uses GPU {plan.gpu_index}"
    first = gpus[0]
    if plan.role == "client":
        return first, f"the client uses the first visible GPU, {first.index}"
    if plan.role == "scheduler":
        return first, f"the scheduler relays GPU frames on device 0 of its visible GPUs, GPU {first.index}"
    return first, (f"worker {plan.index} has no GPU of its own in the plan: CUDA device 0 is "
                   f"GPU {first.index}")


def workers_sharing_gpu(ctx: PlanContext, plan: ProcessPlan) -> list[int]:
    """Numbers of this host's workers using the GPU (or MIG instance) ``plan``'s process uses:
    every worker for an unpinned one (all use CUDA device 0); [] without a GPU."""
    gpu, _ = process_gpu(ctx, plan)
    if gpu is None:
        return []
    if plan.role == "worker" and plan.gpu_index is None:
        return list(range(ctx.nworkers))  # unpinned: every worker uses CUDA device 0
    workers = [p for p in ctx.plans if p.role == "worker" and p.index is not None]
    if plan.role == "worker":
        return [w.index for w in workers if w.gpu == plan.gpu and w.index is not None]
    device0 = ctx.gpus[0].index  # where a worker without a GPU of its own computes
    return [w.index for w in workers
            if w.index is not None and (device0 if w.gpu_index is None else w.gpu_index) == gpu.index]

"""One GPU per worker: CUDA_VISIBLE_DEVICES rotated per worker, GPU=1 resource.

Worker ``i`` of a host gets the ``i``-th visible GPU first in its ``CUDA_VISIBLE_DEVICES`` and
the other visible GPUs after it (dask-cuda's rotation), so every library that looks at device 0
uses the worker's own GPU while peers stay reachable for CUDA IPC.  Entries keep the form the
user wrote (index, ``GPU-`` or ``MIG-`` UUID); a MIG instance counts as a GPU of its own.  More
workers than GPUs share them round-robin, with a warning.  The core numbers the workers
(``gpudask.apply.slots.worker_index``): restarted workers keep their number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import hookimpl

if TYPE_CHECKING:
    from gpudask.pluginapi import GPU, Facts, PlanContext, ProcessPlan

name = "gpu-pinning"
priority = 10


@dataclass(frozen=True)
class Unit:
    """One thing a worker can own: a GPU, or a MIG instance of one."""

    entry: str  # as written in CUDA_VISIBLE_DEVICES
    gpu: GPU  # the physical GPU
    uuid: str  # GPU-... or, for a MIG instance, MIG-...

    @property
    def label(self) -> str:
        if self.uuid.startswith("MIG-"):
            return f"MIG instance {self.uuid} of GPU {self.gpu.index}"
        return f"GPU {self.gpu.index} ({self.uuid})"


def visible_units(facts: Facts) -> list[Unit]:
    """The GPUs (and MIG instances) workers of this host share out, in CUDA's order."""
    cvd = facts.cuda_visible_devices
    if cvd is None:
        return _all_units(facts)
    units: list[Unit] = []
    for raw in cvd.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if re.fullmatch(r"-\d+", entry):
            break  # CUDA stops at a negative index
        # facts resolve (and validate) the entry; we only add which MIG instance it is
        (gpu,) = replace(facts, cuda_visible_devices=entry).visible_gpus()
        unit = Unit(entry, gpu, _entry_uuid(entry, gpu))
        if all((u.gpu.index, u.uuid) != (unit.gpu.index, unit.uuid) for u in units):
            units.append(unit)
    return units


def _all_units(facts: Facts) -> list[Unit]:
    gpus = sorted(facts.gpus, key=lambda g: g.index)
    # MIG instances can only be named by UUID; CUDA_VISIBLE_DEVICES then uses UUIDs throughout
    by_uuid = any(_mig_instances(g) for g in gpus)
    units = []
    for gpu in gpus:
        if gpu.mig.get("enabled"):
            units += [Unit(inst["uuid"], gpu, inst["uuid"]) for inst in _mig_instances(gpu)]
        else:
            units.append(Unit(gpu.uuid if by_uuid else str(gpu.index), gpu, gpu.uuid))
    return units


def _mig_instances(gpu: GPU) -> list[dict[str, Any]]:
    return list(gpu.mig.get("instances") or []) if gpu.mig.get("enabled") else []


def _entry_uuid(entry: str, gpu: GPU) -> str:
    instances = _mig_instances(gpu)
    if entry.startswith("MIG-GPU-"):  # old form MIG-GPU-<uuid>/<gi>/<ci>
        ids = entry.split("/")[1:]
        return next((str(i["uuid"]) for i in instances
                     if [str(i.get("gpu_instance_id")), str(i.get("compute_instance_id"))] == ids), entry)
    if entry.startswith("MIG-"):
        return next((str(i["uuid"]) for i in instances if str(i["uuid"]).lower().startswith(entry.lower())), entry)
    # a MIG-enabled GPU named by index or GPU UUID: CUDA shows its first instance
    return str(instances[0]["uuid"]) if instances else gpu.uuid


@hookimpl
def gpudask_plan_process(ctx: PlanContext, plan: ProcessPlan) -> None:
    if plan.role != "worker" or plan.index is None:  # a worker's plan always has its number
        return
    # no GPU for CUDA (NVML sees none, whatever CUDA_VISIBLE_DEVICES says): nothing to pin
    units = visible_units(ctx.facts) if ctx.gpus else []
    if not units:
        plan.note("skipped", "no GPU visible")
        return
    n = len(units)
    k = plan.index % n
    own = units[k]
    cvd = ",".join(u.entry for u in units[k:] + units[:k])  # its own unit first, then the others in order
    user_cvd = ctx.facts.cuda_visible_devices
    source = (f"of CUDA_VISIBLE_DEVICES={user_cvd} (the user's list, entries kept as written)"
              if user_cvd is not None else "of this host")
    why = f"worker {plan.index} owns {own.label}, visible device {k} {source}"
    if n > 1:
        why += "; listed first, the other visible GPUs after it (rotation)"
        if own.uuid.startswith("MIG-"):
            why += " (CUDA shows a process only the first MIG instance listed)"
    if ctx.nworkers > n:
        why += f"; {ctx.nworkers} workers share {n} GPU(s) round-robin"
        ctx.warn(f"{ctx.nworkers} workers on {n} visible GPU(s): GPUs are shared round-robin "
                 f"(worker i uses visible GPU i mod {n}); shared GPUs split their memory and compute")
    plan.set_gpu(own.uuid, own.gpu.index, cvd, why)

    user_resources = ctx.user_dask_config("distributed.worker.resources")
    if user_resources:
        plan.note("no GPU resource", f"distributed.worker.resources={user_resources!r} set by the user "
                                     "(explicit settings win)")
    else:
        plan.set_resource("GPU", 1, "one GPU per worker: tasks can ask for resources={'GPU': 1}")

"""Bind each worker to the CPUs NVML reports as local to its GPU (facts ``gpu.cpu_affinity``); the
apply stage intersects them with the CPUs the process may use (``os.sched_getaffinity``: cgroups,
Slurm, taskset) and only warns when that fails."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpudask.pluginapi import Option, cpu_ranges, hookimpl, parse_bool

if TYPE_CHECKING:
    from gpudask.pluginapi import PlanContext, ProcessPlan

name = "cpu-affinity"
priority = 20

ENABLED = "gpudask.cpu-affinity.enabled"


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [Option(ENABLED, True, "Bind each worker process to the CPUs local to its GPU (NVML's CPU affinity).",
                   parse_bool, "true or false")]


@hookimpl
def gpudask_plan_process(ctx: PlanContext, plan: ProcessPlan) -> None:
    if plan.role != "worker":
        return
    if plan.gpu_index is None:
        plan.note("skipped", "no GPU visible" if not ctx.gpus else "this worker has no GPU of its own")
        return
    setting = ctx.require(ENABLED)
    if not setting.value:
        plan.note("skipped", f"{ENABLED}=false (from {setting.source})")
        return
    gpu = ctx.facts.gpu_by_index(plan.gpu_index)
    if not gpu.cpu_affinity:
        plan.note("skipped", f"NVML reports no CPU affinity for GPU {gpu.index}")
        return
    numa = f" (NUMA node {gpu.numa_node})" if gpu.numa_node is not None else ""
    plan.set_cpu_affinity(gpu.cpu_affinity, f"CPUs local to GPU {gpu.index}{numa} (NVML), within those the "
                                            "process may use")
    if ctx.facts.described:
        plan.note("CPU binding not applied here",
                  f"the host is described ({ctx.facts.origin}): its CPUs "
                  f"{cpu_ranges(sorted(gpu.cpu_affinity))} are not this machine's")

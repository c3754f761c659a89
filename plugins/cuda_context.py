"""The CUDA-context-first check: no stray context before UCX, the worker's context on its own GPU.

A CUDA context made before gpudask set ``CUDA_VISIBLE_DEVICES`` (``import cudf``, a preload listed
before gpudask) sits on the wrong GPU, and UCX is set up for it.  Every process looks for one
through NVML (which never creates one) and says where, the likely cause and the fix.  Workers and
the scheduler get ``RAPIDS_NO_INITIALIZE=1`` and, when UCX will need a context, have it made first
on their own GPU with cuda.core (what ucxx uses), its UUID checked.  Nothing touching a device runs
on a described host.  The plan section (scheduler, nanny host): ``context_gpu``, the planned UUID or None.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import (GpudaskError, Option, applied_role, choice, hookimpl, plugin_state,
                               ucxx_creates_cuda_context)

if TYPE_CHECKING:
    from distributed import Nanny, Scheduler, Worker

    from gpudask.pluginapi import Facts, PlanContext, ProcessPlan

name = "cuda-context"
priority = 40

ON_EXISTING = "gpudask.context.on-existing"
CONTEXT_GPU = "context_gpu"  # this plugin's section: the GPU a scheduler's / nanny host's context is on
CREATE_KEYS = ("distributed-ucxx.create-cuda-context", "distributed.comm.ucx.create-cuda-context")

logger = logging.getLogger("distributed.gpudask")


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [Option(ON_EXISTING, "warn", "What to do when a process already has a CUDA context it should not have "
                   "(before gpudask set up the worker's GPU, or in a nanny, scheduler or client): warn or error.",
                   choice("warn", "error"), "warn | error")]


# -- plan ----------------------------------------------------------------------------
def ucx_wants_context(env: dict[str, str], config_get: Any) -> bool:
    """distributed-ucxx's own rule (``init_once``): a context when create-cuda-context is true or UCX_TLS names a
    cuda transport."""
    return any(config_get(key) is True for key in CREATE_KEYS) or ucxx_creates_cuda_context(env.get("UCX_TLS"))


@hookimpl
def gpudask_preimport(facts: Facts, role: str, protocol: str | None) -> list[str] | None:
    """cuda.core, which makes a GPU worker's context: imported by its fork server (the import opens none)."""
    return ["cuda.core"] if role == "worker" and facts.visible_gpus() else None


@hookimpl
def gpudask_plan_process(ctx: PlanContext, plan: ProcessPlan) -> None:
    if plan.role not in ("worker", "nanny", "scheduler"):
        return  # the client: checked by gpudask.initialize(), its environment is the user's
    if not ctx.gpus:
        if plan.role == "worker":
            plan.note("skipped", "no GPU visible")
        return
    what = {"worker": "the worker's context is made on its own GPU, by gpudask or UCX",
            "nanny": "the process hosting the nannies must hold no CUDA context",
            "scheduler": "its context is made by gpudask on device 0, for UCX's relayed frames" if ctx.uses_ucx
                         else "the scheduler must hold no CUDA context"}[plan.role]
    plan.set_env("RAPIDS_NO_INITIALIZE", "1", f"cudf/rmm create no CUDA context when imported: {what}")


@hookimpl
def gpudask_plan_memory(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Runs after transport selection: UCX_TLS is known, so is whether UCX needs a context."""
    if plan.role == "client" or not ctx.gpus:
        return
    if plan.role in ("scheduler", "nanny"):
        # distributed-ucxx's rule (init_once): a context on device 0 of CUDA_VISIBLE_DEVICES when UCX needs one
        planned = str(ctx.gpus[0].uuid) if planned_context(ctx, plan) else None
        plan.set_section({CONTEXT_GPU: planned},
                         "UCX needs one here (UCX_TLS names a cuda transport or create-cuda-context is set), on "
                         "device 0 of CUDA_VISIBLE_DEVICES" if planned else
                         "no CUDA context in this process: UCX needs none here", f"CUDA context: {planned or 'none'}")
    own = own_gpu(ctx, plan)
    if own is not None and planned_context(ctx, plan):
        plan.note(f"CUDA context on {own[0]} before UCX",
                  "created at import on device 0 of CUDA_VISIBLE_DEVICES, its UUID checked"
                  + ("; to receive relayed GPU frames (about 520 MiB on an H200)" if plan.role == "scheduler" else ""))
    if ctx.facts.described:
        plan.note("CUDA context check not run here",
                  f"the host is described ({ctx.facts.origin}): nothing touching a device runs")


def planned_context(ctx: PlanContext, plan: ProcessPlan) -> bool:
    """Does UCX create a CUDA context in this process, by its plan (the user's explicit values included)?"""
    env = plan.env if "UCX_TLS" in plan.env else dict(ctx.user_env)
    return ctx.uses_ucx and ucx_wants_context(env, lambda key: plan.config.get(key, ctx.user_dask_config(key)))


def own_gpu(ctx: PlanContext, plan: ProcessPlan) -> tuple[str, int] | None:
    """(UUID, index) of the GPU this process's context belongs on: a worker's own, the scheduler's device 0."""
    if plan.role == "worker" and plan.gpu is not None and plan.gpu_index is not None:  # set_gpu sets both
        return plan.gpu, plan.gpu_index
    if plan.role == "scheduler" and ctx.gpus:
        return ctx.gpus[0].uuid, ctx.gpus[0].index
    return None


# -- apply ---------------------------------------------------------------------------
def _nvml_context() -> tuple[bool, Any]:
    """(NVML answered, the CudaDeviceInfo of this process's CUDA context or None): NVML never creates one."""
    from distributed.diagnostics import nvml

    try:
        found = nvml.has_cuda_context()  # type: ignore[no-untyped-call]  # distributed is untyped
    except Exception as e:  # noqa: BLE001 - NVML errors must not stop a process
        logger.debug("gpudask: NVML could not list CUDA contexts: %s", e)
        return False, None
    return True, found.device_info if found.has_context else None


def _describe(info: Any) -> str:
    mig = f" MIG instance {info.mig_index}" if info.mig_index is not None else ""
    return f"GPU {info.device_index}{mig} ({_uuid_of(info)})"


def _uuid_of(info: Any) -> str:
    return info.uuid.decode() if isinstance(info.uuid, bytes) else str(info.uuid)


def _norm(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-").removeprefix("mig-").replace("-", "")


def _uuids(gpu: Any) -> set[str]:
    """A GPU's UUID and its MIG instances', normalised (GPU-, MIG- or bare compare equal); none for no GPU."""
    if gpu is None:
        return set()
    return {_norm(gpu.uuid)} | {_norm(str(i["uuid"])) for i in (gpu.mig.get("instances") or []) if i.get("uuid")}


def _same_device(uuid: str, plan: ProcessPlan, ctx: PlanContext) -> bool:
    """Does ``uuid`` name the process's own GPU (or its MIG instance's parent)?"""
    own = own_gpu(ctx, plan)
    return own is not None and _norm(uuid) in {_norm(own[0])} | _uuids(ctx.facts.gpu_by_index(own[1]))


def _where(plan: ProcessPlan) -> str:
    names = {"worker": f"worker {plan.index}", "nanny": "the dask worker process hosting the nannies",
             "scheduler": "the scheduler", "client": "this client process"}
    return f"{names[plan.role]} (pid {os.getpid()})"


def _cause_and_fix(plan: ProcessPlan) -> str:
    if plan.role == "client":
        return ("Likely cause: something touched the GPU (a CuPy/cuDF/Numba call, or an import that initialises "
                "CUDA) before gpudask.initialize(). Fix: call gpudask.initialize() and start the cluster and the "
                "Client first, set RAPIDS_NO_INITIALIZE=1, or move that code after them.")
    preload = "a --preload listed before gpudask" if plan.role == "worker" else "a --preload/--preload-nanny module"
    return (f"Likely cause: a module imported before gpudask touches CUDA ({preload}, a sitecustomize, or a library "
            "that initialises CUDA when imported, e.g. cudf without RAPIDS_NO_INITIALIZE=1). Fix: set "
            "RAPIDS_NO_INITIALIZE=1, list gpudask first in --preload, or move the import into the tasks.")


def report(ctx: PlanContext, plan: ProcessPlan, message: str) -> None:
    text = f"{message} {_cause_and_fix(plan)}"
    if ctx.value(ON_EXISTING) == "error":
        raise GpudaskError(f"{text} ({ON_EXISTING}=error)")
    logger.warning("gpudask: %s", text)


def check_existing(ctx: PlanContext, plan: ProcessPlan, when: str) -> None:
    """Report a CUDA context this process should not have at this point."""
    _, info = _nvml_context()
    if info is None:
        return
    if plan.role == "worker":
        if _same_device(_uuid_of(info), plan, ctx):
            logger.info("gpudask: worker %s already has a CUDA context %s, on its own GPU", plan.index, when)
            return
        own = f", not on its own GPU {plan.gpu_index} ({plan.gpu})" if plan.gpu else ""
        cvd = plan.env.get("CUDA_VISIBLE_DEVICES")
        report(ctx, plan, f"{_where(plan)} already has a CUDA context on {_describe(info)} {when}{own}: it was "
                          "created before gpudask set up the worker"
                          + (f" (CUDA_VISIBLE_DEVICES={cvd})" if cvd else "")
                          + ", so the worker computes, and UCX registers memory, on that GPU, which also holds "
                            "memory no worker owns.")
    elif plan.role == "client":
        report(ctx, plan, f"{_where(plan)} already has a CUDA context on {_describe(info)} {when}: UCX in this "
                          "process is set up for that device, and processes forked from here inherit it.")
    elif plan.role == "scheduler" and planned_context(ctx, plan) and ctx.gpus:  # its own GPU: device 0
        if _same_device(_uuid_of(info), plan, ctx):
            logger.info("gpudask: the scheduler has its CUDA context on its own GPU %s %s (planned: it relays GPU "
                        "frames over UCX)", _describe(info), when)
            return
        report(ctx, plan, f"{_where(plan)} has a CUDA context on {_describe(info)} {when}, not on its own GPU "
                          f"{ctx.gpus[0].uuid} (device 0 of its visible GPUs).")
    elif plan.role == "nanny" and planned_context(ctx, plan):
        logger.info("gpudask: the dask worker process hosting the nannies has a CUDA context on %s %s: your "
                    "UCX_TLS / create-cuda-context asks for it (explicit settings win)", _describe(info), when)
    else:
        report(ctx, plan, f"{_where(plan)} has a CUDA context on {_describe(info)} {when}: it holds GPU memory "
                          "that no worker can use (only worker processes should).")


@hookimpl
def gpudask_context_init(ctx: PlanContext, plan: ProcessPlan) -> None:
    if not ctx.gpus:
        return
    if ctx.facts.described:
        logger.debug("gpudask: CUDA context check skipped in %s: the host is described (%s)",
                     _where(plan), ctx.facts.origin)
        return
    check_existing(ctx, plan, "before gpudask.initialize()" if plan.role == "client" else "at gpudask's import")
    if plan.role in ("worker", "scheduler") and own_gpu(ctx, plan) is not None and ctx.uses_ucx:
        import dask.config

        if ucx_wants_context(dict(os.environ), lambda key: dask.config.get(key, default=None)):
            if plan.role == "scheduler" and applied_role() != "scheduler":
                return  # a LocalCluster's scheduler in a client's process: the client's context is its own
            create_context(ctx, plan)


def create_context(ctx: PlanContext, plan: ProcessPlan) -> None:
    """The process's context on device 0 of its CUDA_VISIBLE_DEVICES (its own GPU), then checked."""
    try:
        try:
            from cuda.core import Device
        except ImportError:
            from cuda.core.experimental import Device
    except ImportError:
        raise GpudaskError("UCX_TLS names cuda transports but cuda-core is not installed (ucxx needs it to create "
                           "the CUDA context): pip install cuda-core") from None
    device = Device(0)
    device.set_current()
    uuid = str(device.uuid)  # CUDA's own view of the device the context is on
    own_uuid, own_index = own_gpu(ctx, plan) or (None, None)
    if not _same_device(uuid, plan, ctx):
        report(ctx, plan, f"{_where(plan)} created its CUDA context on device 0 of CUDA_VISIBLE_DEVICES="
                          f"{os.environ.get('CUDA_VISIBLE_DEVICES')}, but that device is {uuid}, not its own GPU "
                          f"{own_uuid}: CUDA was initialised before gpudask set CUDA_VISIBLE_DEVICES.")
        return
    who = f"worker {plan.index}" if plan.role == "worker" else "the scheduler"
    logger.info("gpudask: %s created its CUDA context on GPU %s (%s) before UCX", who, own_index, own_uuid)
    _quiet_ucxx_about([str(own_uuid), uuid])


class _OwnContextFilter(logging.Filter):
    """distributed-ucxx warns about any context that exists before it initialises: drop that warning for the one
    gpudask made on purpose, on the right GPU."""

    def __init__(self, uuids: list[str]):
        super().__init__()
        self.uuids = [u.lower() for u in uuids]
        self.pid = os.getpid()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not text.startswith("A CUDA context for device") or f"process ID {self.pid}." not in text:
            return True
        return not any(u in text.lower() for u in self.uuids)


def _quiet_ucxx_about(uuids: list[str]) -> None:
    ucxx_logger = logging.getLogger("distributed_ucxx.ucxx")
    if not any(isinstance(f, _OwnContextFilter) for f in ucxx_logger.filters):
        ucxx_logger.addFilter(_OwnContextFilter(uuids))


def compare_context(ctx: PlanContext, plan: ProcessPlan, actual: str | None) -> dict[str, dict[str, Any]] | None:
    """``{"cuda_context": {planned, actual}}`` for a scheduler or nanny host: this plugin's section against
    ``actual`` (the UUID NVML found, None: no context); None where this plugin planned nothing."""
    section = plan.sections.get(name) or {}
    if plan.role not in ("scheduler", "nanny") or CONTEXT_GPU not in section:
        return None
    planned = section[CONTEXT_GPU]
    gpu = next((g for g in ctx.gpus if _norm(g.uuid) == _norm(str(planned))), None)
    if planned and actual and _norm(actual) in {_norm(planned)} | _uuids(gpu):
        actual = planned  # a MIG instance of the planned GPU is the planned GPU
    return {"cuda_context": {"planned": planned, "actual": actual}}


@hookimpl
def gpudask_applied_state(ctx: PlanContext, plan: ProcessPlan) -> dict[str, dict[str, Any]] | None:
    """A scheduler's CUDA context where its plan has it (NVML: creates none)."""
    if plan.role not in ("scheduler", "nanny") or not ctx.gpus or ctx.facts.described:
        return None
    answered, info = _nvml_context()
    if not answered:
        return None  # NVML missing or failing: nothing to compare
    return compare_context(ctx, plan, _uuid_of(info) if info is not None else None)


@hookimpl
def gpudask_server_setup(ctx: PlanContext, plan: ProcessPlan, server: Scheduler | Worker | Nanny) -> None:
    """After ``listen()``: UCX has initialised.  A nanny host or scheduler must still hold no context."""
    done = plugin_state("cuda-context", set)  # what this process checked already
    if plan.role not in ("nanny", "scheduler") or "after listen" in done or not ctx.gpus or ctx.facts.described:
        return
    if applied_role() != plan.role:
        return  # e.g. a LocalCluster's scheduler in a client's process: the client's context is its own
    done.add("after listen")  # the N nannies of `--nworkers N` share one process
    check_existing(ctx, plan, "after it started listening (UCX_TLS here: "
                              f"{os.environ.get('UCX_TLS', 'unset')})")

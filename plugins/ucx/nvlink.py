"""UCX over NVLink / CUDA IPC (cuda_copy, cuda_ipc), and no CUDA transport where no GPU data moves
(docs/transports.md): every GPU process gets both whenever UCX is used (cuda_ipc unless MIG or
this host's UCX lacks it) and ``create-cuda-context`` true; the nanny host and GPU-less processes
get none and no context from UCX; a ``create-cuda-context`` the user set wins."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpudask.pluginapi import (FactsSection, Finding, Option, facts_from_dict, hookimpl, parse_optional_bool,
                               process_gpu, tls_enables, ucxx_creates_cuda_context, workers_sharing_gpu)

from . import nvlink_facts
from .ucx_info import supports as ucx_supports
from .rules import UCX_AUTO, decide, leave_out_on_described_host, mode, mode_why, offer, set_flag, set_tls_flag, user_tls

if TYPE_CHECKING:
    from gpudask.pluginapi import GPU, PlanContext, ProcessPlan, ProcessSide

name = "nvlink"
priority = 60

NVLINK = "gpudask.transport.nvlink"
CUDA_COPY = "gpudask.transport.cuda-copy"
CONTEXT_FLAG = "create-cuda-context"
# distributed-ucxx's key and its older name (distributed.comm.ucx.*)
CONTEXT_KEYS = ("distributed-ucxx.create-cuda-context", "distributed.comm.ucx.create-cuda-context")


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [
        Option(NVLINK, None, "cuda_ipc in UCX_TLS (CUDA IPC: NVLink, PCIe peers, processes sharing a GPU): null = auto (every "
               "GPU process, unless MIG), true, false.",
               parse_optional_bool, "true, false or null (auto)",
               legacy=("distributed.comm.ucx.nvlink", "distributed-ucxx.nvlink"), dask_cuda_kwarg="enable_nvlink",
               dask_cuda_option="--enable-nvlink/--disable-nvlink", ucx_only=True),
        Option(CUDA_COPY, None, "cuda_copy in UCX_TLS (GPU buffers over any transport): null = auto (whenever a GPU "
               "is present), true, false.", parse_optional_bool, "true, false or null (auto)",
               legacy=("distributed.comm.ucx.cuda-copy", "distributed-ucxx.cuda-copy")),
    ]


@hookimpl
def gpudask_facts_sections() -> list[FactsSection]:
    """The host's NVLink peers (:mod:`.nvlink_facts`)."""
    return list(nvlink_facts.SECTIONS)


@hookimpl
def gpudask_select_transport(ctx: PlanContext, plan: ProcessPlan) -> None:
    gpu, gpu_why = process_gpu(ctx, plan)
    if gpu is None and plan.role in ("worker", "client") and not ctx.gpus:
        plan.note("skipped", "no GPU visible")
    if gpu is None and plan.role == "scheduler" and not ctx.gpus and ctx.uses_ucx:
        plan.note("skipped", "no GPU visible: GPU results and CuPy/cuDF arguments cannot pass through this "
                             "scheduler over UCX; clients must gather direct from the workers (see "
                             "docs/scheduler-check.md, A scheduler without a GPU)")
    if not ctx.uses_ucx:
        if gpu is not None and plan.role == "worker":
            plan.note("no UCX", f"protocol {ctx.protocol}: GPU buffers travel through host memory over TCP; "
                                "--protocol ucx uses cuda_copy/cuda_ipc (NVLink)")
        return
    if gpu is None:
        _no_cuda(ctx, plan, gpu_why)
        return
    if mode(ctx) == UCX_AUTO:
        context_flag(ctx, plan, True, f"{mode_why(ctx)}: the CUDA context on GPU {gpu.index} exists "
                                      "before UCX initialises, so UCX sees the GPU and chooses for it")
        return

    copy_ok = ucx_supports(ctx.facts, "cuda_copy") is not False
    copy_on, copy_why, _ = decide(
        ctx, CUDA_COPY, "cuda_copy", copy_ok,
        f"{gpu_why}: UCX moves GPU buffers with cuda_copy" if copy_ok
        else "this host's UCX has no cuda_copy transport (built without CUDA)",
        # as dask-cuda: --enable-tcp-over-ucx (transport.tcp) moves GPU buffers too, with cuda_copy
        implied_by=(NVLINK, "gpudask.transport.tcp"))
    ipc_detected, ipc_detect_why = _ipc_detection(ctx, plan, gpu)
    ipc_on, ipc_why, _ = decide(ctx, NVLINK, "cuda_ipc", ipc_detected, ipc_detect_why)

    if plan.role == "scheduler" and not copy_on and not ipc_on:
        ctx.warn(f"the scheduler has GPU {gpu.index} but no CUDA transport ({copy_why}): GPU results a client "
                 "gathers through it and CuPy/cuDF arguments of submit cannot pass; gather direct "
                 "(Client(direct_to_workers=True)) or let the scheduler use cuda_copy")
    offer(plan, "cuda_copy", copy_on, copy_why)
    offer(plan, "cuda_ipc", ipc_on, ipc_why)
    set_tls_flag(plan, "cuda-copy", "cuda_copy", copy_on)
    set_tls_flag(plan, "nvlink", "cuda_ipc", ipc_on)
    if ipc_on and plan.role in ("scheduler", "client"):
        plan.note("UCX's CUDA IPC cache kept", f"as dask-cuda keeps it: without it the {plan.role} mapped and "
                  "unmapped every frame it received (client paths up to 1.4x dask-cuda's on an H200)")
    if copy_on or ipc_on:
        context_flag(ctx, plan, True,
                     f"UCX_TLS names CUDA transports: the CUDA context on GPU {gpu.index} is created before UCX "
                     "initialises, so UCX finds it (and never on another GPU)")
    elif user_context_flag(ctx) is not None:
        context_flag(ctx, plan, False, "no CUDA transport")


CUDA_TLS = frozenset({"cuda", "cuda_copy", "cuda_ipc", "gdr_copy"})


@hookimpl
def gpudask_context_init(ctx: PlanContext, plan: ProcessPlan) -> None:
    """A described GPU host over UCX starts on a CPU: no CUDA transport and no CUDA context here."""
    leave_out_on_described_host(ctx, plan, "GPU", CUDA_TLS, "cuda", (), (CONTEXT_FLAG, "cuda-copy", "nvlink"))


def user_context_flag(ctx: PlanContext) -> tuple[str, bool] | None:
    """``(key, value)`` of a create-cuda-context the user set (environment or config), None when unset."""
    for key in CONTEXT_KEYS:
        value = ctx.user_dask_config(key)
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            value = value.strip().lower() == "true"
        if isinstance(value, bool):
            return key, value
    return None


def context_flag(ctx: PlanContext, plan: ProcessPlan, value: bool, why: str) -> None:
    user = user_context_flag(ctx)
    if user is None:
        set_flag(plan, CONTEXT_FLAG, value, why)
        return
    key, mine = user
    what = ("distributed-ucxx creates a CUDA context on device 0 of CUDA_VISIBLE_DEVICES when UCX initialises"
            if mine else "distributed-ucxx creates no CUDA context unless UCX_TLS names a cuda transport")
    set_flag(plan, CONTEXT_FLAG, mine, f"{key}={mine} set by you: explicit settings win ({what}; gpudask would "
                                       f"plan {value}: {why})")


def _ipc_detection(ctx: PlanContext, plan: ProcessPlan, gpu: GPU) -> tuple[bool, str]:
    """cuda_ipc from the host's capabilities, for every peer of the host: UCX uses CUDA IPC only where it
    works; leaving it out stages such transfers through host memory (2 s instead of 2 ms for 1 GiB, H200)."""
    if (plan.gpu or "").startswith("MIG-") or (gpu.mig.get("enabled") and plan.gpu is None):
        return False, f"GPU {gpu.index} is split into MIG instances: CUDA IPC does not work between them"
    if ucx_supports(ctx.facts, "cuda_ipc") is False:
        return False, "this host's UCX has no cuda_ipc transport"
    return True, (f"{_ipc_peers(ctx, plan, gpu)}: CUDA IPC is allowed for every peer of this host; UCX "
                  "uses it where it works")


def _ipc_peers(ctx: PlanContext, plan: ProcessPlan, gpu: GPU) -> str:
    visible = {g.index for g in ctx.gpus}
    known = nvlink_facts.peers(ctx.facts, gpu.index)
    peers = sorted(set(known or []) & visible)
    if peers:
        return (f"GPU {gpu.index} has NVLink peer{'s' if len(peers) > 1 else ''} {', '.join(map(str, peers))} "
                "among the visible GPUs")
    sharing = workers_sharing_gpu(ctx, plan)
    if plan.role in ("client", "scheduler") and sharing:
        return f"the {plan.role} and worker(s) {', '.join(map(str, sharing))} of this host use GPU {gpu.index}"
    if [j for j in sharing if j != plan.index]:
        return f"GPU {gpu.index} is shared by workers {', '.join(map(str, sharing))} of this command"
    hidden = sorted(set(known or []) - visible)
    if hidden:
        return (f"GPU {gpu.index}: its NVLink peer{'s' if len(hidden) > 1 else ''} {', '.join(map(str, hidden))} "
                f"{'are' if len(hidden) > 1 else 'is'} not visible here (other processes may use them)")
    if known is None:
        return (f"GPU {gpu.index}: its NVLink peers are not described ({ctx.facts.where()} has no nvlink section) "
                "and no other worker of this command is on it")
    return f"GPU {gpu.index}: no NVLink peer and no other worker of this command on it"


def _no_cuda(ctx: PlanContext, plan: ProcessPlan, why: str) -> None:
    role_why = {"nanny": "the nanny moves no GPU data",
                "scheduler": "the scheduler sees no GPU, so it cannot receive GPU frames"}.get(plan.role)
    context_why = f"{role_why}: no CUDA context for UCX here" if role_why else f"{why}: no CUDA context for UCX"
    tls = user_tls(ctx)
    if ucxx_creates_cuda_context(tls):
        ctx.warn(f"UCX_TLS={tls} from the environment names CUDA transports: distributed-ucxx creates a CUDA "
                 f"context in the {plan.role} process when UCX initialises (explicit settings win)")
    requested = [s for s in (ctx.setting(NVLINK), ctx.setting(CUDA_COPY)) if s is not None and s.value]
    also = (f"; {', '.join(f'{s.key}=True' for s in requested)} applies to processes with a GPU" if requested
            else "")
    if mode(ctx) != UCX_AUTO:
        set_flag(plan, "cuda-copy", False, f"{why}: no CUDA transport{also}")
        set_flag(plan, "nvlink", False, f"{why}: no CUDA transport{also}")
    user = user_context_flag(ctx)
    if user is not None and user[1]:
        ctx.warn(f"{user[0]}=True set by you: distributed-ucxx creates a CUDA context in the {plan.role} process "
                 f"when UCX initialises ({why}; explicit settings win)")
    context_flag(ctx, plan, False, context_why)


# -- the check: a GPU process without a CUDA IPC path --------------------------------------
UCX_PROTOCOLS = ("ucx", "ucxx")


def staged_why(side: ProcessSide | None) -> str | None:
    """Why GPU data between this process and its host's peers is staged through host memory, or None."""
    if not isinstance(side, dict) or side.get("protocol") not in UCX_PROTOCOLS:
        return None
    if "no GPU in UCX here" in (side.get("left_out_here") or ()):
        return None  # a described GPU host run on a CPU: gpudask itself left the CUDA transports out
    tls = side.get("ucx_tls")
    if not isinstance(tls, str) or tls_enables(tls, "cuda_ipc"):
        return None  # unset: UCX may use every transport
    try:
        facts = facts_from_dict(side["facts"], "published")
    except Exception:  # noqa: BLE001 - the runner reports malformed facts itself
        return None
    gpus = facts.visible_gpus()
    if not gpus or any(g.mig.get("enabled") for g in gpus) or ucx_supports(facts, "cuda_ipc") is False:
        return None
    return f"UCX_TLS={tls} leaves out cuda_ipc although {facts.hostname}'s GPU(s) and UCX could use it"


@hookimpl
def gpudask_scheduler_check(ctx: PlanContext | None, reference: ProcessSide,
                            subject: ProcessSide | None) -> list[Finding] | None:
    """A GPU process whose transfers to peers on its host would be staged through host memory."""
    out = []
    why = staged_why(subject)
    if why is not None and isinstance(subject, dict):
        out.append(Finding(
            "warning", "staged-through-host",
            f"the {subject.get('role')}: {why}: GPU data between it and its peers on that host (other workers, "
            "a client, the scheduler) is staged through host memory over TCP (2 s instead of 2 ms for 1 GiB "
            "on an H200); fix: unset UCX_TLS (gpudask allows cuda_ipc for every GPU process) or add cuda_ipc to "
            "it, and leave gpudask.transport.nvlink unset", details={"ucx_tls": subject.get("ucx_tls")}))
    same_host = (isinstance(subject, dict) and isinstance(reference, dict)
                 and (subject.get("facts") or {}).get("hostname") == (reference.get("facts") or {}).get("hostname"))
    ref_why = staged_why(reference) if same_host and reference.get("role") == "scheduler" else None
    if ref_why is not None:
        out.append(Finding(
            "warning", "staged-through-host",
            f"the scheduler, on the same host: {ref_why}: every GPU result a client gathers through it and every "
            "GPU argument of submit is staged through host memory over TCP; fix: unset UCX_TLS for the "
            "scheduler or add cuda_ipc to it", details={"ucx_tls": reference.get("ucx_tls")}))
    return out

"""Transport helpers shared by the transport plugins (tcp, nvlink, infiniband) and rmm.

Re-exported by :mod:`gpudask.pluginapi`; plugins import them from there.  This module
holds the rules that more than one plugin must apply the same way:

* the one ``UCX_TLS`` parser (:func:`parse_ucx_tls`) and what a value lets UCX use
  (:func:`tls_enables`), so the infiniband and rmm plugins agree on a user's value;
* distributed-ucxx's own test for a CUDA context (:func:`ucxx_creates_cuda_context`);
* which GPU a process uses and which workers share it (:func:`process_gpu`,
  :func:`workers_sharing_gpu`): the round-robin rule of gpu-pinning, written once;
* how an explicit setting wins over detection (:func:`decide`), the transport mode.

The keys named here (``gpudask.transport.mode`` ...) are declared by the tcp plugin;
with that plugin disabled the helpers fall back to the defaults.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudask.facts import GPU, Facts
    from gpudask.plan.context import PlanContext
    from gpudask.plan.model import ProcessPlan

MODE = "gpudask.transport.mode"
INTERFACE = "gpudask.transport.interface"
AUTO, EXPLICIT, UCX_AUTO = "auto", "explicit", "ucx-auto"
# processes that move GPU data: workers, a client, and the scheduler, which relays every
# result a client gathers through it and every GPU argument of submit (distributed's default
# distributed.client.direct-to-workers: null); the nanny host never does
GPU_ROLES = ("worker", "client", "scheduler")

# What each UCX_TLS name (ucx_info -c / UCX docs) lets UCX use, in the transports gpudask
# reasons about: "rc" stands for InfiniBand whatever the verbs flavour (rc or dc).
_MEANS: dict[str, frozenset[str]] = {
    "all": frozenset({"tcp", "cuda_copy", "cuda_ipc", "rc"}),
    "cuda": frozenset({"cuda_copy", "cuda_ipc"}),
    "ib": frozenset({"rc"}),
    "rc": frozenset({"rc"}), "rc_v": frozenset({"rc"}), "rc_x": frozenset({"rc"}),
    "rc_verbs": frozenset({"rc"}), "rc_mlx5": frozenset({"rc"}),
    "dc": frozenset({"rc"}), "dc_x": frozenset({"rc"}), "dc_mlx5": frozenset({"rc"}),
}


# -- UCX_TLS -------------------------------------------------------------------------
def parse_ucx_tls(value: str | None) -> list[str]:
    """``" TCP, cuda_copy"`` -> ``["tcp", "cuda_copy"]``: names lower-cased, order kept.

    A leading ``^`` (UCX: every transport *but* these) stays on the first name as given:
    ``"^cuda,tcp"`` -> ``["^cuda", "tcp"]``.  ``None`` or ``""`` -> ``[]``.
    """
    return [name.strip().lower() for name in (value or "").split(",") if name.strip()]


def tls_enables(tls: str | None, transport: str) -> bool:
    """Does a UCX_TLS value let UCX use ``transport`` (tcp, cuda_copy, cuda_ipc, rc)?

    Aliases are expanded (``cuda``, ``ib``, ``all``; ``rc_mlx5``, ``dc``... mean InfiniBand,
    written ``rc``), a leading ``^`` negates the list.  An unset or empty UCX_TLS lets UCX
    choose among everything.
    """
    names = parse_ucx_tls(tls)
    if not names:
        return True
    negate = names[0].startswith("^")
    if negate:
        names[0] = names[0][1:]
    named = any(transport in _MEANS.get(n.rstrip("\\"), frozenset({n.rstrip("\\")})) for n in names)
    return named != negate


def ucxx_creates_cuda_context(tls: str | None) -> bool:
    """distributed-ucxx's own test (``init_once``) on UCX_TLS: a name containing ``cuda``
    and no ``^cuda``.  Not UCX's meaning of the value: what distributed-ucxx will do."""
    names = parse_ucx_tls(tls)
    return any("cuda" in n for n in names) and not any(n.startswith("^cuda") for n in names)


# Every name UCX_TLS accepts whatever the host (UCX's aliases and transport names, UCX
# 1.12-1.18 docs and ``ucx_info -c``): a name not here must be one this host's UCX lists
# (facts.ucx_transports) to be accepted.
UCX_TLS_NAMES = frozenset({
    "all", "sm", "shm", "mm", "posix", "sysv", "xpmem", "cma", "knem", "self", "tcp",
    "ib", "rc", "rc_v", "rc_verbs", "rc_x", "rc_mlx5", "ud", "ud_v", "ud_verbs", "ud_x", "ud_mlx5",
    "dc", "dc_x", "dc_mlx5", "srd", "ugni", "ugni_rdma", "ugni_udt", "ugni_smsg",
    "cuda", "cuda_copy", "cuda_ipc", "gdr_copy", "rocm", "rocm_copy", "rocm_ipc", "rocm_gdr",
    "ze_copy", "ze_ipc", "ze_gdr", "sockcm", "rdmacm", "cuda_ipc_cache",
})


def check_user_tls(value: str | None, host_transports: list[str] | None) -> None:
    """Refuse, in one line, a UCX_TLS that UCX cannot start with: set but empty (UCX then
    has no transport: ``UCXXNoElemError``), or naming transports neither UCX's aliases nor
    this host's UCX (``host_transports``, when known) have.

    :raises ConfigError:
    """
    from gpudask.errors import ConfigError

    if value is None:
        return
    if not value.strip():
        raise ConfigError("UCX_TLS is set but empty: UCX then has no transport and ucx:// cannot start "
                          "(UCXXNoElemError); accepted: unset it (gpudask chooses) or a comma-separated list of "
                          "transports, e.g. UCX_TLS=tcp")
    known = set(UCX_TLS_NAMES) | {t.lower() for t in host_transports or []}
    names = parse_ucx_tls(value)
    if names and names[0].startswith("^"):
        names[0] = names[0][1:]
    bad = [n for n in names if n.split(":", 1)[0].rstrip("\\") not in known]
    if bad:
        offered = (f"this host's UCX offers {', '.join(sorted(host_transports))}; "
                   if host_transports else "")
        raise ConfigError(f"UCX_TLS={value!r:.200} names unknown transport(s) {', '.join(repr(b) for b in bad)}; "
                          f"accepted: {offered}UCX's names {', '.join(sorted(UCX_TLS_NAMES))}, comma-separated "
                          "(a leading ^ excludes)")


def user_tls(ctx: PlanContext) -> str | None:
    """UCX_TLS as the user exported it (None when unset)."""
    return ctx.user_env.get("UCX_TLS") or None


def ucx_supports(facts: Facts, transport: str) -> bool | None:
    """Whether this host's UCX lists ``transport`` (``rc`` matches rc_verbs/rc_mlx5); None when unknown."""
    if facts.ucx_transports is None:
        return None
    return any(t == transport or t.startswith(transport + "_") for t in facts.ucx_transports)


# -- which GPU, shared by whom -----------------------------------------------------------
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
        return first, (f"the scheduler relays GPU results and arguments between clients and workers (received "
                       f"into device buffers over UCX) on device 0 of its visible GPUs, GPU {first.index}")
    return first, (f"worker {plan.index} has no GPU of its own (gpu-pinning not loaded): CUDA device 0 is "
                   f"GPU {first.index}")


def workers_sharing_gpu(ctx: PlanContext, plan: ProcessPlan) -> list[int]:
    """Numbers of this host's workers that use the GPU ``plan``'s process uses.

    Worker ``j`` uses visible unit ``j mod len(units)`` (gpu-pinning's round-robin), where
    a unit is a GPU or, on a GPU in MIG mode, one of its MIG instances; a worker without a
    GPU of its own (gpu-pinning not loaded) uses CUDA device 0 like every other one.
    [] for processes without a GPU.
    """
    gpu, _ = process_gpu(ctx, plan)
    if gpu is None:
        return []
    if plan.role == "worker" and plan.gpu_index is None:
        return list(range(ctx.nworkers))  # unpinned: every worker uses CUDA device 0
    units: list[tuple[str | None, int]] = []
    for g in ctx.gpus:
        instances = (g.mig.get("instances") or []) if g.mig.get("enabled") else []
        units += [(i.get("uuid"), g.index) for i in instances] or [(g.uuid, g.index)]
    uuids = [u for u, _ in units]
    if plan.role == "worker" and plan.gpu in uuids:
        position = uuids.index(plan.gpu)
        return [j for j in range(ctx.nworkers) if j % len(units) == position]
    return [j for j in range(ctx.nworkers) if units[j % len(units)][1] == gpu.index]


# -- explicit settings win -----------------------------------------------------------------
def parse_name_or_list(value: Any) -> str | list[str] | None:
    """null/"auto" (detect), one name for every process, or a list (worker i gets item i mod length)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto", "none", "null")):
        return None
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v.strip() for v in value):
        return [v.strip() for v in value]
    raise ValueError("null (auto), a name, or a non-empty list of names (worker i takes item i mod length)")


def pick(value: str | list[str], index: int | None) -> str:
    """One item of a name-or-list setting for worker ``index``."""
    if isinstance(value, list):
        return value[(index or 0) % len(value)]
    return value


def mode(ctx: PlanContext) -> str:
    s = ctx.setting(MODE)
    return str(s.value) if s is not None else AUTO


def mode_why(ctx: PlanContext) -> str:
    s = ctx.setting(MODE)
    return f"{MODE}={mode(ctx)}" + (f" (from {s.source})" if s is not None and s.explicit else "")


def decide(ctx: PlanContext, key: str, transport: str, detected: bool, detect_why: str,
           implied_by: tuple[str, ...] = ()) -> tuple[bool, str, bool]:
    """Whether to use ``transport``: (on, why, explicit).  Explicit settings win over detection:
    UCX_TLS in the environment, then the option ``key`` (or its legacy keys), then mode explicit
    (where ``transport`` is on only if one of the ``implied_by`` options is true, as in
    distributed-ucxx: nvlink and infiniband imply tcp, nvlink implies cuda-copy)."""
    tls = user_tls(ctx)
    if tls is not None:
        on = tls_enables(tls, transport)
        return on, (f"UCX_TLS={tls} set in the environment {'names' if on else 'leaves out'} {transport} "
                    f"(explicit settings win; detection: {detect_why})"), True
    s = ctx.setting(key)
    if s is not None and s.value is not None:
        return bool(s.value), (f"{key}={s.value} (from {s.source}): explicit settings win "
                               f"(detection: {detect_why})"), True
    if mode(ctx) == EXPLICIT:
        for other in implied_by:
            o = ctx.setting(other)
            if o is not None and o.value is True:
                return True, f"{mode_why(ctx)}: implied by {other}=True (from {o.source})", True
        return False, f"{mode_why(ctx)} and {key} not set (detection: {detect_why})", True
    return detected, detect_why, False


def set_flag(plan: ProcessPlan, flag: str, value: bool, why: str) -> None:
    """distributed-ucxx.<flag>, so distributed-ucxx's own view of the transports agrees with UCX_TLS."""
    plan.set_config(f"distributed-ucxx.{flag}", value, why)

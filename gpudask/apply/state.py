"""Proof of effect: after setup each server process reads its *applied state* (the keys its
plan decides, the CUDA context NVML sees, ucxx's configuration, each plugin's
``gpudask_applied_state``); each difference from the plan is a *mismatch* (process, key,
planned, actual, plugin), reported by the scheduler check and ``gpudask status``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from gpudask import session as process_state

logger = logging.getLogger("distributed.gpudask")


def plugin_of(plan: Any, decision_prefix: str) -> str | None:
    """The plugin that made ``plan``'s first decision starting with ``decision_prefix``
    (``"UCX_TLS="``, ``"memory:"``), or None."""
    return next((r.plugin for r in plan.reasons if r.decision.startswith(decision_prefix)), None)


def read(session: Any) -> dict[str, Any]:
    """The live state of this process for the keys its plan decides."""
    import dask.config

    plan, ctx = session.plan, session.ctx
    out: dict[str, Any] = {
        "pid": os.getpid(),
        "env": {name: os.environ.get(name) for name in plan.env},
        "config": {key: dask.config.get(key, default=None) for key in plan.config},
        "multiprocessing_method": dask.config.get("distributed.worker.multiprocessing-method", default=None),
    }
    if hasattr(os, "sched_getaffinity"):
        out["cpu_affinity"] = sorted(os.sched_getaffinity(0))
    if not ctx.facts.described and ctx.gpus:
        out["cuda_context"] = cuda_context()
    ucx = _ucx_config()
    if ucx is not None:
        out["ucx"] = ucx
    # what this process paid for at start: a worker that read its host plan bootstrapped nothing
    out["startup"] = process_state.current().startup_counts()
    plugins = session.manager.applied_state(ctx, plan)
    if plugins:
        out["plugins"] = plugins
    return out


def cuda_context() -> dict[str, Any]:
    """Does this process hold a CUDA context, and on which GPU (NVML: creates none)."""
    try:
        from distributed.diagnostics.nvml import has_cuda_context

        found = has_cuda_context()
    except Exception as e:  # noqa: BLE001 - NVML missing or failing: say so, never fail
        return {"exists": None, "error": f"{type(e).__name__}: {e}"}
    info = getattr(found, "device_info", None)
    uuid = getattr(info, "uuid", None)
    if isinstance(uuid, bytes):
        uuid = uuid.decode()
    return {"exists": bool(getattr(found, "has_context", False)), "uuid": uuid}


def _ucx_config() -> dict[str, str] | None:
    """ucxx's effective configuration, once UCX is initialised in this process."""
    module = sys.modules.get("distributed_ucxx.ucxx")
    ucxx = getattr(module, "ucxx", None) if module is not None else None
    if ucxx is None:
        return None
    try:
        config = ucxx.get_config()
    except Exception as e:  # noqa: BLE001 - older ucxx: no get_config
        return {"error": f"{type(e).__name__}: {e}"}
    return {str(k): str(v) for k, v in dict(config).items()}


def find_mismatches(session: Any, live: dict[str, Any]) -> list[dict[str, Any]]:
    """Every planned value the live process (``live``, from :func:`read`) does not have."""
    plan, ctx = session.plan, session.ctx
    who = plan.role + (f" {plan.index}" if plan.index is not None else "")
    out: list[dict[str, Any]] = []

    def differs(key: str, planned: Any, actual: Any, plugin: str | None) -> None:
        out.append({"process": who, "key": key, "planned": planned, "actual": actual, "plugin": plugin})

    for kind, planned in (("env", plan.env), ("config", plan.config)):
        for key, value in planned.items():
            if live[kind].get(key) != value:
                differs(key, value, live[kind].get(key), plugin_of(plan, f"{key}="))
    if plan.multiprocessing_method and live["multiprocessing_method"] != plan.multiprocessing_method:
        differs("multiprocessing_method", plan.multiprocessing_method, live["multiprocessing_method"],
                plugin_of(plan, "multiprocessing_method="))
    if plan.cpu_affinity and plan.role == "worker" and not ctx.facts.described and "cpu_affinity" in live:
        wanted = set(plan.cpu_affinity) & set(live["cpu_affinity"]) or set(plan.cpu_affinity)
        if not set(live["cpu_affinity"]) <= wanted:
            differs("cpu_affinity", plan.cpu_affinity, live["cpu_affinity"], plugin_of(plan, "cpu_affinity="))
    context = live.get("cuda_context") or {}
    if plan.gpu and context.get("exists") and context.get("uuid") and context["uuid"] != plan.gpu:
        differs("cuda_context", plan.gpu, context["uuid"], plugin_of(plan, "CUDA_VISIBLE_DEVICES="))
    ucx = live.get("ucx") or {}
    planned_tls = plan.env.get("UCX_TLS")
    if planned_tls and ucx.get("TLS") and ucx["TLS"] != planned_tls:
        differs("ucx TLS", planned_tls, ucx["TLS"], plugin_of(plan, "UCX_TLS="))
    for plugin, items in (live.get("plugins") or {}).items():
        for key, pair in items.items():
            if pair.get("planned") != pair.get("actual"):
                differs(key, pair.get("planned"), pair.get("actual"), plugin)
    return out


def record(session: Any) -> None:
    """Read the live state, compare it with the plan, keep both on the session."""
    session.state = read(session)
    session.mismatches = find_mismatches(session, session.state)
    from gpudask.checks.published import MAX_MISMATCHES, shown

    for m in session.mismatches[:MAX_MISMATCHES]:
        logger.error("gpudask: %s: %s is %s, planned %s (plugin %s): the plan did not take effect",
                     m["process"], m["key"], shown(m["actual"]), shown(m["planned"]), m["plugin"] or "gpudask")
    if len(session.mismatches) > MAX_MISMATCHES:
        logger.error("gpudask: ... and %d more planned value(s) not in effect",
                     len(session.mismatches) - MAX_MISMATCHES)

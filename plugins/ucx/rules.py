"""The rules the transport plugins (tcp, nvlink, infiniband) share: an explicit setting wins over
detection (:func:`decide`), the transport mode, name-or-list settings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import parse_ucx_tls, tls_enables

if TYPE_CHECKING:
    from gpudask.pluginapi import PlanContext, ProcessPlan

MODE = "gpudask.transport.mode"
INTERFACE = "gpudask.transport.interface"
AUTO, EXPLICIT, UCX_AUTO = "auto", "explicit", "ucx-auto"


def user_tls(ctx: PlanContext) -> str | None:
    return ctx.user_env.get("UCX_TLS") or None


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
    """(on, why, explicit) for ``transport``: UCX_TLS in the environment wins, then the option ``key``, then
    mode explicit (on only if one of ``implied_by`` is true, as in distributed-ucxx); else detection."""
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
    plan.set_config(f"distributed-ucxx.{flag}", value, why)


def offer(plan: ProcessPlan, transport: str, on: bool, why: str) -> None:
    """``transport`` in UCX_TLS or, with the reason, not."""
    if on:
        plan.add_ucx_transport(transport, why)
    else:
        plan.note(f"no UCX transport {transport}", why)


def set_tls_flag(plan: ProcessPlan, flag: str, transport: str, on: bool) -> None:
    set_flag(plan, flag, on, f"{transport} in UCX_TLS" if on else f"no {transport} in UCX_TLS")


# -- apply: a described host --------------------------------------------------------------
def without(tls: str | None, names: frozenset[str], alias: str) -> str | None:
    """``UCX_TLS`` with none of ``names`` (``alias``: UCX's name for all of them), as close to ``tls`` as
    UCX's syntax allows (``all`` -> ``^cuda``, ``^rc`` -> ``^rc,cuda``); None: nothing to change."""
    given = parse_ucx_tls(tls)
    if not given:
        return None  # unset: UCX chooses among what this machine has
    if given[0].startswith("^"):
        excluded = [given[0][1:], *given[1:]]
        return None if alias in excluded else "^" + ",".join([*excluded, alias])
    if given == ["all"]:
        return f"^{alias}"
    kept = [n for n in given if n.rstrip("\\") not in names and n != alias]
    if kept == given:
        return None
    return ",".join(kept or ["tcp"])


def leave_out_on_described_host(ctx: PlanContext, plan: ProcessPlan, what: str, names: frozenset[str], alias: str,
                                env: tuple[str, ...], flags: tuple[str, ...]) -> None:
    """On a described host (``GPUDASK_FACTS``) UCX here starts without ``what`` -- the transports ``names``,
    the variables ``env``, the distributed-ucxx ``flags`` -- which this machine does not have (UCX would
    not start); the plan says so.  ``gpudask info --facts`` shows the described host's plan, unchanged."""
    if not ctx.uses_ucx or not ctx.facts.described:
        return
    import os

    import dask.config

    planned = os.environ.get("UCX_TLS")
    live = without(planned, names, alias)
    present = [name for name in env if name in os.environ]
    keys = [f"{prefix}.{flag}" for flag in flags for prefix in ("distributed-ucxx", "distributed.comm.ucx")]
    true = [key for key in keys if dask.config.get(key, default=None) is True]
    if live is None and not present and not true:
        return
    why = (f"the host is described ({ctx.facts.origin}), its {what} is not this machine's: UCX here starts "
           f"without it (planned for the described host: " + ", ".join(
               [f"UCX_TLS={planned}"] * (live is not None) + [f"{n}={os.environ[n]}" for n in present]
               + [f"{k}=True" for k in true]) + ")")
    if live is not None:
        os.environ["UCX_TLS"] = live
        plan.set_env("UCX_TLS", live, why)
        for transport in [t for t in plan.ucx_transports if t in names]:
            plan.ucx_transports.remove(transport)  # the plan's transports agree with UCX_TLS above
    for name in present:
        del os.environ[name]
        plan.env.pop(name, None)
    if true:
        dask.config.set({key: False for key in true})
        plan.config.update({key: False for key in true if key in plan.config})  # re-applied in dask_setup
    plan.note(f"no {what} in UCX here", why)

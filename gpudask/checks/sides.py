"""The comparison itself, pure: each process is a *side*, a worker's from what it published
(:func:`side_from_published`, validated, never unpickled), the scheduler's and the client's from
their own facts (:func:`local_side`); the ``gpudask_scheduler_check`` hooks compare them."""

from __future__ import annotations

import os
from typing import Any

from gpudask._version import __version__
from gpudask.checks import published as bounds
from gpudask.errors import FactsError, GpudaskError
from gpudask import session as process_state
from gpudask.findings import SEVERITIES, Finding, MalformedData, fingerprint, json_safe
from gpudask.plan.published import PUBLISHED_KEY  # what a worker's gpudask puts in its startup information

ACTIONS = ("warn", "error", "refuse")
ACTION_KEY = "gpudask.scheduler-check.action"
PLUGIN_NAME = "gpudask-check"  # the SchedulerPlugin's name in scheduler.plugins
EVENT_TOPIC = "gpudask"  # client.get_events("gpudask") / client.subscribe_topic("gpudask", ...)
CLIENT_WARN_TOPIC = "warn"  # distributed's clients turn events of this topic into warnings
EXTRA_KEY = "gpudask-check"  # WorkerState.extra key -> scheduler_info()["workers"][addr]
HANDLER = "gpudask_check"  # scheduler RPC handler returning the report

_ABSENT = object()


def scheme(address: object) -> str | None:
    """``"ucx"`` for ``"ucx://10.0.0.1:8786"``; None for anything without a scheme."""
    if not isinstance(address, str) or "://" not in address:
        return None
    from distributed.comm.addressing import parse_address

    return parse_address(address)[0]


def local_side(facts: Any, role: str, address: str | None, protocol: str | None) -> dict[str, Any]:
    # the plan this process applied (the apply stage's session: checks does not import apply)
    plan = getattr(process_state.current().applied, "plan", None)
    left = _left_out_here({"plan": plan.to_dict()}) if plan is not None else []
    return {"role": role, "address": address, "facts": facts.to_dict(), "protocol": protocol,
            "gpudask": __version__, "facts_origin": facts.origin, "ucx_tls": os.environ.get("UCX_TLS"),
            "memory": None, "left_out_here": left}


def side_from_published(published: Any, role: str, address: str | None) -> dict[str, Any]:
    """The hook's view of what a process published under ``"gpudask"``, validated where the
    check reads it: the facts and three strings (``gpudask status`` reads the rest itself).

    :raises ValueError: with a one-line reason when the data is malformed.
    """
    if not isinstance(published, dict):
        raise ValueError(f"expected an object, got {type(published).__name__}")
    if "facts" not in published:
        raise ValueError("no 'facts' in it")
    facts = _valid_facts(published["facts"], role)  # first: its reason is the one to read
    data = _json_safe({key: published.get(key) for key in ("version", "protocol", "facts_origin")})
    for key in ("version", "protocol", "facts_origin"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError(f"{key!r} must be a string, got {type(data[key]).__name__}")
    return {"role": role, "address": address, "facts": facts, "protocol": data.get("protocol"),
            "gpudask": data.get("version"), "facts_origin": data.get("facts_origin"),
            "ucx_tls": _planned_ucx_tls(published), "left_out_here": _left_out_here(published),
            "memory": bounds.bound(published["memory"]) if isinstance(published.get("memory"), dict) else None}


def _left_out_here(published: dict[str, Any]) -> list[str]:
    """What the process left out of UCX because its host is described and this machine lacks
    it (``no GPU in UCX here``, ``no InfiniBand in UCX here``: plugins.ucx.rules): its UCX_TLS
    is then gpudask's own reduction for the CPU it runs on, not a user's choice to check."""
    plan = published.get("plan")
    reasons = plan.get("reasons") if isinstance(plan, dict) else None
    if not isinstance(reasons, list):
        return []
    return sorted({r["decision"] for r in reasons if isinstance(r, dict) and isinstance(r.get("decision"), str)
                   and r["decision"].startswith("no ") and r["decision"].endswith(" in UCX here")})


def _planned_ucx_tls(published: dict[str, Any]) -> str | None:
    """UCX_TLS of the publishing process's plan (applied before listen(); a value that did not
    take effect is its own not-applied finding); None when not a bounded string."""
    plan = published.get("plan")
    env = plan.get("env") if isinstance(plan, dict) else None
    value = env.get("UCX_TLS") if isinstance(env, dict) else None
    return bounds.truncate(value, 1000) if isinstance(value, str) else None


def _valid_facts(published: Any, role: str) -> dict[str, Any]:
    """Published facts, validated once per distinct data: the workers of a host (of a cluster,
    often) publish the same facts, and validating them was most of the scheduler's cost per
    joining worker.  The sides share the dict (read-only); 64 hosts' facts are kept."""
    from gpudask.facts import facts_from_dict

    def validated() -> dict[str, Any]:
        try:
            return facts_from_dict(_json_safe(published), f"facts of the {role}").to_dict()
        except FactsError as e:
            raise ValueError(str(e)) from None

    return process_state.remembered("valid published facts", fingerprint(published), validated)


def _json_safe(data: Any) -> Any:
    try:
        return json_safe(data)
    except MalformedData as e:
        raise ValueError(f"not JSON-compatible data ({e})") from None


def run_hooks(manager: Any, ctx: Any, reference: dict[str, Any], other: dict[str, Any] | None,
              subject: str, reference_name: str) -> list[Finding]:
    """Call every plugin's ``gpudask_scheduler_check``; a failing plugin becomes a finding."""
    try:
        results = manager.scheduler_check(ctx, reference, other)
    except Exception as e:  # noqa: BLE001 - e.g. a plugin returned something that is not a Finding
        ours = isinstance(e, GpudaskError)
        return [Finding("warning", "plugin-failed",
                        f"the check could not finish: {e if ours else f'{type(e).__name__}: {e}'}",
                        plugin=(ours and getattr(e, "plugin", None)) or "gpudask", subject=subject,
                        reference=reference_name)]
    findings = []
    for item in results:
        if isinstance(item, dict):
            try:
                item = Finding.from_dict(item)
            except ValueError:
                item = None
        if not isinstance(item, Finding):
            findings.append(Finding("warning", "plugin-failed",
                                    f"a plugin returned {type(item).__name__}, not a gpudask Finding",
                                    plugin=getattr(item, "plugin", None) or "gpudask"))
        else:
            findings.append(item)
    for f in findings:
        f.subject = f.subject or subject
        f.reference = f.reference or reference_name
    return findings


def evaluate_worker(manager: Any, ctx: Any, scheduler_side: dict[str, Any], address: str,
                    extra: Any) -> tuple[list[Finding], dict[str, Any] | None]:
    """Findings for one worker, from its ``WorkerState.extra``; never raises."""
    published = extra.get(PUBLISHED_KEY, _ABSENT) if isinstance(extra, dict) else _ABSENT
    findings: list[Finding] = []
    side = None
    if published is _ABSENT:
        findings.append(Finding(
            "warning", "no-gpudask",
            "the worker does not run gpudask (nothing under 'gpudask' in its startup information), so its GPU, "
            "driver, CUDA and packages cannot be compared with the scheduler's; start it with --preload gpudask",
            plugin="gpudask"))
    else:
        try:
            side = side_from_published(published, "worker", address)
        except ValueError as e:
            findings.append(Finding(
                "warning", "malformed-facts",
                f"the worker published malformed gpudask data ({e}); it cannot be compared with the scheduler",
                plugin="gpudask"))
        else:
            side["protocol"] = scheme(address) or side["protocol"]
            findings += version_differs(scheduler_side, side)
        findings += not_applied(published)
    findings += run_hooks(manager, ctx, scheduler_side, side, address, "scheduler")
    for f in findings:
        f.subject, f.reference = f.subject or address, f.reference or "scheduler"
    return findings, side


def version_differs(scheduler_side: dict[str, Any], side: dict[str, Any]) -> list[Finding]:
    """A warning when the worker runs another gpudask version than the scheduler: each plans and
    publishes as its own version does, so the comparison may miss or invent differences."""
    mine, theirs = scheduler_side.get("gpudask"), side.get("gpudask")
    if not isinstance(mine, str) or not isinstance(theirs, str) or mine == theirs:
        return []
    return [Finding("warning", "gpudask-version",
                    f"the worker runs gpudask {bounds.truncate(theirs, 60)}, the scheduler gpudask "
                    f"{bounds.truncate(mine, 60)}: each plans and publishes as its own version does; install one "
                    "gpudask version on every host", plugin="gpudask",
                    details={"worker": bounds.truncate(theirs, 60), "scheduler": bounds.truncate(mine, 60)})]


def not_applied(published: Any) -> list[Finding]:
    """An error for each planned value the worker's process does not have (its applied state,
    gpudask.apply.state), at most ``MAX_MISMATCHES``, the rest counted in one more."""
    first, more, malformed = bounds.mismatches(published)
    out = []
    for m in first:
        out.append(Finding(
            "error", "not-applied",
            f"{bounds.truncate(str(m.get('process')), 100)}: {bounds.truncate(str(m.get('key')), 200)} is "
            f"{bounds.shown(m.get('actual'))}, planned {bounds.shown(m.get('planned'))}: the plan "
            "did not take effect (something changed it after gpudask, or could not apply it)",
            plugin=bounds.truncate(str(m.get("plugin") or "gpudask"), 100)))
    if more:
        out.append(Finding("error", "not-applied",
                           f"... and {more} more planned value(s) not in effect (only the first "
                           f"{bounds.MAX_MISMATCHES} are listed)", plugin="gpudask", details={"more": more}))
    if malformed:
        out.append(Finding("warning", "malformed-facts",
                           f"the worker published {malformed} mismatch item(s) that are not objects; they are ignored",
                           plugin="gpudask", details={"malformed": malformed}))
    return out


def read_action(ctx: Any, override: str | None = None) -> str:
    """The check's policy: ``override``, else the setting (``warn`` when unreadable)."""
    if override is not None:
        return override
    settings: Any = getattr(ctx, "settings", None)
    try:
        return str(settings[ACTION_KEY])
    except (KeyError, TypeError, GpudaskError):
        import dask.config

        value = dask.config.get(ACTION_KEY, default="warn")
        return value if value in ACTIONS else "warn"


def dedupe(findings: list[Finding]) -> list[Finding]:
    """The client compared with N workers says the same thing N times: say it once."""
    merged: dict[tuple[Any, ...], Finding] = {}
    for f in findings:
        key = (f.plugin, f.code, f.severity, f.message, f.subject)
        if key in merged:
            m = merged[key]
            m.reference = f"{m.reference}, {f.reference}"
        else:
            merged[key] = f
    return list(merged.values())


def describe(side: dict[str, Any] | None) -> str:
    """One line on a side, for the scheduler log."""
    if not side:
        return "unknown"
    facts = side.get("facts") or {}
    gpus = facts.get("gpus") or []
    origin = side.get("facts_origin")
    where = f"facts described by {origin}" if origin and origin != "probed" else "probed facts"
    visible = _visible_count(facts)
    shown = f"{len(gpus)} GPU(s)" if visible in (None, len(gpus)) else f"{visible} of {len(gpus)} GPU(s) visible"
    return (f"protocol {side.get('protocol')}, {shown}, driver {facts.get('driver_version') or 'none'}, "
            f"{where}")


def _visible_count(facts: dict[str, Any]) -> int | None:
    """GPUs CUDA shows the process (CUDA_VISIBLE_DEVICES applied); None if unreadable."""
    from gpudask.facts import facts_from_dict

    try:
        return len(facts_from_dict(facts, "published").visible_gpus())
    except (FactsError, TypeError, ValueError, AttributeError):
        return None


def summary(side: dict[str, Any] | None, address: str | None) -> dict[str, Any]:
    """What a report shows of a side."""
    if not side:
        return {"address": address}
    facts = side.get("facts") or {}
    return {"address": address, "protocol": side.get("protocol"), "gpudask": side.get("gpudask"),
            "facts_origin": side.get("facts_origin"), "hostname": facts.get("hostname"),
            "gpus": [g.get("name") for g in facts.get("gpus") or [] if isinstance(g, dict)],
            "driver_version": facts.get("driver_version"), "cuda_driver_version": facts.get("cuda_driver_version")}


"""``gpudask.check(client)`` and ``gpudask check``: the scheduler's report, plus this client
compared with the scheduler and each worker (it deserialises what it gathers)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from distributed import get_client

from gpudask.checks.runner import plan_here, report_on_scheduler
from gpudask.checks.sides import dedupe, local_side, run_hooks, scheme, side_from_published, summary
from gpudask.errors import GpudaskError
from gpudask.findings import SEVERITIES, Finding, worst
from gpudask.plan import cpu_ranges
from gpudask.printable import printable
from gpudask.textwidth import wrap_text

def _fetch_scheduler_report(client: Any) -> dict[str, Any]:
    try:
        return client.run_on_scheduler(report_on_scheduler)
    except Exception as first:  # noqa: BLE001
        # pickled functions refused (distributed.scheduler.pickle: false)? the handler
        # of an installed check needs no pickle
        try:
            return client.sync(client.scheduler.gpudask_check, sides=True)
        except Exception:  # noqa: BLE001
            raise first from None


def run_check(client: Any = None, extra_plugins: Iterable[Any] = (),
              here: tuple[Any, Any, Any] | None = None) -> dict[str, Any]:
    """The report of the scheduler check, this client compared too; ``report["status"]``: ``"ok"``,
    ``"info"``, ``"warning"`` or ``"error"``.  ``extra_plugins``: plugin objects whose checks run
    here too; ``here``: ``(manager, ctx, facts)`` of this process (default: :func:`plan_here`)."""
    if client is None:
        client = get_client()
    try:
        remote = _fetch_scheduler_report(client)
    except Exception as e:  # noqa: BLE001 - e.g. gpudask not installed on the scheduler
        remote = {"installed": False, "action": None, "scheduler": {"address": client.scheduler.address},
                  "problem": f"the scheduler could not run gpudask's check ({type(e).__name__}: {e}); "
                             f"is gpudask installed there?", "workers": {}, "refused": {}, "findings": [],
                  "sides": {"scheduler": None, "workers": {}}}
    return with_client(remote, client.scheduler.address, here, extra_plugins)


def with_client(remote: dict[str, Any], scheduler_address: str, here: tuple[Any, Any, Any] | None = None,
                extra_plugins: Iterable[Any] = ()) -> dict[str, Any]:
    """The scheduler's report (``remote``, with its ``sides``) completed with this client's comparisons."""
    findings: list[Finding] = []
    sides = remote.pop("sides", None) or {}
    if remote.get("problem"):
        findings.append(Finding("error", "check-unavailable", remote["problem"], plugin="gpudask",
                                subject="scheduler"))
    protocol = scheme(scheduler_address)
    mine: list[Finding] = []
    try:
        manager, ctx, facts = here if here is not None else plan_here(protocol, extra_plugins)
    except GpudaskError as e:  # e.g. a $GPUDASK_FACTS that cannot run this protocol
        manager = ctx = facts = None
        mine.append(Finding("warning", "check-unavailable",
                            f"this client could not be compared: gpudask cannot plan here ({e})",
                            plugin="gpudask", subject="client"))
    me = local_side(facts, "client", None, protocol) if facts is not None else None
    raw = sides.get("scheduler")
    scheduler_side = None
    if isinstance(raw, dict):
        try:
            scheduler_side = dict(side_from_published(
                {"facts": raw.get("facts"), "protocol": raw.get("protocol"), "version": raw.get("gpudask"),
                 "facts_origin": raw.get("facts_origin")}, "scheduler", raw.get("address")))
            scheduler_side["ucx_tls"] = raw["ucx_tls"] if isinstance(raw.get("ucx_tls"), str) else None
        except ValueError:
            pass
    if me is not None and scheduler_side is not None:
        mine += run_hooks(manager, ctx, scheduler_side, me, "client", "scheduler")
    per_worker: list[Finding] = []
    for address, side in sorted((sides.get("workers") or {}).items()):
        if me is not None and isinstance(side, dict):
            per_worker += run_hooks(manager, ctx, side, me, "client", address)
    mine += dedupe(per_worker)
    report = dict(remote)
    report["client"] = {"summary": summary(me, None), "status": worst(mine), "findings": [f.to_dict() for f in mine]}
    all_findings = [f.to_dict() for f in findings] + list(remote.get("findings") or []) + report["client"]["findings"]
    report["findings"] = all_findings
    report["status"] = worst(all_findings)
    report["counts"] = {sev: sum(f.get("severity") == sev for f in all_findings) for sev in SEVERITIES}
    return report


check = run_check  # gpudask.check(client)


def format_report(report: dict[str, Any], table: Callable[[list[str], list[list[Any]]], str],
                  width: int | None = -1) -> str:
    """``gpudask check`` without ``--json``; prose wrapped to ``width`` (-1: the terminal's)."""
    sched = report.get("scheduler") or {}
    gpus = sched.get("gpus")
    origin = sched.get("facts_origin")
    installed = (f"check installed, action {report.get('action')}" if report.get("installed")
                 else "check not installed (one-off report)")
    # what the scheduler and its workers said is escaped: a newline of theirs is text, never
    # a line of the report (the table escapes its cells)
    lines = [wrap_text(printable(f"scheduler {sched.get('address')}: protocol {sched.get('protocol')}, "
                                 f"{len(gpus) if isinstance(gpus, list) else '?'} GPU(s), driver "
                                 f"{sched.get('driver_version') or 'none'}"
                                 + (f", facts from {origin}" if origin not in (None, "probed") else "")
                                 + f"; {installed}"), width)]
    workers = report.get("workers") or {}
    numbers = {address: n for n, address in enumerate(workers)}
    if workers:
        rows = [[numbers[a], a, "yes" if w.get("gpudask") else "no", w.get("status"), len(w.get("findings") or [])]
                for a, w in workers.items()]
        lines += ["", table(["#", "worker", "gpudask", "status", "findings"], rows)]
    else:
        lines.append("no workers connected")
    lines += [wrap_text(printable(f"refused: {address}"), width) for address in report.get("refused") or {}]
    for where, found in _grouped_findings(report.get("findings") or [], numbers).items():
        lines += ["", wrap_text(printable(f"{where}:"), width)]
        for f in found:
            lines.append(wrap_text(printable(f"  {f['severity']}: [{f.get('plugin') or 'gpudask'}] {f.get('message')}"),
                                   width, indent="    "))
    counts = report.get("counts") or {}
    lines += ["", f"{counts.get('error', 0)} error(s), {counts.get('warning', 0)} warning(s), "
                  f"{counts.get('info', 0)} info: {report.get('status')}"]
    return "\n".join(lines)


_SIDES = ("scheduler", "client")


def _without_side(f: dict[str, Any]) -> tuple[Any, ...]:
    """A finding's key with its non-worker side's name (scheduler or client) blanked in its
    details: the same for both when it is the same check with the same values.  Different
    codes stay apart: the client lacking a GPU has other consequences than the scheduler."""
    details = f.get("details") if isinstance(f.get("details"), dict) else {}
    side = next((s for s in _SIDES if s in (f.get("subject"), f.get("reference"))), None)

    def blank(value: Any) -> Any:
        return "#" if value == side else value

    try:
        shown = json.dumps({blank(k): blank(v) for k, v in details.items()}, sort_keys=True, default=str)
    except TypeError:
        shown = repr(details)
    return f.get("severity"), f.get("plugin"), f.get("code"), shown


def _grouped_findings(findings: list[dict[str, Any]], numbers: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Findings under a line naming their processes: the same message once for all that have
    it, one the client shares with the scheduler (:func:`_without_side`) once; worst first."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for f in findings:
        key = (f.get("severity"), f.get("plugin"), f.get("code"), f.get("message"))
        entry = merged.setdefault(key, {**f, "subjects": [], "references": []})
        for field, names in (("subject", entry["subjects"]), ("reference", entry["references"])):
            for name in str(f.get(field) or "-").split(", "):
                if name not in names:
                    names.append(name)
    entries = list(merged.values())
    against_scheduler = {(_without_side(e), tuple(sorted(e["subjects"]))): e for e in entries
                         if e["references"] == ["scheduler"]}
    kept = []
    for e in entries:
        twin = against_scheduler.get((_without_side(e), tuple(sorted(e["references"]))))
        if e["subjects"] == ["client"] and twin is not None:
            twin["client_too"] = True  # the client against the same workers: the same finding
            continue
        kept.append(e)
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in kept:
        where = f"{_processes(e['subjects'], numbers)} against {_processes(e['references'], numbers)}"
        if e.get("client_too"):
            where += ", and against the client (the same values)"
        groups.setdefault(where, []).append(e)
    for found in groups.values():
        found.sort(key=lambda f: -SEVERITIES.index(f.get("severity", "info")))
    return dict(sorted(groups.items(), key=lambda g: -max(SEVERITIES.index(f.get("severity", "info"))
                                                          for f in g[1])))


def _processes(names: list[str], numbers: dict[str, int]) -> str:
    """Workers by their number in the table (``workers 0,2``, ``every worker (3)``), others by role."""
    known = sorted(numbers[n] for n in names if n in numbers)
    named = [f"the {n}" if n in _SIDES else n for n in names if n not in numbers]
    if known:
        if len(known) == len(numbers) > 1:
            named.append(f"every worker ({len(numbers)})")
        else:
            named.append(("workers " if len(known) > 1 else "worker ") + cpu_ranges(known))
    return ", ".join(named)

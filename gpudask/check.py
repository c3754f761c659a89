"""The scheduler check: does the scheduler (and the client) match the workers?

The scheduler sometimes deserialises data and, over UCX, receives GPU frames it
relays, so it needs what the workers have (DESIGN §1).  This module is the *runner*
of the ``gpudask_scheduler_check`` hook; what is compared is up to the plugins (the
built-in one is ``scheduler-parity``).  The core knows no plugin by name.

* :class:`SchedulerCheck` -- a ``SchedulerPlugin``.  Installed by a plugin's
  ``gpudask_preload`` in a ``dask scheduler --preload gpudask`` process (see
  :func:`install`), or registered by a client on a running cluster
  (``client.register_plugin(gpudask.check.SchedulerCheck())``); then it also checks the
  workers already connected.  Each worker is compared with the scheduler from the data
  its gpudask published in its startup information (``WorkerState.extra["gpudask"]``):
  plain JSON-compatible data, validated here and never unpickled.
* Findings go to the scheduler log, to dask's event log (topic ``"gpudask"``), to the
  worker's entry of ``client.scheduler_info()["workers"][addr]["gpudask-check"]`` and to
  the ``gpudask_check`` handler.  ``gpudask.scheduler-check.action`` decides what else
  happens: ``warn`` nothing more; ``error`` also warns every connected client (a
  ``"warn"`` event, which distributed's clients turn into a ``UserWarning``);
  ``refuse`` also closes the offending worker with the finding as reason.
* :func:`check` (``gpudask.check(client)``) and :func:`check_cli` (``gpudask check``)
  fetch the scheduler's report and add the client's own comparison with the scheduler
  and the workers.

``gpudask.check`` is this module *and* callable: ``gpudask.check(client)`` runs
:func:`check`, ``gpudask.check.SchedulerCheck`` is the plugin class.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from gpudask.errors import GpudaskError
from gpudask.findings import SEVERITIES, Finding, worst

logger = logging.getLogger("gpudask.check")

ACTIONS = ("warn", "error", "refuse")
ACTION_KEY = "gpudask.scheduler-check.action"
PLUGIN_NAME = "gpudask-check"  # the SchedulerPlugin's name in scheduler.plugins
EVENT_TOPIC = "gpudask"  # client.get_events("gpudask") / client.subscribe_topic("gpudask", ...)
CLIENT_WARN_TOPIC = "warn"  # distributed's clients turn events of this topic into warnings
EXTRA_KEY = "gpudask-check"  # WorkerState.extra key -> scheduler_info()["workers"][addr]
HANDLER = "gpudask_check"  # scheduler RPC handler returning the report
PUBLISHED_KEY = "gpudask"  # what a worker's gpudask puts in its startup information

# Limits on what a worker may publish: anything beyond is "malformed", never a crash.
_MAX_DEPTH = 12
_MAX_ITEMS = 20000
_MAX_STR = 4096


# ------------------------------------------------------------------- untrusted data
class _Malformed(ValueError):
    pass


def _json_safe(value: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    """A copy of ``value`` made of dict/list/str/int/float/bool/None only, or _Malformed."""
    budget = budget if budget is not None else [_MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0:
        raise _Malformed("too large")
    if depth > _MAX_DEPTH:
        raise _Malformed("nested too deeply")
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Malformed(f"non-finite number {value!r}")
        return value
    if isinstance(value, str):
        if len(value) > _MAX_STR:
            raise _Malformed(f"a string of {len(value)} characters")
        return value
    if isinstance(value, (list, tuple)):
        return [_json_safe(v, depth + 1, budget) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _Malformed(f"a non-string key {type(k).__name__}")
            out[k] = _json_safe(v, depth + 1, budget)
        return out
    raise _Malformed(f"a value of type {type(value).__name__}")


def _json_copy(value: Any) -> Any:
    """JSON-compatible copy for reports; anything else becomes its repr."""
    try:
        return _json_safe(value)
    except _Malformed:
        return json.loads(json.dumps(value, default=repr))


def side_from_published(published: Any, role: str, address: str | None) -> dict[str, Any]:
    """Validate what a process published under ``"gpudask"`` and return the hook's view
    of it: ``{"role", "address", "facts", "protocol", "gpudask", "facts_origin"}``.

    :raises ValueError: with a one-line reason when the data is malformed.
    """
    from gpudask.errors import FactsError
    from gpudask.facts import facts_from_dict

    try:
        data = _json_safe(published)
    except _Malformed as e:
        raise ValueError(f"not JSON-compatible data ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"expected an object, got {type(data).__name__}")
    if "facts" not in data:
        raise ValueError("no 'facts' in it")
    try:
        facts = facts_from_dict(data["facts"], f"facts of the {role}")
    except FactsError as e:
        raise ValueError(str(e)) from None
    for key in ("version", "protocol", "facts_origin"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError(f"{key!r} must be a string, got {type(data[key]).__name__}")
    return {"role": role, "address": address, "facts": facts.to_dict(), "protocol": data.get("protocol"),
            "gpudask": data.get("version"), "facts_origin": data.get("facts_origin")}


def _scheme(address: str | None) -> str | None:
    return address.split("://", 1)[0] if isinstance(address, str) and "://" in address else None


def _session_side(session: Any, role: str, address: str | None, protocol: str | None) -> dict[str, Any]:
    from gpudask import __version__

    facts = session.host.facts
    return {"role": role, "address": address, "facts": facts.to_dict(), "protocol": protocol or session.host.protocol,
            "gpudask": __version__, "facts_origin": facts.origin}


# -------------------------------------------------------------------------- evaluation
def run_hooks(manager: Any, ctx: Any, reference: dict[str, Any], other: dict[str, Any] | None,
              subject: str, reference_name: str) -> list[Finding]:
    """Call every plugin's ``gpudask_scheduler_check``; a failing plugin becomes a finding."""
    try:
        results = manager.scheduler_check(ctx, reference, other)
    except GpudaskError as e:
        return [Finding("warning", "plugin-failed", f"the check could not finish: {e}",
                        plugin=getattr(e, "plugin", None) or "gpudask", subject=subject, reference=reference_name)]
    except Exception as e:  # noqa: BLE001 - e.g. a plugin returned something that is not a Finding
        return [Finding("warning", "plugin-failed", f"the check could not finish: {type(e).__name__}: {e}",
                        plugin="gpudask", subject=subject, reference=reference_name)]
    findings = []
    for item in results:
        if isinstance(item, dict):
            try:
                item = Finding.from_dict(item)
            except ValueError:
                item = None
        if not isinstance(item, Finding):
            findings.append(Finding("warning", "plugin-failed",
                                    f"a plugin returned {type(item).__name__}, not a gpudask.check.Finding",
                                    plugin=getattr(item, "plugin", None) or "gpudask"))
            continue
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
            side["protocol"] = _scheme(address) or side["protocol"]
    findings += run_hooks(manager, ctx, scheduler_side, side, address, "scheduler")
    for f in findings:
        f.subject, f.reference = f.subject or address, f.reference or "scheduler"
    return findings, side


_ABSENT = object()


def _read_action(ctx: Any, override: str | None = None) -> str:
    if override is not None:
        return override
    settings = getattr(ctx, "settings", None)
    try:
        return str(settings[ACTION_KEY])
    except (KeyError, TypeError, GpudaskError):
        import dask.config

        value = dask.config.get(ACTION_KEY, default="warn")
        return value if value in ACTIONS else "warn"


# -------------------------------------------------------------------- scheduler side
class SchedulerCheck(SchedulerPlugin):
    """Compares each worker with the scheduler (runs the ``gpudask_scheduler_check`` hook).

    :param action: ``"warn"``, ``"error"`` or ``"refuse"``; default: the scheduler's
        ``gpudask.scheduler-check.action``.
    :param extra_plugins: gpudask plugin objects to add to the scheduler's (they travel
        pickled when a client registers this plugin; their module must be importable on
        the scheduler).
    """

    name = PLUGIN_NAME
    idempotent = True  # registering it again (e.g. on a preloaded scheduler) is a no-op

    def __init__(self, action: str | None = None, extra_plugins: Iterable[Any] = (), *, dry: bool = False):
        if action is not None and action not in ACTIONS:
            raise GpudaskError(f"{ACTION_KEY}: {action!r} is not valid; accepted: {' | '.join(ACTIONS)}")
        self.action_override = action
        self.extra_plugins = list(extra_plugins)
        self.dry = dry  # evaluate only: no log, events, changes or actions (a one-off report)
        self._reset()

    def _reset(self) -> None:
        self.scheduler: Any = None
        self.manager: Any = None
        self.ctx: Any = None
        self.side: dict[str, Any] | None = None
        self.action = self.action_override or "warn"
        self.problem: str | None = None
        self.results: dict[str, dict[str, Any]] = {}
        self.sides: dict[str, dict[str, Any] | None] = {}
        self.refused: dict[str, dict[str, Any]] = {}
        self._started = False

    def __getstate__(self) -> dict[str, Any]:
        return {"action_override": self.action_override, "extra_plugins": self.extra_plugins, "dry": self.dry}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.action_override = state.get("action_override")
        self.extra_plugins = list(state.get("extra_plugins") or ())
        self.dry = bool(state.get("dry"))
        self._reset()

    # -- setting up ------------------------------------------------------------------
    def _prepare_from_session(self, scheduler: Any) -> bool:
        """Use the scheduler's own gpudask session (``--preload gpudask``) when there is one."""
        from gpudask import session

        s = session.current()
        if self.extra_plugins or s is None or s.role != "scheduler":
            return False
        self._use(scheduler, s.manager, s.ctx, _session_side(s, "scheduler", scheduler.address,
                                                            _scheme(scheduler.address)))
        return True

    def _plan_here(self, protocol: str | None) -> Any:
        """Plan without applying (no gpudask preloaded here, or extra plugins)."""
        from gpudask.session import Session, plan_host

        host = plan_host(protocol, extra_plugins=self.extra_plugins)
        return Session("scheduler", host, host.for_role("scheduler"))

    def _use(self, scheduler: Any, manager: Any, ctx: Any, side: dict[str, Any]) -> None:
        self.scheduler, self.manager, self.ctx, self.side = scheduler, manager, ctx, side
        self.action = _read_action(ctx, self.action_override)

    async def _prepare(self, scheduler: Any) -> None:
        if self.manager is not None or self._prepare_from_session(scheduler):
            return
        self.scheduler = scheduler
        try:
            # probing the host (NVML, ucx_info) must not block the scheduler's event loop
            s = await asyncio.to_thread(self._plan_here, _scheme(scheduler.address))
        except GpudaskError as e:
            self.problem = f"gpudask cannot plan on the scheduler, so nothing is checked: {e}"
            if not self.dry:
                logger.error("gpudask check: %s", self.problem)
                scheduler.log_event(EVENT_TOPIC, {"action": "scheduler-check-unavailable", "reason": self.problem})
            return
        self._use(scheduler, s.manager, s.ctx, _session_side(s, "scheduler", scheduler.address,
                                                            _scheme(scheduler.address)))

    async def start(self, scheduler: Any) -> None:
        if self._started:
            return  # installed on a running scheduler: whoever calls start() first wins
        self._started = True
        if not self.dry:
            from gpudask.preload import _ensure_log_handler

            _ensure_log_handler()
            scheduler.handlers[HANDLER] = self.handle_report
        await self._prepare(scheduler)
        if self.manager is None:
            return
        if not self.dry:
            logger.info("gpudask check: scheduler %s (%s) checks its workers; action %s", scheduler.address,
                        _describe(self.side), self.action)
        for address in list(scheduler.workers):
            self.check_worker(address)

    def add_worker(self, scheduler: Any, worker: str) -> None:
        if self.manager is None:
            # added by a preload, with a worker joining before start(): the session exists
            if not self._prepare_from_session(scheduler):
                return  # start() checks it once the plan is ready
        self.check_worker(worker)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self.results.pop(worker, None)
        self.sides.pop(worker, None)

    async def close(self) -> None:
        if self.scheduler is not None and self.scheduler.handlers.get(HANDLER) == self.handle_report:
            del self.scheduler.handlers[HANDLER]

    # -- checking --------------------------------------------------------------------
    def check_worker(self, address: str) -> list[Finding]:
        """Compare one connected worker with the scheduler and act on the findings."""
        ws = self.scheduler.workers.get(address)
        if ws is None or self.manager is None:
            return []
        findings, side = evaluate_worker(self.manager, self.ctx, self.side, address, ws.extra)
        status = worst(findings)
        result = {"status": status, "gpudask": side is not None, "findings": [f.to_dict() for f in findings]}
        self.results[address] = result
        self.sides[address] = side
        if self.dry:
            return findings
        try:
            ws.extra[EXTRA_KEY] = {"status": status, "action": self.action, "findings": result["findings"]}
        except TypeError:  # pragma: no cover - extra is always a dict in distributed
            pass
        for f in findings:
            level = {"error": logging.ERROR, "warning": logging.WARNING}.get(f.severity, logging.INFO)
            logger.log(level, "gpudask check: %s", f.line())
        if not findings:
            logger.info("gpudask check: worker %s matches the scheduler", address)
        self.scheduler.log_event(EVENT_TOPIC, {"action": "scheduler-check", "worker": address, "status": status,
                                               "policy": self.action, "findings": result["findings"]})
        problems = [f for f in findings if f.severity in ("warning", "error")]
        if problems and self.action == "error":
            # one warning per worker in every connected client (distributed's default "warn" handler)
            self.scheduler.log_event(CLIENT_WARN_TOPIC, "gpudask scheduler check: "
                                     + "\n".join(f.line() for f in problems))
        if problems and self.action == "refuse":
            self._refuse(address, problems)
        return findings

    def _refuse(self, address: str, problems: list[Finding]) -> None:
        reason = "gpudask scheduler check refused this worker: " + "; ".join(
            f"{f.severity}: [{f.plugin or 'gpudask'}] {f.message}" for f in problems)
        logger.error("gpudask check: closing worker %s: %s", address, reason)
        self.refused[address] = {"reason": reason, "findings": [f.to_dict() for f in problems]}
        self.scheduler.log_event(EVENT_TOPIC, {"action": "refuse-worker", "worker": address, "reason": reason})
        # The worker's stream may not be started yet (we run inside Scheduler.add_worker):
        # BatchedSend keeps the message until it is; the worker then closes itself (and
        # tells its nanny not to restart it) with this reason and unregisters.
        self.scheduler.worker_send(address, {"op": "close", "reason": reason})

    # -- reporting -------------------------------------------------------------------
    def report(self, sides: bool = False) -> dict[str, Any]:
        findings = [f for r in self.results.values() for f in r["findings"]]
        findings += [f for address, r in self.refused.items() if address not in self.results for f in r["findings"]]
        out = {
            "installed": not self.dry,
            "action": self.action,
            "scheduler": _summary(self.side, self.scheduler.address if self.scheduler is not None else None),
            "problem": self.problem,
            "workers": {a: dict(r) for a, r in sorted(self.results.items())},
            "refused": dict(self.refused),
            "findings": findings,
            "status": worst(findings) if self.problem is None else "error",
        }
        if sides:
            out["sides"] = {"scheduler": self.side, "workers": dict(self.sides)}
        return out

    def handle_report(self, sides: bool = False) -> dict[str, Any]:
        return self.report(sides=bool(sides))


def _describe(side: dict[str, Any] | None) -> str:
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
    from gpudask.errors import FactsError
    from gpudask.facts import facts_from_dict

    try:
        return len(facts_from_dict(facts, "published").visible_gpus())
    except (FactsError, TypeError, ValueError, AttributeError):
        return None


def _summary(side: dict[str, Any] | None, address: str | None) -> dict[str, Any]:
    if not side:
        return {"address": address}
    facts = side.get("facts") or {}
    return {"address": address, "protocol": side.get("protocol"), "gpudask": side.get("gpudask"),
            "facts_origin": side.get("facts_origin"), "hostname": facts.get("hostname"),
            "gpus": [g.get("name") for g in facts.get("gpus") or [] if isinstance(g, dict)],
            "driver_version": facts.get("driver_version"), "cuda_driver_version": facts.get("cuda_driver_version")}


def install(scheduler: Any, action: str | None = None) -> SchedulerCheck:
    """Add the check to a scheduler (idempotent).  For a plugin's ``gpudask_preload``."""
    existing = scheduler.plugins.get(PLUGIN_NAME)
    if isinstance(existing, SchedulerCheck):
        return existing
    from distributed.core import Status

    plugin = SchedulerCheck(action=action)
    scheduler.add_plugin(plugin, name=PLUGIN_NAME, idempotent=True)
    if scheduler.status == Status.running:
        # a running scheduler (the preload hook run by a plugin registered later): nobody
        # else may call start(), which also checks the connected workers; start() runs once
        scheduler.loop.add_callback(plugin.start, scheduler)
    # else at dask_setup time: Scheduler.start_unsafe calls plugin.start() right after
    return plugin


async def _report_on_scheduler(dask_scheduler: Any = None) -> dict[str, Any]:
    """Run on the scheduler by :func:`check`: the installed check's report, or a one-off
    evaluation (nothing logged, changed or enforced) when none is installed."""
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, SchedulerCheck):
        plugin = SchedulerCheck(dry=True)
        await plugin.start(dask_scheduler)
    return plugin.report(sides=True)


# ------------------------------------------------------------------------ client side
def _fetch_scheduler_report(client: Any) -> dict[str, Any]:
    try:
        return client.run_on_scheduler(_report_on_scheduler)
    except Exception as first:  # noqa: BLE001
        # pickled functions refused (distributed.scheduler.pickle: false)? the handler
        # of an installed check needs no pickle
        try:
            return client.sync(client.scheduler.gpudask_check, sides=True)
        except Exception:  # noqa: BLE001
            raise first from None


def _client_session(client: Any, protocol: str | None, extra_plugins: list[Any]) -> Any:
    from gpudask import session

    s = session.current()
    if s is not None and s.role == "client" and not extra_plugins:
        return s
    host = session.plan_host(protocol, extra_plugins=extra_plugins)
    return session.Session("client", host, host.for_role("client"))


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """The client compared with N workers says the same thing N times: say it once."""
    merged: dict[tuple, Finding] = {}
    for f in findings:
        key = (f.plugin, f.code, f.severity, f.message, f.subject)
        if key in merged:
            m = merged[key]
            m.reference = f"{m.reference}, {f.reference}"
        else:
            merged[key] = f
    return list(merged.values())


def run_check(client: Any = None, extra_plugins: Iterable[Any] = ()) -> dict[str, Any]:
    """The report of the scheduler check, with this client compared too.

    Fetches the scheduler's report (the installed :class:`SchedulerCheck`'s, or a
    one-off evaluation when none is installed) and adds the comparison of this process
    (facts probed here, or ``$GPUDASK_FACTS``) with the scheduler and with each worker.
    ``report["status"]`` is ``"ok"``, ``"info"``, ``"warning"`` or ``"error"``.
    """
    if client is None:
        from distributed import get_client

        client = get_client()
    extra_plugins = list(extra_plugins)
    findings: list[Finding] = []
    try:
        remote = _fetch_scheduler_report(client)
    except Exception as e:  # noqa: BLE001 - e.g. gpudask not installed on the scheduler
        remote = {"installed": False, "action": None, "scheduler": {"address": client.scheduler.address},
                  "problem": f"the scheduler could not run gpudask's check ({type(e).__name__}: {e}); "
                             f"is gpudask installed there?", "workers": {}, "refused": {}, "findings": [],
                  "sides": {"scheduler": None, "workers": {}}}
    sides = remote.pop("sides", None) or {}
    if remote.get("problem"):
        findings.append(Finding("error", "check-unavailable", remote["problem"], plugin="gpudask",
                                subject="scheduler"))
    protocol = _scheme(client.scheduler.address)
    mine: list[Finding] = []
    try:
        s = _client_session(client, protocol, extra_plugins)
    except GpudaskError as e:  # e.g. a $GPUDASK_FACTS that cannot run this protocol
        s = None
        mine.append(Finding("warning", "check-unavailable",
                            f"this client could not be compared: gpudask cannot plan here ({e})",
                            plugin="gpudask", subject="client"))
    me = _session_side(s, "client", None, protocol) if s is not None else None
    scheduler_side = sides.get("scheduler")
    if isinstance(scheduler_side, dict):
        try:
            scheduler_side = dict(side_from_published(
                {"facts": scheduler_side.get("facts"), "protocol": scheduler_side.get("protocol"),
                 "version": scheduler_side.get("gpudask"), "facts_origin": scheduler_side.get("facts_origin")},
                "scheduler", scheduler_side.get("address")))
        except ValueError:
            scheduler_side = None
    if s is not None and isinstance(scheduler_side, dict):
        mine += run_hooks(s.manager, s.ctx, scheduler_side, me, "client", "scheduler")
    per_worker: list[Finding] = []
    for address, side in sorted((sides.get("workers") or {}).items()):
        if s is not None and isinstance(side, dict):
            per_worker += run_hooks(s.manager, s.ctx, side, me, "client", address)
    mine += _dedupe(per_worker)
    report = dict(remote)
    report["client"] = {"summary": _summary(me, None), "status": worst(mine), "findings": [f.to_dict() for f in mine]}
    all_findings = [f.to_dict() for f in findings] + list(remote.get("findings") or []) + report["client"]["findings"]
    report["findings"] = all_findings
    report["status"] = worst(all_findings)
    report["counts"] = {sev: sum(f.get("severity") == sev for f in all_findings) for sev in SEVERITIES}
    return report


def format_report(report: dict[str, Any]) -> str:
    """The readable form of a report (``gpudask check`` without ``--json``)."""
    from gpudask.report import table

    sched = report.get("scheduler") or {}
    gpus = sched.get("gpus")
    origin = sched.get("facts_origin")
    check = (f"check installed, action {report.get('action')}" if report.get("installed")
             else "check not installed (one-off report)")
    lines = [f"scheduler {sched.get('address')}: protocol {sched.get('protocol')}, "
             f"{len(gpus) if isinstance(gpus, list) else '?'} GPU(s), driver {sched.get('driver_version') or 'none'}"
             + (f", facts from {origin}" if origin not in (None, "probed") else "") + f"; {check}"]
    workers = report.get("workers") or {}
    if workers:
        rows = [[a, "yes" if w.get("gpudask") else "no", w.get("status"), len(w.get("findings") or [])]
                for a, w in workers.items()]
        lines += ["", table(["worker", "gpudask", "status", "findings"], rows)]
    else:
        lines.append("no workers connected")
    lines += [f"refused: {address}" for address in report.get("refused") or {}]
    findings = sorted(report.get("findings") or [], key=lambda f: -SEVERITIES.index(f.get("severity", "info")))
    lines.append("")
    if findings:
        rows = [[f.get("severity"), f.get("subject") or "-", f.get("reference") or "-", f.get("plugin") or "gpudask",
                 f.get("message")] for f in findings]
        lines += [table(["severity", "process", "compared with", "plugin", "finding"], rows), ""]
    counts = report.get("counts") or {}
    lines.append(f"{counts.get('error', 0)} error(s), {counts.get('warning', 0)} warning(s), "
                 f"{counts.get('info', 0)} info: {report.get('status')}")
    return "\n".join(lines)


def check_cli(address: str | None, scheduler_file: str | None, as_json: bool, timeout: float,
              echo: Callable[..., Any]) -> int:
    """``gpudask check``: 0 when no error-level finding, 1 when there is one, 2 when the
    scheduler cannot be reached."""
    from distributed import Client

    if not address and not scheduler_file:
        echo("gpudask: error: give the scheduler's ADDRESS or --scheduler-file", err=True)
        return 2
    try:
        client = Client(address, scheduler_file=scheduler_file, timeout=timeout, set_as_default=False)
    except Exception as e:  # noqa: BLE001 - OSError, TimeoutError ...
        echo(f"gpudask: error: cannot connect to the scheduler {address or scheduler_file}: {e}", err=True)
        return 2
    try:
        report = run_check(client)
    finally:
        client.close()
    echo(json.dumps(report, indent=1, default=str) if as_json else format_report(report))
    return 1 if report["status"] == "error" else 0


# ``gpudask.check(client)`` and ``gpudask.check.SchedulerCheck`` both work: the module
# is callable, and its ``check`` attribute (what ``gpudask.check`` resolves to lazily)
# is the module itself.
class _CallableModule(types.ModuleType):
    def __call__(self, client: Any = None, extra_plugins: Iterable[Any] = ()) -> dict[str, Any]:
        return run_check(client, extra_plugins)


sys.modules[__name__].__class__ = _CallableModule
check = sys.modules[__name__]

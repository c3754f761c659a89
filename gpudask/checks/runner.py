"""The scheduler check runner: a ``SchedulerPlugin`` comparing each worker with the scheduler,
installed by the apply stage (:func:`install`) or registered by a client (docs/scheduler-check.md).
Each comparison runs in a thread (:mod:`gpudask.checks.jobs`); ``add_worker`` waits for it at most
:data:`INLINE_WAIT_S`, not at all once a check was slow.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from gpudask.checks.jobs import DEFAULT_TIMEOUT_S, POOL, Job, read_timeout, slow_finding, timeout_finding
from gpudask.checks.published import bound_published
from gpudask.checks.sides import (ACTION_KEY, ACTIONS, CLIENT_WARN_TOPIC, EVENT_TOPIC, EXTRA_KEY, HANDLER,
                                  PLUGIN_NAME, PUBLISHED_KEY, describe, evaluate_worker, local_side, read_action,
                                  scheme, summary)
from gpudask.errors import GpudaskError
from gpudask.findings import Finding, worst
from gpudask.plaindata import exception_text
from gpudask.printable import printable

logger = logging.getLogger("distributed.gpudask.check")

INLINE_WAIT_S = 0.5  # the most add_worker waits for a worker's check, on the event loop
# findings about the scheduler's own plugins, never a reason to refuse a worker
NOT_THE_WORKERS = ("check-timeout", "slow-check")


def plan_here(protocol: str | None, extra_plugins: Iterable[Any] = ()) -> tuple[Any, Any, Any]:
    """``(manager, ctx, facts)`` of this process where gpudask applied no plan (a client, a
    scheduler without gpudask); GpudaskError when gpudask cannot plan here."""
    from gpudask.bootstrap import plan_host

    # the whole plan is built so that a host gpudask cannot plan for is reported as such
    host = plan_host(protocol, extra_plugins=extra_plugins)
    return host.ctx.manager, host.ctx, host.facts


class SchedulerCheck(SchedulerPlugin):
    """Compares each worker with the scheduler (runs the ``gpudask_scheduler_check`` hook).

    :param action: ``"warn"``, ``"error"`` or ``"refuse"``; default: the scheduler's
        ``gpudask.scheduler-check.action``.
    :param extra_plugins: gpudask plugin objects to add to the scheduler's (they travel
        pickled when a client registers this plugin; their module must be importable on
        the scheduler).
    :param dry: evaluate only: no log, events, changes or actions (a one-off report).
    """

    name = PLUGIN_NAME
    idempotent = True  # registering it again (e.g. on a scheduler started with gpudask) is a no-op

    def __init__(self, action: str | None = None, extra_plugins: Iterable[Any] = (), *, dry: bool = False):
        if action is not None and action not in ACTIONS:
            raise GpudaskError(f"{ACTION_KEY}: {action!r} is not valid; accepted: {' | '.join(ACTIONS)}")
        self.action_override = action
        self.extra_plugins = list(extra_plugins)
        self.dry = dry
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
        self.says_ok = False
        self._started = False
        self.asked_for = False
        self.timeout = DEFAULT_TIMEOUT_S
        self.slow_seen = False  # a check took longer than the timeout: add_worker no longer waits at all
        self.jobs: dict[str, Job] = {}  # the latest check of each worker
        self._tasks: set[Any] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {"action_override": self.action_override, "extra_plugins": self.extra_plugins, "dry": self.dry}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.action_override = state.get("action_override")
        self.extra_plugins = list(state.get("extra_plugins") or ())
        self.dry = bool(state.get("dry"))
        self._reset()

    def use(self, scheduler: Any, manager: Any, ctx: Any, side: dict[str, Any]) -> None:
        self.scheduler, self.manager, self.ctx, self.side = scheduler, manager, ctx, side
        self.action = read_action(ctx, self.action_override)
        self.timeout = read_timeout(ctx)
        # a CPU host over tcp: nothing of gpudask's to say at INFO (read once, not per worker)
        self.says_ok = bool(ctx.gpus or ctx.uses_ucx)

    async def start(self, scheduler: Any) -> None:
        if self._started:
            return  # installed on a running scheduler: whoever calls start() first wins
        self._started = True
        if not self.dry:
            scheduler.handlers[HANDLER] = self.handle_report
        # installed by gpudask with the scheduler's own plan, or registered by a client (asked for)
        self.asked_for = self.manager is None
        if self.asked_for:
            self.scheduler = scheduler
            protocol = scheme(scheduler.address)
            try:
                # probing the host (NVML, ucx_info) must not block the scheduler's event loop
                manager, ctx, facts = await asyncio.to_thread(plan_here, protocol, self.extra_plugins)
            except GpudaskError as e:
                self.problem = f"gpudask cannot plan on the scheduler, so nothing is checked: {e}"
                if not self.dry:
                    logger.error("gpudask check: %s", printable(self.problem))
                    scheduler.log_event(EVENT_TOPIC, {"action": "scheduler-check-unavailable",
                                                      "reason": self.problem})
                return
            if self.manager is None:  # install() may have given them meanwhile
                self.use(scheduler, manager, ctx, local_side(facts, "scheduler", scheduler.address, protocol))
        if not self.dry:
            level = logging.INFO if self.says_ok or self.asked_for else logging.DEBUG
            logger.log(level, "gpudask check: scheduler %s (%s) checks its workers; action %s", scheduler.address,
                       describe(self.side), self.action)
        for address in list(scheduler.workers):
            self.check_worker(address)
        if self.dry:
            await self.settled()

    def add_worker(self, scheduler: Any, worker: str) -> None:
        if self.manager is None:
            return  # start() checks it once the comparison is prepared
        self.check_worker(worker)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self.results.pop(worker, None)
        self.sides.pop(worker, None)
        job = self.jobs.pop(worker, None)
        if job is not None:
            job.recorded.set()

    async def close(self) -> None:
        if self.scheduler is not None and self.scheduler.handlers.get(HANDLER) == self.handle_report:
            del self.scheduler.handlers[HANDLER]

    def check_worker(self, address: str) -> list[Finding] | None:
        """Compare one connected worker with the scheduler and act on the findings; they are
        returned when the thread ended within :data:`INLINE_WAIT_S`, else None (recorded later)."""
        ws = self.scheduler.workers.get(address) if self.scheduler is not None else None
        if ws is None or self.manager is None or self.side is None:
            return []
        if not self.dry and isinstance(ws.extra, dict) and PUBLISHED_KEY in ws.extra:
            # everything that reads it later (/gpudask, gpudask status) gets it bounded
            ws.extra[PUBLISHED_KEY] = bound_published(ws.extra[PUBLISHED_KEY])
        job = Job(address, ws)
        self.jobs[address] = job
        job.future = POOL.submit(self._evaluate, job)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop (a test, a thread): wait here, bounded
            wait = self.timeout
        else:
            wait = 0.0 if self.slow_seen else min(INLINE_WAIT_S, self.timeout)
        if wait > 0 or job.future.done():
            try:
                findings, side = job.future.result(timeout=wait)
            except concurrent.futures.TimeoutError:
                pass
            else:
                return self._record(job, findings, side)
        try:
            task = asyncio.ensure_future(self._finish_later(job))
        except RuntimeError:
            self._record(job, [timeout_finding(job, self.timeout, self.manager)], None)
            job.future.add_done_callback(lambda f: self._late(job, f))
            return None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return None

    def _evaluate(self, job: Job) -> tuple[list[Finding], dict[str, Any] | None]:
        job.thread = threading.get_ident()
        try:
            return evaluate_worker(self.manager, self.ctx, self.side or {}, job.address, job.ws.extra)
        except BaseException as e:  # noqa: BLE001 - evaluate_worker never raises; whatever it would is
            # text here, in the thread: an exception handed to the event loop would be raised there
            return [Finding("warning", "plugin-failed", f"the check could not finish: {exception_text(e)}",
                            plugin="gpudask", subject=job.address, reference="scheduler")], None

    async def _finish_later(self, job: Job) -> None:
        assert job.future is not None
        wrapped = asyncio.wrap_future(job.future)
        remaining = max(0.0, self.timeout - (time.monotonic() - job.submitted))
        try:
            findings, side = await asyncio.wait_for(asyncio.shield(wrapped), remaining)
        except asyncio.TimeoutError:
            self.slow_seen = True
            self._record(job, [timeout_finding(job, self.timeout, self.manager)], None)
            await asyncio.wait([wrapped])
            self._late(job, wrapped)
        else:
            self._record(job, findings, side)

    def _late(self, job: Job, future: Any) -> None:
        try:
            findings, side = future.result()
        except Exception:  # noqa: BLE001 - the executor shut down
            return
        self._record(job, findings + [slow_finding(job, self.timeout)], side)

    def _record(self, job: Job, findings: list[Finding], side: dict[str, Any] | None) -> list[Finding]:
        """Record and act on one worker's findings (on the event loop), unless the worker
        left or was checked again meanwhile."""
        for f in findings:
            if f.code == "check-timeout" and f.plugin != "gpudask":
                job.slow_plugin = f.plugin
        current = self.scheduler.workers.get(job.address) if self.scheduler is not None else None
        if current is not job.ws or self.jobs.get(job.address) is not job:
            job.recorded.set()
            return findings
        status = worst(findings)
        result = {"status": status, "gpudask": side is not None, "findings": [f.to_dict() for f in findings]}
        self.results[job.address] = result
        self.sides[job.address] = side
        job.recorded.set()
        if self.dry:
            return findings
        address, ws = job.address, job.ws
        ws.extra[EXTRA_KEY] = {"status": status, "action": self.action, "findings": result["findings"]}
        for f in findings:
            level = {"error": logging.ERROR, "warning": logging.WARNING}.get(f.severity, logging.INFO)
            logger.log(level, "gpudask check: %s", f.line())
        if not findings:
            level = logging.INFO if self.says_ok else logging.DEBUG
            logger.log(level, "gpudask check: worker %s matches the scheduler", printable(address))
        self.scheduler.log_event(EVENT_TOPIC, {"action": "scheduler-check", "worker": address, "status": status,
                                               "policy": self.action, "findings": result["findings"]})
        problems = [f for f in findings if f.severity in ("warning", "error")]
        if problems and self.action == "error":
            # one warning per worker in every connected client (distributed's default "warn" handler)
            self.scheduler.log_event(CLIENT_WARN_TOPIC, "gpudask scheduler check: "
                                     + "\n".join(f.line() for f in problems))
        refusing = [f for f in problems if f.code not in NOT_THE_WORKERS]
        if refusing and self.action == "refuse":
            self._refuse(address, refusing)
        return findings

    async def settled(self) -> None:
        """Wait (off the loop) until every worker's latest check has its findings or its check-timeout."""
        pending = [job.recorded for job in self.jobs.values() if not job.recorded.is_set()]
        if pending:
            deadline = self.timeout + 1.0
            await asyncio.to_thread(lambda: [e.wait(deadline) for e in pending])

    def _refuse(self, address: str, problems: list[Finding]) -> None:
        reason = "gpudask scheduler check refused this worker: " + "; ".join(
            f"{f.severity}: [{printable(f.plugin or 'gpudask')}] {printable(f.message)}" for f in problems)
        logger.error("gpudask check: closing worker %s: %s", printable(address), reason)
        self.refused[address] = {"reason": reason, "findings": [f.to_dict() for f in problems]}
        self.scheduler.log_event(EVENT_TOPIC, {"action": "refuse-worker", "worker": address, "reason": reason})
        # The worker's stream may not be started yet (we run inside Scheduler.add_worker):
        # BatchedSend keeps the message until it is; the worker then closes itself (and
        # tells its nanny not to restart it) with this reason and unregisters.
        self.scheduler.worker_send(address, {"op": "close", "reason": reason})

    def report(self, sides: bool = False) -> dict[str, Any]:
        findings = [f for r in self.results.values() for f in r["findings"]]
        findings += [f for address, r in self.refused.items() if address not in self.results for f in r["findings"]]
        out = {
            "installed": not self.dry,
            "action": self.action,
            "scheduler": summary(self.side, self.scheduler.address if self.scheduler is not None else None),
            "problem": self.problem,
            "workers": {a: dict(r) for a, r in sorted(self.results.items())},
            "refused": dict(self.refused),
            "findings": findings,
            "status": worst(findings) if self.problem is None else "error",
        }
        if sides:
            out["sides"] = {"scheduler": self.side, "workers": dict(self.sides)}
        return out

    handle_report = report  # the scheduler's HANDLER


def install(scheduler: Any, manager: Any, ctx: Any, side: dict[str, Any], action: str | None = None) -> SchedulerCheck:
    """Add the check to a scheduler that runs gpudask (idempotent; the apply stage calls it)."""
    existing = scheduler.plugins.get(PLUGIN_NAME)
    if isinstance(existing, SchedulerCheck):
        if existing.manager is None:
            existing.use(scheduler, manager, ctx, side)
        return existing
    from distributed.core import Status

    plugin = SchedulerCheck(action=action)
    plugin.use(scheduler, manager, ctx, side)
    scheduler.add_plugin(plugin, name=PLUGIN_NAME, idempotent=True)
    if scheduler.status == Status.running:
        # a running scheduler (gpudask applied late): nobody else calls start(), which also
        # checks the connected workers; start() runs once
        scheduler.loop.add_callback(plugin.start, scheduler)
    # else at dask_setup time: Scheduler.start_unsafe calls plugin.start() right after
    return plugin


async def report_on_scheduler(dask_scheduler: Any = None) -> dict[str, Any]:
    """``gpudask check``'s on the scheduler: the installed check's report, else a dry one-off."""
    plugin = dask_scheduler.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, SchedulerCheck):
        plugin = SchedulerCheck(dry=True)
        await plugin.start(dask_scheduler)
    else:
        await plugin.settled()
    return plugin.report(sides=True)

"""gpudask on a cluster that is already running (docs/usage.md): ``client.register_plugin``
of :class:`WorkerPlugin`, :class:`NannyPlugin` and :class:`SchedulerPlugin`, or :func:`register`.

Each applies what still takes effect in a running process and reports the rest as *needs
restart* (worker log, :func:`status`, the scheduler's metadata under ``["gpudask", ...]``).
On servers started with ``--preload gpudask`` they change nothing but publish.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import dask.config
from distributed.diagnostics import plugin as _dp

from gpudask.apply import process as session
from gpudask.apply import hostfile, running, runtime, slots
from gpudask.apply.state import plugin_of
from gpudask.checks.sides import scheme
from gpudask.errors import GpudaskError
from gpudask.printable import printable

logger = logging.getLogger("distributed.gpudask")

PLUGIN_NAME = "gpudask"
PRELOAD = "gpudask"
METADATA_KEY = "gpudask"  # client.get_metadata(["gpudask", "workers"]) / ["gpudask", "scheduler"]
PUBLISH_HANDLER = "gpudask_publish"  # scheduler handler added by SchedulerPlugin
# worker handler added by WorkerPlugin: what it publishes, read by the scheduler from the worker
# itself -- a caller of gpudask_publish can make it read a worker's state again, never forge it
PUBLISHED_HANDLER = "gpudask_published"
READ_S = 10.0  # seconds the scheduler waits for the workers' own answers
WHOLE_PLAN = "the whole plan, at import time (--preload gpudask)"


def _failed(notes: list[str], what: str, error: GpudaskError) -> None:
    logger.error("gpudask: %s", printable(error))  # a plugin's text: one line
    notes.append(f"{what} failed: {error}")


async def _begin(role: str, address: str, plan: Any, *args: Any) -> tuple[Any, bool, list[Any], dict[str, Any]]:
    """This process's session (a plan-only one, ``plan(*args)``, when gpudask was not preloaded),
    whether it was preloaded, what needs a restart and the config that can still be set."""
    current = session.current()
    preloaded = current is not None and current.role == role and current.applied
    # planning probes the host (NVML, ucx_info): keep the event loop free
    s = current if preloaded else await asyncio.to_thread(plan, *args)
    needs, late = running.missing_in_running_process(s.plan, s.ctx, address, running.read_at_start(s.manager))
    return s, preloaded, needs, late


def _set_late(late: dict[str, Any], applied: list[str]) -> None:
    if late:
        dask.config.set(late)
        applied += [f"{k}={v!r}" for k, v in late.items()]


def _server_setup(s: Any, server: Any, report: dict[str, Any]) -> None:
    try:
        s.manager.server_setup(s.ctx, s.plan, server)
        report["applied"].append("gpudask_server_setup hooks")
    except GpudaskError as e:  # a running server is not stopped for it: say so
        _failed(report["notes"], "gpudask_server_setup hooks", e)


class _SentEmpty:
    """Pickled without what it found where it ran: a fresh one on the other side."""

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), ()


class WorkerPlugin(_SentEmpty, _dp.WorkerPlugin):
    """gpudask for a running worker: apply what can be applied late, report the rest.

    After ``setup``, ``self.report`` (also ``status(client)``) is::

        {"worker": addr, "index": i, "preloaded": bool, "applied": [...],
         "needs_restart": [{"what", "planned", "actual", "why", "plugin"}], "notes": [...]}
    """

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.report: dict[str, Any] | None = None

    async def setup(self, worker: Any) -> None:
        s, preloaded, needs, late = await _begin("worker", worker.address, _plan_worker, worker)
        report = _report(preloaded, worker=worker.address, index=s.plan.index)
        if not preloaded:
            await self._apply_late(s, worker, report, needs, late)
            found = running.context_check(s.plan, s.ctx)
            if found:
                needs.append(found)
        report["needs_restart"] = needs
        if needs:
            report["notes"].append(f"to apply the rest: {running.HOW}")
        self.report = report
        published = {**s.published(), "late": report}
        worker.startup_information["gpudask"] = lambda _worker: published
        # what the scheduler reads back from this worker's own address (gpudask_publish)
        worker.handlers[PUBLISHED_HANDLER] = lambda: published
        from gpudask.dashboard.prometheus import register_worker_collector

        register_worker_collector(worker)
        try:
            await worker.scheduler.set_metadata(keys=[METADATA_KEY, "workers", worker.address], value=published)
            if await worker.scheduler.get_metadata(keys=[METADATA_KEY, "scheduler"], default=None) is not None:
                # gpudask's SchedulerPlugin is there: it puts this into WorkerState.extra
                # (as --preload gpudask would have at registration) and re-runs the check
                await worker.scheduler.gpudask_publish(worker=worker.address)
        except Exception as e:  # noqa: BLE001 - publishing is best effort; the report stays on the worker
            report["notes"].append(f"not published to the scheduler: {type(e).__name__}: {e}")
        running.log_report(f"worker {worker.address} (gpudask worker {s.plan.index})", report)

    async def _apply_late(self, s: Any, worker: Any, report: dict[str, Any], needs: list[dict[str, Any]],
                          late: dict[str, Any]) -> None:
        plan, ctx = s.plan, s.ctx
        applied, notes = report["applied"], report["notes"]
        _set_late(late, applied)
        if plan.resources and not worker.state.total_resources:
            # as at preload time: resources the user gave the worker win
            await worker.set_resources(**plan.resources)
            applied += [f"resource {k}={v:g}" for k, v in plan.resources.items()]
        if plan.cpu_affinity:
            if ctx.facts.described:
                notes.append(f"cpu_affinity {plan.cpu_affinity} not applied: the host is described by "
                             f"{ctx.facts.origin}, its CPUs are not this machine's")
            else:
                session.bind_cpus(plan.cpu_affinity, ctx)
                applied.append("cpu_affinity")
        if plan.sections and not ctx.facts.described and not running.gpu_matches(plan, ctx):
            needs.append(running.item(
                "memory", {name: dict(values) for name, values in plan.sections.items()}, None, "the memory setup is for the worker's own GPU, which this process "
                "does not use yet: building it now would allocate on another GPU", plugin_of(plan, "memory:")))
        else:
            try:
                s.memory = session.setup_memory(s.manager, ctx, plan)
            except GpudaskError as e:  # a running worker is not stopped for it: say so
                _failed(notes, "memory setup", e)
            else:
                if s.memory:
                    applied.append("memory setup (" + ", ".join(sorted(s.memory)) + ")")
        _server_setup(s, worker, report)
        notes.append("gpudask_context_init runs at import time only (before UCX): not run on a running worker")

    def teardown(self, worker: Any) -> None:
        if self.report is not None and not self.report["preloaded"]:
            worker.startup_information.pop("gpudask", None)


def _plan_worker(worker: Any) -> Any:
    """A plan-only session for this running worker process (it changes nothing in it)."""
    from gpudask import session as process_state

    state = process_state.current()
    if state.late_index is None:
        # $GPUDASK_WORKER_INDEX, or the lowest free number of this host's group (held
        # until the process exits; a restarted worker of the same nanny gets it back)
        state.late_index = slots.worker_index(str(worker.nanny) if worker.nanny else None)
    host = hostfile.load()  # the plan this worker's parent made, when it made one
    if host is None:
        protocol = scheme(getattr(worker.scheduler, "address", None)) or scheme(worker.address) or "tcp"
        host = session.plan_host(protocol, None, planner="worker")  # only what this worker applies
    return session.Session("worker", host, host.for_role("worker", state.late_index))


class NannyPlugin(_dp.NannyPlugin):
    """Give each nanny's next worker process its gpudask plan (``--preload-nanny`` late).

    :param restart: restart the workers right after registration (distributed's
        ``NannyPlugin.restart``); by default the plan applies at the next restart
        (``client.restart()``, or a worker that dies and is restarted by its nanny).
    """

    name = PLUGIN_NAME

    def __init__(self, restart: bool = False) -> None:
        self.restart = bool(restart)

    def setup(self, nanny: Any) -> None:
        s = _plan_nanny(nanny)
        if not os.environ.get(hostfile.PLAN_ENV):
            hostfile.publish(s.host)  # the nanny's next worker process takes its plan from there
        for name in (hostfile.PLAN_ENV, hostfile.GROUP_ENV):
            if os.environ.get(name):
                nanny.pre_spawn_env[name] = os.environ[name]
        add_worker_preload(nanny)
        when = "now (restart=True)" if self.restart else "at the next restart (client.restart())"
        logger.info("gpudask: nanny %s: its next worker process starts with --preload gpudask and takes its "
                    "plan from this host's plan, %s", nanny.address, when)


def _plan_nanny(nanny: Any) -> Any:
    current = session.current()
    if current is not None and current.role == "nanny":
        return current
    role, cli = runtime.detect_role()  # the `dask worker` CLI's --nworkers, when this is one
    protocol = scheme(getattr(nanny, "scheduler_addr", None)) or scheme(nanny.address)
    return session.start("nanny", cli=cli if role == "nanny" else None, protocol=protocol, apply=False)


def add_worker_preload(nanny: Any) -> None:
    """``gpudask`` in the preloads of the worker processes this nanny starts from now on."""
    preload = nanny.preload
    preload = [preload] if isinstance(preload, str) else list(preload or [])
    if PRELOAD not in preload:
        preload.append(PRELOAD)
    nanny.preload = preload
    process = getattr(nanny, "process", None)
    if process is not None and isinstance(getattr(process, "worker_kwargs", None), dict):
        process.worker_kwargs["preload"] = preload  # the WorkerProcess is reused on restart


class SchedulerPlugin(_SentEmpty, _dp.SchedulerPlugin):
    """gpudask for a running scheduler: the ``gpudask_server_setup`` hooks (which install the
    scheduler check, see :mod:`gpudask.checks`), late config, and a report of what needs a
    restart (``client.get_metadata(["gpudask", "scheduler"])``)."""

    name = PLUGIN_NAME

    def __init__(self) -> None:
        self.report: dict[str, Any] | None = None
        self.scheduler: Any = None
        self.published: Any = None

    async def start(self, scheduler: Any) -> None:
        s, preloaded, needs, late = await _begin("scheduler", scheduler.address, _plan_scheduler,
                                                 scheme(scheduler.address))
        report = _report(preloaded, scheduler=scheduler.address)
        if not preloaded:
            _set_late(late, report["applied"])
            # workers whose gpudask came in through WorkerPlugin before this plugin: read
            # back what each publishes, so the check below sees them as gpudask workers
            await _read_all_workers(scheduler)
            before = set(scheduler.plugins)
            install_check(scheduler, s)
            _server_setup(s, scheduler, report)
            # plugins added by the hooks (the scheduler check) start now, as they would
            # have at scheduler start; the check then also checks the connected workers
            for name in [n for n in scheduler.plugins if n not in before]:
                plugin = scheduler.plugins[name]
                if hasattr(plugin, "start"):
                    result = plugin.start(scheduler)
                    if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                        await result
                report["applied"].append(f"scheduler plugin {name}")
        report["needs_restart"] = needs
        if needs:
            report["notes"].append("to apply the rest: restart the scheduler with `dask scheduler --preload gpudask`")
        self.report = report
        self.scheduler = scheduler
        scheduler.handlers[PUBLISH_HANDLER] = self.publish
        from gpudask.dashboard import page, prometheus

        page.install(scheduler)
        prometheus.register_scheduler_collector(scheduler)
        self.published = {**s.published(), "late": report}
        scheduler.set_metadata(keys=[METADATA_KEY, "scheduler"], value=self.published)
        running.log_report(f"scheduler {scheduler.address}", report)

    def restart(self, scheduler: Any) -> None:
        """``client.restart()`` clears the scheduler's metadata: publish again."""
        if self.published is not None:
            scheduler.set_metadata(keys=[METADATA_KEY, "scheduler"], value=self.published)

    async def publish(self, worker: str, published: Any = None) -> str:
        """Handler ``gpudask_publish``: read what the worker at ``worker`` publishes into its
        ``WorkerState.extra["gpudask"]`` and check it again.  Any client can call it: what is
        published is read back from the worker itself (``published`` is ignored)."""
        problem = await _read_worker(self.scheduler, worker)
        if problem is not None:
            return problem
        from gpudask.checks import PLUGIN_NAME as CHECK_NAME

        check = self.scheduler.plugins.get(CHECK_NAME)
        if check is not None and hasattr(check, "check_worker"):
            check.check_worker(worker)
        return "OK"

    async def close(self) -> None:
        if self.scheduler is not None and self.scheduler.handlers.get(PUBLISH_HANDLER) == self.publish:
            del self.scheduler.handlers[PUBLISH_HANDLER]


async def _read_worker(scheduler: Any, address: str) -> str | None:
    """Put what the worker at ``address`` publishes into its ``WorkerState.extra``; None,
    or why not."""
    ws = scheduler.workers.get(address)
    if ws is None:
        return "unknown worker"
    try:
        published = await asyncio.wait_for(scheduler.rpc(address).gpudask_published(), READ_S)
    except Exception as e:  # noqa: BLE001 - a worker without the handler, gone, or slow
        return f"not read from the worker: {type(e).__name__}: {e}"[:300]
    if scheduler.workers.get(address) is not ws:
        return "unknown worker"
    ws.extra["gpudask"] = published
    return None


async def _read_all_workers(scheduler: Any) -> None:
    """:func:`_read_worker` for each connected worker that published nothing yet (together, at
    most READ_S seconds)."""
    pending = [_read_worker(scheduler, a) for a, ws in list(scheduler.workers.items()) if "gpudask" not in ws.extra]
    if pending:
        try:
            await asyncio.wait_for(asyncio.gather(*pending), READ_S)
        except asyncio.TimeoutError:
            logger.warning("gpudask: some workers did not say within %g s what they publish", READ_S)


def _plan_scheduler(protocol: str | None) -> Any:
    host = session.plan_host(protocol)
    return session.Session("scheduler", host, host.for_role("scheduler"))


def _report(preloaded: bool, **server: Any) -> dict[str, Any]:
    """A server's report, ``server`` first: its address (and a worker's index)."""
    return {**server, "preloaded": preloaded, "applied": [WHOLE_PLAN] if preloaded else [], "needs_restart": [],
            "notes": []}


def _worker_status(dask_worker: Any = None) -> dict[str, Any]:
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    report = getattr(plugin, "report", None)
    if report is not None:
        return report
    s = session.current()
    if s is not None and s.role == "worker" and s.applied:
        return _report(True, worker=dask_worker.address, index=s.plan.index)
    report = _report(False, worker=dask_worker.address, index=None)
    report["notes"].append("gpudask is not running in this worker: no --preload gpudask, no gpudask.WorkerPlugin "
                           "registered")
    return report


def status(client: Any) -> dict[str, dict[str, Any]]:
    """Per worker address: what gpudask applied there and what needs a restart."""
    return client.run(_worker_status)


def needs_restart(client: Any) -> dict[str, list[dict[str, Any]]]:
    """Per worker address: the planned settings only a new worker process can apply
    (empty lists when nothing is missing)."""
    return {address: report["needs_restart"] for address, report in status(client).items()}


def register(client: Any, *, nanny: bool = True, restart: bool = False) -> dict[str, dict[str, Any]]:
    """Register gpudask's scheduler, worker and (``nanny=True``) nanny plugins on the running
    cluster of ``client``; ``restart=True`` then restarts only the workers that do not run
    their whole plan (:func:`workers_needing_restart`).  Returns :func:`status`.

    The scheduler's plugin comes last: it reads back what the workers publish, so that under
    ``scheduler-check.action: refuse`` no worker is refused for running no gpudask yet."""
    if restart and not nanny:
        raise GpudaskError("register(restart=True) needs nanny=True: the nannies start the workers with their plan")
    if nanny:  # never NannyPlugin(restart=True): distributed would restart every worker, preloaded ones too
        client.register_plugin(NannyPlugin())
    client.register_plugin(WorkerPlugin())
    client.register_plugin(SchedulerPlugin())
    report = status(client)
    stale = workers_needing_restart(report) if restart else []
    if stale:
        logger.info("gpudask: restarting %d of %d worker(s), which do not run their whole plan: %s", len(stale),
                    len(report), ", ".join(stale))
        client.restart_workers(stale)
        report = status(client)
    return report


def workers_needing_restart(report: dict[str, dict[str, Any]]) -> list[str]:
    """The workers of a :func:`status` report that do not run their whole plan: gpudask not
    preloaded, or a planned setting only a new process takes."""
    return sorted(address for address, r in report.items() if not r.get("preloaded") or r.get("needs_restart"))


def install_check(scheduler: Any, s: Any) -> None:
    """The scheduler check, in every scheduler gpudask configures."""
    from gpudask.checks import install, local_side, scheme

    install(scheduler, s.manager, s.ctx,
            local_side(s.host.facts, "scheduler", scheduler.address, scheme(scheduler.address) or s.host.protocol))

"""The preload entry points: import time, ``dask_setup``, and ``initialize``.

A failure in a server process stops it with one line naming the plugin, the hook and the
cause (:func:`fatal`): distributed would log "Failed to start preload" and start the server
anyway.  In ``dask worker`` / ``dask scheduler`` option parsing, click prints the one line.
"""

from __future__ import annotations

import logging
import os
from typing import Any, cast

from gpudask import session as process_state
from gpudask.apply import hostfile, process, runtime, state
from gpudask.errors import GpudaskError

# a child of distributed's logger: `dask worker`'s logging setup, LocalCluster's quiet
# default and `silence_logs` apply to gpudask's lines as to distributed's own
logger = logging.getLogger("distributed.gpudask")


def on_import() -> None:
    """Run at the first ``import gpudask`` in a dask server process."""
    from gpudask.compat.distributed import imported_by_distributed_preload, worker_init_locals

    role, cli = runtime.detect_role()
    if role == "client":
        return
    if role == "worker" and cli is None and not _worker_running():
        # a nanny's worker process: whoever imports gpudask first (the preload in
        # Worker.__init__, or the user's script re-run as __mp_main__) applies its plan
        _fail_here(lambda: process.start_worker(worker_init_locals()), cli)
    elif imported_by_distributed_preload():  # --preload, --preload-nanny: before listen()
        if cli is not None:
            _take_preload_argv(cli)
        _fail_here(lambda: process.start(role, cli), cli)
    else:
        # imported late in a running server (e.g. while unpickling a plugin registered by
        # a client): too late for import-time apply; gpudask.apply.server_plugins handles it
        return
    s = process.current()
    assert s is not None
    level = logging.INFO if hostfile.decided_anything(s.host) else logging.DEBUG
    logger.log(level, process.startup_line(s))
    taken = process_state.current().taken_options if role in ("nanny", "worker") else {}
    # the host's warnings once per command: by the process that planned the host
    warnings = ([] if s.planned_by_parent else list(s.host.warnings)) + _dask_worker_warnings(s, cli)
    if taken:  # dask-cuda's table only where its options were given (3 ms of each worker's start)
        from gpudask.compat.dask_cuda import without_effect

        warnings += without_effect(s.host, taken)
    for warning in warnings:
        logger.warning("gpudask: %s", warning)


def _take_preload_argv(cli: runtime.CliArgs) -> None:
    """dask-cuda's worker options after ``--preload gpudask`` (``--rmm-pool-size 1GB``) become
    gpudask settings in this process's dask config before it plans, and ``dask_setup`` the
    click command distributed hands them to -- unless another preload is listed and none of
    them is an option gpudask knows (the user's own click preload keeps them)."""
    global dask_setup
    from gpudask.compat import dask_cuda

    argv, command = cli.preload_argv, cli.command
    others = [n for n in cli.preload if n != "gpudask"]
    if not argv or (others and not any(dask_cuda.known_option(a) for a in argv)):
        return

    def take() -> None:
        import dask.config

        from gpudask.config import label_source

        settings, given_as = dask_cuda.take_cli_argv(list(argv), command)
        process_state.current().taken_options.update(given_as)
        dask.config.set(settings)  # process-wide: this process's plan and its worker processes
        for key, value in settings.items():
            label_source(key, value, f"dask {command} {given_as[key]}")

    _fail_here(take, cli, report=False)
    dask_setup = DASK_SETUP_COMMAND


def _dask_worker_warnings(s: process.Session, cli: runtime.CliArgs | None) -> list[str]:
    """``dask worker`` leaving GPUs idle, or sharing them with another ``dask worker`` command
    of this host (each numbers its workers from 0)."""
    gpus = len(s.ctx.gpus)
    if cli is None or cli.command != "worker" or not cli.nanny or not gpus:
        return []
    out = []
    started = cli.nworkers or 1
    # --nworkers 0: distributed refuses it and says so; more workers than GPUs: the plan warns
    if cli.nworkers != 0 and started < gpus:
        out.append(f"dask worker starts {started} worker(s) on a host with {gpus} visible GPU(s): "
                   f"{gpus - started} GPU(s) stay idle; pass --nworkers {gpus} for one worker per GPU")
    found = hostfile.sharing_gpus(s.host)
    if found is not None:
        pids, indices = found
        out.append(f"another dask worker command on this host (pid {pids}) already "
                   f"runs workers on GPU(s) {indices}: this command's "
                   f"{len(s.host.workers)} worker(s) share them (each command numbers its workers from 0); start one "
                   f"dask worker with --nworkers {gpus}, or give each command its own CUDA_VISIBLE_DEVICES")
    return out


def _worker_running() -> bool:
    """Is a Worker already running in this process (gpudask imported late)?"""
    from gpudask.compat.distributed import worker_instances

    return any(w.status.name not in ("init", "undefined") for w in worker_instances())


def _fail_here(step: Any, cli: runtime.CliArgs | None, report: bool = True) -> None:
    try:
        step()
    except GpudaskError as e:
        if cli is None:
            fatal(e)
        import click

        # inside the CLI's option callback: click prints "Error: ..." and exits 1
        raise click.ClickException(f"gpudask: {e}") from None
    if report and cli is not None and cli.command == "worker":
        hostfile.report_worker_failures()


def fatal(error: BaseException) -> None:
    """Stop this server process now, with one line (also left for the ``dask worker`` process
    that started it, which prints it as its last word)."""
    from gpudask.plugin.hookcall import PluginStopped

    line = f"gpudask: {error}"
    if isinstance(error, PluginStopped):
        # asked to stop while a hook ran (e.g. the nanny closing this worker because a sibling
        # failed): not this process's failure, but where a stuck hook was cut short is worth a line
        logger.info(line)
    else:
        logger.error(line)
        hostfile.leave_fatal(line)
    for handler in logging.getLogger().handlers + logging.getLogger("distributed").handlers:
        handler.flush()
    os._exit(1)


def initialize(protocol: str | None = None, nworkers: int | None = None) -> process.Session:
    """Apply the client's part of the plan in this process (before creating a Client or a
    cluster, like dask-cuda's ``initialize``); calling it again returns the same session."""
    existing = process.current()
    if existing is not None and existing.role == "client" and (protocol is None or existing.host.protocol == protocol):
        return existing
    session = process.start("client", protocol=protocol, nworkers=nworkers)
    # the workers started from here read this host plan and leave its warnings to this process
    for warning in session.host.warnings:
        logger.warning("gpudask: %s", warning)
    return session


# the dask config keys every plan depends on; the plugins' are learnt from the plans (plan_keys)
_CORE_KEYS = ("gpudask", "distributed.worker.multiprocessing-method")


def session_for(role: str) -> process.Session:
    """The session of this process, or a plan-only one when gpudask was imported too late to
    act at import time, kept per role and inputs (a test suite plans once, not per server)."""
    s = process.current()
    if s is not None and s.role == role:
        return s
    state = process_state.current()
    key = (role, _inputs())
    if key not in state.plan_only:
        if len(state.plan_only) >= 8:  # inputs keep changing (a test suite): forget the oldest
            del state.plan_only[next(iter(state.plan_only))]
        made = process.start(role, apply=False)
        known = len(state.plan_keys)
        state.plan_keys.update(plan_keys(made))
        # keyed by what it depends on: with keys learnt from this plan, by the inputs now
        state.plan_only[key if len(state.plan_keys) == known else (role, _inputs())] = made
        return made
    return cast(process.Session, state.plan_only[key])


def plan_keys(s: process.Session) -> set[str]:
    """The dask config keys ``s``'s host plan depends on beyond gpudask.*: the loaded
    options' legacy keys and the keys any of its processes sets."""
    legacy = {key for option in s.ctx.settings.options.values() for key in option.legacy}
    return legacy | set(s.host.user_values.config)


def _inputs() -> str:
    """What a plan depends on: gpudask's, UCX's and CUDA's variables and the config keys of
    :func:`plan_keys` (not the rest of dask's config, which changes all the time)."""
    import json

    import dask.config

    env = sorted((k, v) for k, v in os.environ.items()
                 if k.startswith(("GPUDASK_", "DASK_GPUDASK", "DASK_DISTRIBUTED_UCXX", "UCX_", "CUDA_", "RAPIDS_")))
    sections = {key: dask.config.get(key, default=None) for key in sorted({*_CORE_KEYS, *process_state.current().plan_keys})}
    return json.dumps([env, sections], sort_keys=True, default=repr)


def setup(server: Any) -> Any:
    """distributed calls this (``dask_setup``) after ``listen()``, before a worker registers."""
    from distributed import Nanny, Scheduler, Worker

    try:
        if isinstance(server, Worker):
            _setup_worker(session_for("worker"), server)
        elif isinstance(server, Nanny):
            _setup_nanny(session_for("nanny"), server)
        elif isinstance(server, Scheduler):
            _setup_scheduler(session_for("scheduler"), server)
    except GpudaskError as e:
        fatal(e)  # distributed would log "Failed to start preload" and start the server anyway
    return None


def _setup_worker(s: process.Session, worker: Any) -> None:
    changed = process.apply_config(s.plan)  # the nanny's config was loaded after a top-level import
    if changed:
        logger.debug("gpudask: worker %s: config put back after the nanny's: %s", s.plan.index, sorted(changed))
    if s.plan.resources and not worker.state.total_resources:
        # resources are read in Worker.__init__ before the preload; the worker has not
        # registered yet, so setting them here is what the scheduler sees first
        for name, amount in s.plan.resources.items():
            worker.state.total_resources[name] = amount
            worker.state.available_resources[name] = amount
    s.manager.server_setup(s.ctx, s.plan, worker)
    from gpudask.dashboard.prometheus import register_worker_collector

    register_worker_collector(worker)  # gpudask-* worker metrics on the worker's /metrics
    if s.applied:
        state.record(s)
    # built here, not at registration: distributed drops a failing startup_information silently
    published = s.published()
    worker.startup_information["gpudask"] = lambda _worker: published


def _setup_nanny(s: process.Session, nanny: Any) -> None:
    """``--preload-nanny gpudask``: the worker processes this nanny starts preload gpudask too
    (they take their plan from the host plan this process wrote)."""
    from gpudask.apply.server_plugins import add_worker_preload

    add_worker_preload(nanny)
    s.manager.server_setup(s.ctx, s.plan, nanny)


def _setup_scheduler(s: process.Session, scheduler: Any) -> None:
    from gpudask.dashboard import page, prometheus
    from gpudask.apply.server_plugins import install_check

    install_check(scheduler, s)  # the core runs the check, whichever plugins implement it
    s.manager.server_setup(s.ctx, s.plan, scheduler)
    page.install(scheduler)  # /gpudask on the scheduler's HTTP server
    prometheus.register_scheduler_collector(scheduler)
    if s.applied:  # a scheduler inside a client's process runs with the client's plan
        state.record(s)


def _make_command() -> Any:
    import click

    class DaskSetup(click.Command):
        """gpudask's ``dask_setup`` taking dask-cuda's worker options (taken at import time);
        its parameters are built from the plugins when distributed parses them."""

        def get_params(self, ctx: click.Context) -> list[click.Parameter]:
            if len(self.params) == 1:
                from gpudask.compat import dask_cuda

                self.params = dask_cuda.click_params() + self.params
            return super().get_params(ctx)

    # the arguments were taken at import; "rest": what click took for dask worker's scheduler address
    rest = click.Argument(["rest"], nargs=-1, type=click.UNPROCESSED)
    return DaskSetup("dask_setup", params=[rest], callback=lambda server, **_options: setup(server),
                     add_help_option=False)


# a plain function (distributed passes no arguments) until on_import takes dask-cuda's options
dask_setup: Any = setup
DASK_SETUP_COMMAND: Any = _make_command()

"""The hooks a gpudask plugin can implement: the typed contract.  These docstrings are the reference.

A plugin is a module or an object that carries a ``name`` (str) and a ``priority``
(int, 0-1000, lower runs first; ties are broken by name) and implements any of the
hooks below, each marked with :data:`gpudask.pluginapi.hookimpl`.  Built-in plugins
are registered from :data:`gpudask.manager.BUILTIN_PLUGINS`, third-party ones through
the ``gpudask`` entry point group; both are called the same way.

Every hook is called by gpudask's plugin manager one implementation at a time, in
priority order (``GPUDASK_TRACE_PLUGINS=1`` traces each call through pluggy's tracer).  None of the hooks is ``firstresult``: each asks every plugin for its part (its
options, its decisions, its findings), and no single plugin's answer ends the call.
How the results combine is said per hook.  A failure is reported as
``gpudask plugin 'x' (from dist) failed in <hook>: <cause>``; what it then does is also
said per hook.  Hook wrappers (``wrapper=True``, ``hookwrapper=True``) and
``tryfirst``/``trylast`` are refused at registration (``gpudask plugin 'x' failed in
registration: <hook> is marked tryfirst=True, which gpudask does not run; ...``): the
order is the plugin's ``priority``.

*Plan hooks* (``gpudask_config_options``, ``gpudask_validate``,
``gpudask_plan_process``, ``gpudask_select_transport``, ``gpudask_plan_memory``,
``gpudask_plan_finish``) are
pure: they read the frozen :class:`~gpudask.plan.PlanContext` and write decisions into a
:class:`~gpudask.plan.ProcessPlan` through its methods, which record the reason and the
plugin.  They run wherever a plan is built -- ``gpudask info`` on a laptop, the
``dask worker`` CLI process, each worker process -- and must have no side effects.

*Apply hooks* (``gpudask_context_init``, ``gpudask_setup_memory``,
``gpudask_preload``) run in the process the plan is for, at the moment each docstring
names, with the plan already computed; they must not re-decide.
``gpudask_scheduler_check`` compares two processes' published facts.

The annotations name the types; they are imported for type checkers only, so this
module stays as light as ``import gpudask``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from distributed import Nanny, Scheduler, Worker

    from gpudask.config import Option
    from gpudask.findings import Finding, ProcessSide
    from gpudask.plan.context import PlanContext
    from gpudask.plan.model import ProcessPlan

PROJECT = "gpudask"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def gpudask_config_options() -> list[Option]:
    """Declare the settings this plugin reads.

    **When, where:** called once per plugin manager, before any other hook, in every
    process that builds a plan (scheduler, nanny host, worker, client, ``gpudask info``,
    ``gpudask config``, the documentation build).

    :return: a list of :class:`gpudask.pluginapi.Option`.  Keys must live under
        ``gpudask.`` (``gpudask.<plugin-name>.<option>`` by convention).  Each option
        carries its default, a one-line description (used for the generated
        configuration reference), a parser that turns raw values into typed ones
        and raises :class:`ValueError` with the accepted form, and optional
        ``legacy`` keys (other dask config keys honoured when the gpudask key is
        not set explicitly).  Plugins read values with ``ctx.setting(key)``.

    **Combined:** the lists of all plugins are concatenated after gpudask's core options.
    **Failure:** raising, or returning something that is not an ``Option`` under
    ``gpudask.``, stops the process (one line naming the plugin).
    """


@hookspec
def gpudask_validate(ctx: PlanContext) -> None:
    """Check the settings and the facts before any plugin decides.

    **When, where:** called once per plan, after all options are parsed and before any
    other plan hook, in every process that builds a plan (including ``gpudask info``).

    :param ctx: the frozen :class:`gpudask.pluginapi.PlanContext` (facts, settings,
        protocol, number of workers, the user's environment and config).
    :raises gpudask.pluginapi.ConfigError: with a one-line message naming the key, the
        value, and what is accepted.
    :return: None (ignored).  ``ctx.warn(message)`` adds a warning to the plan.

    **Failure:** stops the process from starting: a worker refuses to start rather than
    start half-configured; ``gpudask info`` prints the one line and exits 2.
    """


@hookspec
def gpudask_plan_process(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Decide how a process starts: its GPU, CPU affinity, start method, dask config.

    **When, where:** a plan hook (pure), in every process that builds a plan; called for
    the scheduler plan, the nanny-host plan, the client plan and each worker plan, in
    that order, before transport selection (transport and memory depend on the GPU).

    :param ctx: the :class:`gpudask.pluginapi.PlanContext`.
    :param plan: the :class:`gpudask.pluginapi.ProcessPlan` to fill; ``plan.role`` is
        ``"scheduler"``, ``"nanny"`` (the process hosting nannies: the ``dask worker``
        CLI), ``"client"`` or ``"worker"``; ``plan.index`` is the worker number.
    :return: None (ignored); decisions are written with ``plan.set_gpu``,
        ``plan.set_env``, ``plan.set_config``, ``plan.set_cpu_affinity``,
        ``plan.set_multiprocessing_method``, ``plan.set_resource``, ``plan.note``.

    **Combined:** every plugin writes into the same plan, in priority order; a later
    plugin sees (and may override) an earlier one's decisions.  **Failure:** stops the
    process, as in ``gpudask_validate``.
    """


@hookspec
def gpudask_select_transport(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Contribute to the transport of a process (UCX transports, environment, interface).

    **When, where:** a plan hook (pure), in every process that builds a plan; called for
    every plan after ``gpudask_plan_process``.

    Each plugin adds the UCX transports it needs with ``plan.add_ucx_transport(name,
    why)``; may set ``UCX_*`` variables with ``plan.set_env``, ``distributed-ucxx.*``
    keys with ``plan.set_config`` and the interface with ``plan.set_interface``.
    Nothing is contributed when ``ctx.uses_ucx`` is false unless the plugin has a
    reason to (the interface, say).  Read a user's ``UCX_TLS`` with
    ``gpudask.pluginapi.parse_ucx_tls`` / ``tls_enables`` only.

    :return: None (ignored).

    **Combined:** additive; after the last plugin gpudask composes ``UCX_TLS`` from all
    contributions (unless the user exported ``UCX_TLS`` or a plugin set it, which then
    wins).  **Failure:** stops the process, as in ``gpudask_validate``.
    """


@hookspec
def gpudask_plan_memory(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Decide the device-memory setup of a process (allocator, pool sizes).

    **When, where:** a plan hook (pure), in every process that builds a plan; called
    for every plan after ``UCX_TLS`` is composed, so ``plan.ucx_transports`` and
    ``plan.env["UCX_TLS"]`` are known.

    :return: None (ignored); write the decision into the plugin's own section with
        ``plan.set_section({...}, why)`` (the rmm plugin: allocator, pool sizes in bytes
        resolved for this process's GPU); ``gpudask_setup_memory`` reads it back.

    **Combined:** each plugin writes its own section; a section another plugin wrote in
    this step is not visible yet (``plan.section`` shows the earlier steps':
    ``gpudask_plan_finish`` is the step that reads this one's).  **Failure:** stops the process, as in
    ``gpudask_validate``.
    """


@hookspec
def gpudask_context_init(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Prepare the CUDA context of the current process before UCX initialises.

    **When, where:** an apply hook, called once in every process gpudask is preloaded
    into (scheduler, nanny host, worker) and in a client by :func:`gpudask.initialize`,
    at import time of the preload -- before ``listen()`` -- after gpudask applied the
    plan's environment and config.  This is the last moment at which
    ``CUDA_VISIBLE_DEVICES`` and ``UCX_*`` still take effect.

    Implementations detect existing contexts (without creating one), create the
    worker's context on its own GPU when UCX needs it, and verify it.  When the facts
    are described (``ctx.facts.described``) nothing touching a real device may run.

    :return: None (ignored).

    **Combined:** every plugin runs, in priority order.  **Failure:** raise
    :class:`gpudask.pluginapi.GpudaskError`: the process stops with the one line.
    """


@hookspec
def gpudask_setup_memory(ctx: PlanContext, plan: ProcessPlan) -> dict[str, Any] | None:
    """Apply the plugin's memory decision (its section of ``plan``) in a worker process.

    **When, where:** an apply hook, in worker processes only (never nanny, CLI, client),
    at import time of the preload right after ``gpudask_context_init`` -- before the
    first connection and the first task.  Called **once per process**: gpudask keeps the
    returned reports and hands them out to every later request in that process (its
    WorkerPlugin registered on a running worker, a second preload), so a plugin never
    builds a pool twice.

    :return: a JSON-compatible dict describing what was set up (published in the
        worker's startup information under ``gpudask.memory.<plugin name>``), or None.

    **Combined:** a dict ``{plugin name: report}`` of the non-None reports.
    **Failure:** raise to stop the worker: a worker never starts without the pool it was
    asked for (the one line names the plugin, the hook and the cause).
    """


@hookspec
def gpudask_preload(ctx: PlanContext, plan: ProcessPlan, server: Scheduler | Worker | Nanny) -> None:
    """Act on the running server (``dask_setup`` time).

    **When, where:** an apply hook, called with ``server`` a ``Worker``, ``Nanny`` or
    ``Scheduler`` from gpudask's ``dask_setup`` (after ``listen()``, before the worker
    registers with the scheduler), and from gpudask's WorkerPlugin / NannyPlugin /
    SchedulerPlugin when they are registered on a running cluster.  Use it to add
    plugins, metrics, startup information or resources.

    :return: None (ignored).

    **Combined:** every plugin runs, in priority order.  **Failure:** the process stops
    with the one line (a server never runs half-configured).
    """


@hookspec
def gpudask_applied_state(ctx: PlanContext, plan: ProcessPlan) -> dict[str, dict[str, Any]] | None:
    """Read back, from the live process, what this plugin applied: the proof of effect.

    **When, where:** an apply hook, called once in each scheduler, nanny host and worker
    process right after ``gpudask_preload``, when gpudask records the process's applied
    state (``gpudask status``, the scheduler check).  Read only: never change anything.

    :return: ``{key: {"planned": value, "actual": value}}`` for what this plugin decided
        and can read back (JSON-compatible values), or None.  A key whose two values differ
        becomes a *mismatch* (process, key, planned, actual, this plugin): an error in the
        log, a ``not-applied`` error finding of the scheduler check, a row in ``gpudask
        status``.

    **Combined:** every plugin runs, in priority order; the results are kept per plugin.
    **Failure:** the process stops with the one line.
    """


@hookspec
def gpudask_scheduler_check(ctx: PlanContext | None, scheduler_facts: ProcessSide,
                            worker_facts: ProcessSide | None) -> list[Finding] | None:
    """Compare two processes of a cluster and report findings.

    **When, where:** called in the scheduler process by gpudask's check runner each time a
    worker joins (and for workers already connected when the runner is registered
    late); and in a client by :func:`gpudask.check`, which compares the client with the
    scheduler and with each worker.

    :param ctx: the :class:`gpudask.pluginapi.PlanContext` of the process running the
        check (its settings, e.g. which packages to compare), or None where that process
        has no plan.
    :param scheduler_facts: the *reference* side, a :class:`gpudask.findings.ProcessSide`
        dict ``{"role", "address", "facts", "protocol", "gpudask", "facts_origin"}``.
        It is the scheduler when a worker is checked in the scheduler and when a client
        is compared with the scheduler; it is a **worker** (``role == "worker"``) when a
        client is compared with that worker.
    :param worker_facts: the side compared with it, same shape (a worker, or the client),
        or None when that process does not run gpudask.  Both sides arrived over the
        network: they are validated plain data (``facts`` is a valid schema-1 dict),
        never unpickled.
    :return: a list of :class:`gpudask.pluginapi.Finding` (or dicts with ``severity``,
        ``code``, ``message``), possibly empty, or None.

    **Combined:** the findings of all plugins are concatenated; each finding's
    ``plugin`` is filled with the plugin's name.  **Failure:** isolated: a plugin that
    raises, or returns something else, becomes one ``plugin-failed`` warning finding
    and the other plugins still run.
    """


@hookspec
def gpudask_plan_finish(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Decide what depends on other plugins' decisions: the last plan step.

    **When, where:** a plan hook (pure), in every process that builds a plan; called for
    every plan after ``gpudask_plan_memory`` (and before the user's exported variables
    replace planned ones).

    A plugin reads another plugin's decisions only here or in a later step than the one
    they were made in, and only through that plugin's *section* of the plan:
    ``plan.section("rmm")`` is the ``rmm`` plugin's section as the earlier steps left it
    (the spill plugin caps its device limit by the pool's maximum size this way).  The
    plugin names the sections it reads in its module attribute ``reads_sections``
    (``reads_sections = ("rmm",)``); reading one it did not name raises.  So the order
    between two plugins is the plan's steps', never their priorities.

    :return: None (ignored); decisions are written as in the other plan hooks, a plugin's
        own with ``plan.set_section(values, why)``.

    **Combined:** every plugin writes into the same plan, in priority order.
    **Failure:** stops the process, as in ``gpudask_validate``.
    """


@hookspec
def gpudask_report_rows(plan: Mapping[str, Any], published: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """The rows this plugin adds to ``gpudask info``, ``gpudask status`` and the ``/gpudask`` page.

    **When, where:** called wherever a plan is shown: by ``gpudask info`` for each process
    of the plan it prints, by ``gpudask status`` (in the client) for each worker, and in the
    scheduler for each worker row of the ``/gpudask`` dashboard page.  Pure: reads its
    arguments only.

    :param plan: a process plan as published (``ProcessPlan.to_dict()``); the plugin reads
        its own section, ``plan["sections"][<plugin name>]``.
    :param published: what the worker published in its startup information
        (``{"applied": ..., "memory": {plugin: setup report}, ...}``), or None where there
        is no running process (``gpudask info``).  Both arrived from another process in
        ``gpudask status`` and on the page: read them defensively (a field of the wrong
        type is skipped, never raised on); gpudask escapes and bounds what is shown.
    :return: a list of rows, or None.  A row is a dict: ``column`` (str, the column's
        header, e.g. ``"pool"``), ``summary`` (str, the short planned form ``gpudask
        info`` and the page show, e.g. ``"pool 4.0 GiB"``), ``planned`` and ``actual``
        (JSON values; ``actual`` None where nothing was read back), optional ``note``
        (str: why the planned value is not in place), ``bytes`` (bool: show the values as
        sizes) and ``keys`` (the applied-state mismatch keys that mark this column ``!``).

    **Combined:** the rows of all plugins, in priority order; a column named twice keeps
    the first.  **Failure:** isolated: a plugin that raises, or returns rows of the wrong
    shape, is left out of the table with one ``warning:`` line; the others are shown.
    """

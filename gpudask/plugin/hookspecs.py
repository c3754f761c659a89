"""The hooks a gpudask plugin can implement: the typed contract.  These docstrings are the reference.

A plugin is a module or an object with a ``name`` (str), a ``priority`` (int, 0-1000, lower
runs first, ties broken by name) and any of the hooks below, each marked with
:data:`gpudask.pluginapi.hookimpl`.  Built-in plugins are registered from
:data:`gpudask.plugin.manager.BUILTIN_PLUGINS`, third-party ones through the ``gpudask`` entry
point group.  Implementations are called one at a time, in priority order, each through
pluggy's hook caller for that plugin alone (``GPUDASK_TRACE_PLUGINS=1`` logs each call).  No
hook is ``firstresult``: how the results combine, and what a failure does, is said per hook;
a failure reads ``gpudask plugin 'x' (from dist) failed in <hook>: <cause>``.  Hook wrappers
(``wrapper=True``, ``hookwrapper=True``) and ``tryfirst``/``trylast`` are refused at
registration (``... failed in registration: <hook> is marked tryfirst=True, which gpudask does
not run; ...``): the order is the plugin's ``priority``.

*Plan hooks* (``gpudask_validate``, ``gpudask_plan_process``, ``gpudask_select_transport``,
``gpudask_plan_memory``, ``gpudask_plan_finish``) are pure: they read the frozen
:class:`~gpudask.plan.PlanContext` and write decisions into a :class:`~gpudask.plan.ProcessPlan`
through its methods, which record the reason and the plugin.  A host plan is built by the
*planning processes* -- ``dask scheduler``, the ``dask worker`` process hosting the nannies (the
*nanny host*), ``dask worker --no-nanny``, a client calling :func:`gpudask.initialize` or
starting a ``LocalGPUCluster`` -- by ``gpudask info``, by the check where the process running it
applied no plan (:func:`gpudask.check`, a scheduler without ``--preload gpudask``), and by
gpudask's ``WorkerPlugin`` / ``SchedulerPlugin`` on a running server.  A nanny's worker process
takes its plan from the host plan its parent wrote and calls no plan hook, unless there is none
(``LocalCluster(preload=["gpudask"])`` without ``gpudask.initialize()``) or it is a worker
beyond those its parent planned for.  ``gpudask_config_options`` runs wherever a plugin manager
is built: each of those processes, every worker process, ``gpudask config``, the docs build.

*Apply hooks* (``gpudask_context_init``, ``gpudask_setup_memory``, ``gpudask_server_setup``,
``gpudask_applied_state``) run in the process the plan is for, at the moment each docstring
names (``Called in:``), with the plan already computed; they must not re-decide.

``gpudask_scheduler_check`` compares two processes' published facts, a *reference* and a
*subject* (the fields of the same names of each :class:`~gpudask.findings.Finding`).

The annotations are imported for type checkers only: this module stays as light as ``import gpudask``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from distributed import Nanny, Scheduler, Worker

    from gpudask.config import Option
    from gpudask.facts.model import Facts
    from gpudask.facts.sections import FactsSection
    from gpudask.findings import Finding, ProcessSide
    from gpudask.plan.context import PlanContext
    from gpudask.plan.model import ProcessPlan

PROJECT = "gpudask"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def gpudask_config_options() -> list[Option]:
    """Declare the settings this plugin reads.

    **When:** when gpudask reads its settings, before any other hook of the same plugin
    manager.  **Called in:** every process that builds a plugin manager: the planning
    processes, every worker process (its settings are read there, its plan comes from its
    parent), the ``gpudask`` commands, ``LocalGPUCluster``'s dask-cuda arguments, the docs build.

    :return: a list of :class:`gpudask.pluginapi.Option` (default, one-line description,
        parser raising :class:`ValueError` with the accepted form, optional ``legacy`` dask
        config keys), keys under ``gpudask.`` (``gpudask.<plugin-name>.<option>`` by
        convention).  Plugins read values with ``ctx.require(key)`` or ``ctx.value(key)`` (one
        line naming the key when no loaded plugin declares it), or ``ctx.setting(key)`` (None
        then) for another plugin's option.

    **Combined:** all plugins' lists, after gpudask's core options.  **Failure:** raising, or
    returning something that is not an ``Option`` under ``gpudask.``, stops the process (one
    line naming the plugin).
    """


@hookspec
def gpudask_facts_sections() -> list[FactsSection] | None:
    """Declare the facts this plugin owns: its sections of a host's facts.

    **When:** when gpudask reads a host's facts for a plan, after ``gpudask_config_options``
    and before ``gpudask_validate``.  **Called in:** every process that builds plan inputs:
    the planning processes, every worker process, ``gpudask info`` / ``check``, ``LocalGPUCluster``.

    :return: a list of :class:`gpudask.pluginapi.FactsSection` ``(name, schema, probe)``
        (optional ``check``, ``summary``, ``decides``: its docstring says), or None.  On a real
        host ``probe(facts)`` (the core's facts: GPUs, interfaces, versions) runs once per
        process that probes; on a described host the value is the facts file's ``{"sections":
        {name: ...}}``.  Either way it is checked against ``schema`` (a JSON Schema fragment;
        its ``x-accepts`` texts are what the error says is accepted), handed on with the facts
        (a nanny's workers, the published facts) and read with ``ctx.facts.section(name)`` --
        None when a described host does not say.

    **Combined:** the sections of all plugins, each name owned by one plugin.  **Failure:**
    raising, returning something that is not a ``FactsSection``, a name another plugin owns,
    a schema that is not JSON Schema, a probe or a check that raises, or a value its schema or
    check refuses stops the process (one line naming the plugin, the file or the probe, and the key).
    """


@hookspec
def gpudask_facts_packages() -> dict[str, list[str]] | None:
    """Name the installed packages this plugin reads from ``ctx.facts.packages``.

    **When:** before this host is probed for a plan.  **Called in:** every process that
    builds plan inputs on a real host (a described host's file lists its packages).

    :return: ``{key: [distribution, ...]}`` or None: ``facts.packages[key]`` is the version of
        the first of the distributions installed (``{"rmm": ["rmm", "rmm-cu12", "rmm-cu13"]}``),
        None when none is.  The core probes only its own (``python``, ``dask``,
        ``distributed``, ``nvidia-ml-py``, ``gpudask``).

    **Combined:** the keys of all plugins; a key two plugins name keeps the first one's
    distributions (priority order).  **Failure:** raising or returning anything else stops the
    process (one line naming the plugin).
    """


@hookspec
def gpudask_preimport(facts: Facts, role: str, protocol: str | None) -> list[str] | None:
    """Name the modules a process of ``role`` on this host imports as it starts, so gpudask can
    import them ahead of time, off the start's critical path.

    **When:** once the plan inputs are built: with ``role="nanny"`` and ``protocol=None`` by the
    ``dask worker`` process waiting for the scheduler's file (name what a likely protocol
    needs); with ``role="worker"`` by a process starting a fork server for its workers (imported
    before it forks any), and in each forked worker, to say which it found imported.
    **Called in:** the nanny host, a client starting a ``LocalGPUCluster`` and their forked
    workers, on a host planned for forkserver.

    :param facts: the host's facts (GPUs, installed packages, the plugins' sections).
    :param role: ``"nanny"`` or ``"worker"``.
    :param protocol: the plan's protocol, or None while the scheduler's is not known.
    :return: dotted module names (``["rmm", "rmm.allocators.cupy"]``), or None.  Importing
        them must create no CUDA context, open no UCX context and not import gpudask: the fork
        server's children are GPU workers that apply their own plan at their first ``import
        gpudask``.  A module that fails to import is left out with one debug line.

    **Combined:** every answer's names, in priority order, each once; the worker's applied
    state says which it found imported (``startup.preimported``).  **Failure:** raising or
    returning anything but a list of at most 32 module names stops the process (one line
    naming the plugin).
    """


@hookspec
def gpudask_likely_protocol(facts: Facts) -> str | None:
    """Name the protocol this host's scheduler most likely listens on, so that a ``dask worker``
    started before its scheduler can plan and apply for it while it waits.

    **When:** once the plan inputs are built, by a ``dask worker`` process (nanny host) given no
    ``--protocol`` whose ``--scheduler-file`` is not written yet.  gpudask plans and applies for
    that protocol (fork server, host plan, ``gpudask_listen_ahead``) while it waits for the
    file; if the scheduler listens on another, the environment and dask config are put back as
    the user had them and it plans again, with one info line.  ``gpudask.start.plan-ahead:
    false`` turns it off.  **Called in:** the nanny host only.

    :param facts: the host's facts (GPUs, installed packages, the plugins' sections).
    :return: a protocol name of distributed's (``"ucx"``, ``"tcp"``), or None: no guess.

    **Combined:** the first answer in priority order that is not None.  **Failure:** raising
    or returning anything but None or a short protocol name stops the process (one line
    naming the plugin).
    """


@hookspec
def gpudask_ucx_offered(facts: Facts) -> list[str] | None:
    """Say which transports this host's UCX offers: the names a user's ``UCX_TLS`` may use
    beside UCX's own aliases and transport names.

    **When:** once per host plan over UCX, before ``gpudask_validate``, for the core's check of
    the user's ``UCX_TLS``.  **Called in:** every process that builds a host plan over UCX.

    :param facts: the host's facts, the plugins' sections included.
    :return: the transport names (``["cma", "rc_mlx5", "self", "tcp"]``), or None when this
        plugin does not know them.  The built-in ``tcp`` plugin answers from its facts section
        (what ``ucx_info -d`` lists).

    **Combined:** the names of every answer together; None when no plugin knows (``UCX_TLS`` is
    then checked against UCX's own names only).  A ``UCX_TLS`` naming anything else is refused
    in one line that lists what the host offers.  **Failure:** raising or returning anything
    but a list of strings stops the process (one line naming the plugin).
    """


@hookspec
def gpudask_validate(ctx: PlanContext) -> None:
    """Check the settings and the facts before any plugin decides.

    **When:** once per host plan, after all options are parsed and before any other plan hook.
    **Called in:** every process that builds a host plan (the module docstring lists them);
    never in a worker process that takes its plan from its parent.

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

    **When:** a plan hook (pure), called for the scheduler plan, the nanny-host plan, the
    client plan and each worker plan, in that order, after ``gpudask_validate`` and before
    transport selection (transport and memory depend on the GPU).  **Called in:** as
    ``gpudask_validate``: a planning process plans every process of its host, so a worker's
    plan is made in its parent.

    :param ctx: the :class:`gpudask.pluginapi.PlanContext`.
    :param plan: the :class:`gpudask.pluginapi.ProcessPlan` to fill; ``plan.role`` is
        ``"scheduler"``, ``"nanny"`` (the process hosting nannies: the ``dask worker`` CLI),
        ``"client"`` or ``"worker"``; ``plan.index`` is the worker number.
    :return: None (ignored); decisions are written with ``plan.set_gpu``, ``plan.set_env``,
        ``plan.set_config``, ``plan.set_cpu_affinity``, ``plan.set_multiprocessing_method``,
        ``plan.set_resource``, ``plan.note``.

    **Combined:** every plugin writes into the same plan, in priority order; a later plugin
    sees (and may override) an earlier one's decisions.  **Failure:** as ``gpudask_validate``.
    """


@hookspec
def gpudask_select_transport(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Contribute to the transport of a process (UCX transports, environment, interface).

    **When:** a plan hook (pure), called for every plan of the host after
    ``gpudask_plan_process``.  **Called in:** as ``gpudask_validate``.

    Each plugin adds the UCX transports it needs with ``plan.add_ucx_transport(name, why)``;
    it may set ``UCX_*`` variables with ``plan.set_env``, ``distributed-ucxx.*`` keys with
    ``plan.set_config`` and the interface with ``plan.set_interface``.  Nothing is contributed
    when ``ctx.uses_ucx`` is false unless the plugin has a reason to (the interface, say).  Read
    a user's ``UCX_TLS`` with ``gpudask.pluginapi.parse_ucx_tls`` / ``tls_enables`` only.

    :return: None (ignored).

    **Combined:** additive; after the last plugin gpudask composes ``UCX_TLS`` from all
    contributions (unless the user exported ``UCX_TLS`` or a plugin set it, which then wins).
    **Failure:** as ``gpudask_validate``.
    """


@hookspec
def gpudask_plan_memory(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Decide the device-memory setup of a process (allocator, pool sizes).

    **When:** a plan hook (pure), called for every plan of the host after ``UCX_TLS`` is
    composed, so ``plan.ucx_transports`` and ``plan.env["UCX_TLS"]`` are known.
    **Called in:** as ``gpudask_validate``.

    :return: None (ignored); write the decision into the plugin's own section with
        ``plan.set_section({...}, why)`` (the rmm plugin: allocator, pool sizes in bytes
        resolved for this process's GPU); ``gpudask_setup_memory`` reads it back.

    **Combined:** each plugin writes its own section; one written by another plugin in this
    step is not visible yet (``plan.section`` shows the earlier steps': ``gpudask_plan_finish``
    reads this one's).  **Failure:** as ``gpudask_validate``.
    """


@hookspec
def gpudask_context_init(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Prepare the CUDA context of the current process before UCX initialises.

    **When:** an apply hook, called once per process when gpudask applies its plan, after the
    plan's environment, config and CPU binding and before ``listen()``: the last moment
    ``CUDA_VISIBLE_DEVICES`` and ``UCX_*`` still take effect.  **Called in:** a ``dask
    scheduler``, a nanny host and a ``dask worker --no-nanny`` started with ``--preload
    gpudask`` (at the import of the preload); each worker process of a nanny, at its first
    import of gpudask; a client, in :func:`gpudask.initialize` and ``LocalGPUCluster``.  Not
    where gpudask arrives too late: a scheduler or worker inside a client's process (a
    ``LocalCluster``), gpudask's ``WorkerPlugin`` / ``SchedulerPlugin`` on a running server.

    Implementations detect existing contexts (without creating one), create the worker's
    context on its own GPU when UCX needs it, and verify it; nothing touching a real device
    may run when the facts are described (``ctx.facts.described``).

    :return: None (ignored).

    **Combined:** every plugin runs, in priority order.  **Failure:** raise
    :class:`gpudask.pluginapi.GpudaskError`: the process stops with the one line.
    """


@hookspec
def gpudask_listen_ahead(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Do now what this process's first ``listen()`` will do (open the transport), while it
    waits for its scheduler.

    **When:** an apply hook, called once, right after the process applied a plan made ahead for
    the protocol ``gpudask_likely_protocol`` named (``ctx.protocol``), before it waits for the
    scheduler's file, unless another ``--preload`` follows gpudask's (its import may still
    change what the transport reads).  **Called in:** the nanny host only; on a described host
    (``ctx.facts.described``) too, so what runs must work on the machine at hand.

    Work done here must leave the process as its own ``listen()`` would: the same settings read
    (the plan's environment and config are applied), nothing that the real listen does twice.

    :return: None (ignored).

    **Combined:** every plugin runs, in priority order.  **Failure:** one debug line and the
    process goes on: its own ``listen()`` meets the cause again and reports it where it would
    have (an implementation must leave nothing half-open behind it).
    """


@hookspec
def gpudask_setup_memory(ctx: PlanContext, plan: ProcessPlan) -> dict[str, Any] | None:
    """Apply the plugin's memory decision (its section of ``plan``) in a worker process.

    **When:** an apply hook, called right after ``gpudask_context_init`` when a worker process
    applies its plan (before the first connection and task), or in a running worker when
    gpudask's ``WorkerPlugin`` is registered and the worker uses the GPU its plan names; **once
    per process** (a later request gets the reports kept: a pool is never built twice).
    **Called in:** worker processes (``--preload gpudask``, ``--preload-nanny gpudask``,
    ``--no-nanny``, or a ``Worker`` gpudask's ``WorkerPlugin`` is registered on, a thread-based
    worker in a client's process included); never in a scheduler, a nanny host or a client.

    :return: a JSON-compatible dict describing what was set up (published in the worker's
        startup information under ``gpudask.memory.<plugin name>``), or None.

    **Combined:** a dict ``{plugin name: report}`` of the non-None reports.  **Failure:** raise
    to stop the worker: a worker never starts without the pool it was asked for (the one line
    names the plugin, the hook and the cause).
    """


@hookspec
def gpudask_server_setup(ctx: PlanContext, plan: ProcessPlan, server: Scheduler | Worker | Nanny) -> None:
    """Act on the server once it runs: add plugins, metrics, startup information, resources.

    **When:** an apply hook, called once per server (``server``: the ``Worker``, ``Nanny`` or
    ``Scheduler``) from gpudask's ``dask_setup`` (after ``listen()``, before a worker
    registers), or, on a server gpudask was not preloaded into, when gpudask's
    ``WorkerPlugin`` (``Worker.setup``) or ``SchedulerPlugin`` (its ``start``) is registered.
    **Called in:** a ``dask scheduler`` (``--preload gpudask`` or ``SchedulerPlugin``); each
    worker process (``--preload gpudask``, ``--preload-nanny gpudask`` or ``WorkerPlugin``); a
    nanny only with ``--preload-nanny gpudask`` (not ``NannyPlugin``); a scheduler or worker in
    a client's process started with ``preload=["gpudask"]``.  Never in the ``dask worker`` CLI's
    process, nor a client.

    :return: None (ignored).

    **Combined:** every plugin runs, in priority order.  **Failure:** the process stops with
    the one line (a server never runs half-configured).
    """


@hookspec
def gpudask_client_setup(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Act in a client process once its plan is applied: how its clients talk to a cluster.

    **When:** an apply hook, called once per process, right after ``gpudask_context_init`` when
    a client applies its plan: :func:`gpudask.initialize` and ``LocalGPUCluster``.
    Implementations change what the process's ``distributed.Client`` objects do (what a graph
    carries, how results travel), for every client the process creates afterwards.
    **Called in:** a client process only.

    :return: None (ignored).

    **Combined:** every plugin runs, in priority order.  **Failure:** raise
    :class:`gpudask.pluginapi.GpudaskError`: ``initialize()`` raises with the one line.
    """


@hookspec
def gpudask_applied_state(ctx: PlanContext, plan: ProcessPlan) -> dict[str, dict[str, Any]] | None:
    """Read back, from the live process, what this plugin applied: the proof of effect.

    **When:** an apply hook, called once per server right after ``gpudask_server_setup`` in
    gpudask's ``dask_setup``, when gpudask records the applied state (for ``gpudask status``
    and the scheduler check).  Read only: never change anything.  **Called in:** only a process
    that applied its own plan at import and runs a server (a ``dask scheduler`` or a worker
    process with ``--preload gpudask``); never where ``WorkerPlugin`` / ``SchedulerPlugin``
    were registered, nor in a nanny host, a nanny, a client or a server in a client's process.

    :return: ``{key: {"planned": value, "actual": value}}`` for what this plugin decided and
        can read back (JSON-compatible values), or None.  A key whose two values differ is a
        *mismatch* (process, key, planned, actual, this plugin): an error in the log, a
        ``not-applied`` error finding of the scheduler check, a row in ``gpudask status``.

    **Combined:** every plugin runs, in priority order; the results are kept per plugin.
    **Failure:** the process stops with the one line.
    """


@hookspec
def gpudask_scheduler_check(ctx: PlanContext | None, reference: ProcessSide,
                            subject: ProcessSide | None) -> list[Finding] | None:
    """Compare a process of a cluster (the subject) with another (the reference); report findings.

    **When:** called by gpudask's check runner each time a worker joins the scheduler (and,
    for a runner registered late, for each worker already connected), in a thread, never on
    the scheduler's event loop; and by :func:`gpudask.check` (``gpudask check``), which compares
    the client with the scheduler and with each worker.  **Called in:** the scheduler process
    (``--preload gpudask``, ``SchedulerPlugin``, or the ``SchedulerCheck`` plugin a client
    registers) and the client process running :func:`gpudask.check`.

    :param ctx: the :class:`gpudask.pluginapi.PlanContext` of the process running the check
        (its settings, e.g. which packages to compare), or None where that process has no plan.
    :param reference: the side compared with, a :class:`gpudask.pluginapi.ProcessSide` dict
        ``{"role", "address", "facts", "protocol", "gpudask", "facts_origin"}``: the scheduler
        when a worker is checked in the scheduler and when a client is compared with the
        scheduler; a **worker** (``role == "worker"``) when a client is compared with that
        worker.
    :param subject: the side being checked, same shape: a worker (in the scheduler) or the
        client (in :func:`gpudask.check`); None when that process does not run gpudask.  Both
        sides arrived over the network or were read here: validated plain data (``facts`` is a
        valid schema-2 dict), never unpickled.
    :return: a list of :class:`gpudask.pluginapi.Finding` (or dicts with ``severity``,
        ``code``, ``message``), possibly empty, or None.

    **Combined:** the findings of all plugins, concatenated; each finding's ``plugin`` is the
    plugin's name unless set, its ``subject`` and ``reference`` the two sides' names.
    **Failure:** isolated: a plugin that raises, or returns something else, becomes one
    ``plugin-failed`` warning finding and the other plugins still run.
    """


@hookspec
def gpudask_plan_finish(ctx: PlanContext, plan: ProcessPlan) -> None:
    """Decide what depends on other plugins' decisions: the last plan step.

    **When:** a plan hook (pure), called for every plan of the host after
    ``gpudask_plan_memory`` (and before the user's exported variables replace planned ones).
    **Called in:** as ``gpudask_validate``.

    A plugin reads another plugin's decisions only in a later step than the one they were made
    in, and only through that plugin's *section*: ``plan.section("rmm")`` is the ``rmm``
    plugin's section as the earlier steps left it (the spill plugin caps its device limit by
    the pool's maximum size this way).  The sections read are named in the module attribute
    ``reads_sections`` (``("rmm",)``); reading another raises.  So the order between two plugins
    is the plan's steps', never their priorities.

    :return: None (ignored); decisions are written as in the other plan hooks, a plugin's own
        with ``plan.set_section(values, why)``.

    **Combined:** every plugin writes into the same plan, in priority order.
    **Failure:** as ``gpudask_validate``.
    """


@hookspec
def gpudask_report_rows(plan: Mapping[str, Any], published: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """The rows this plugin adds to ``gpudask info``, ``gpudask status`` and the ``/gpudask`` page.

    **When:** wherever a plan is shown, once per process shown.  Pure: reads its arguments
    only.  **Called in:** ``gpudask info`` (each process of the plan it prints), the client of
    ``gpudask status`` (each worker), the scheduler serving the ``/gpudask`` page (each worker).

    :param plan: a process plan as published (``ProcessPlan.to_dict()``); the plugin reads its
        own section, ``plan["sections"][<plugin name>]``.
    :param published: what the worker published in its startup information (``{"applied":
        ..., "memory": {plugin: setup report}, ...}``), or None where there is no running
        process (``gpudask info``).  Both arrived from another process in ``gpudask status`` and
        on the page: read them defensively (a field of the wrong type is skipped, never raised
        on); gpudask escapes and bounds what is shown.
    :return: a list of rows, or None.  A row is a dict: ``column`` (str, the column's header,
        e.g. ``"pool"``), ``summary`` (str, the short planned form ``gpudask info`` and the page
        show, e.g. ``"pool 4.0 GiB"``), ``planned`` and ``actual`` (JSON values; ``actual`` None
        where nothing was read back), optional ``note`` (str: why the planned value is not in
        place), ``bytes`` (bool: show the values as sizes) and ``keys`` (the applied-state
        mismatch keys that mark this column ``!``).

    **Combined:** the rows of all plugins, in priority order; a column named twice keeps the
    first plugin's row, with a warning naming both plugins once per process.  **Failure:**
    isolated: a plugin that raises, or returns rows of the wrong shape, is left out of the
    table with one ``warning:`` line; the others are shown.
    """

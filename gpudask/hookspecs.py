"""The hooks a gpudask plugin can implement.  These docstrings are the reference.

A plugin is a module or an object that carries a ``name`` (str) and a ``priority``
(int, 0-1000, lower runs first; ties are broken by name) and implements any of the
hooks below, each marked with :data:`gpudask.hookimpl`.  Built-in plugins and
third-party ones are found the same way: the ``gpudask`` entry point group.

Two kinds of hooks exist:

*Plan hooks* (``gpudask_plan_process``, ``gpudask_select_transport``,
``gpudask_plan_memory``) are pure: they read ``ctx`` (facts, settings, protocol) and
write decisions into a :class:`gpudask.plan.ProcessPlan` through its methods, which
record the reason and the plugin.  They run wherever a plan is needed -- in
``gpudask info`` on a laptop, in the ``dask worker`` CLI process, in each worker
process -- and must have no side effects.

*Apply hooks* (``gpudask_context_init``, ``gpudask_setup_memory``,
``gpudask_preload``, ``gpudask_scheduler_check``) run in the process that the plan is
for, at the moment named in each docstring.  They receive the plan already computed
and must not re-decide.

All hooks are called by gpudask one implementation at a time, in priority order, so a
failure is reported as ``gpudask plugin 'x' (from dist) failed in <hook>: <cause>``.
Hook wrappers (``wrapper=True``) are not supported.
"""

from __future__ import annotations

import pluggy

PROJECT = "gpudask"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def gpudask_config_options():
    """Declare the settings this plugin reads.

    Called once per process when the plugin manager loads, before any other hook,
    in every process gpudask runs in (CLI, nanny host, worker, scheduler, client).

    :return: a list of :class:`gpudask.config.Option`.  Keys must live under
        ``gpudask.`` (``gpudask.<plugin-name>.<option>`` by convention).  Each option
        carries its default, a one-line description (used for the generated
        configuration reference), a parser that turns raw values into typed ones
        and raises :class:`ValueError` with the accepted form, and optional
        ``legacy`` keys (other dask config keys honoured when the gpudask key is
        not set explicitly).
    """


@hookspec
def gpudask_validate(ctx):
    """Check the settings and the facts before any plugin acts.

    Called after all options are parsed and before any plan hook, in every process
    that builds a plan (including ``gpudask info``).  Raising here stops the process
    from starting: a worker refuses to start rather than start half-configured.

    :param ctx: the :class:`gpudask.context.PlanContext` (facts, settings, protocol,
        number of workers).
    :raises gpudask.errors.ConfigError: with a one-line message naming the key, the
        value, and what is accepted.
    :return: ignored.
    """


@hookspec
def gpudask_plan_process(ctx, plan):
    """Decide how a process starts: its GPU, CPU affinity, start method, dask config.

    Plan hook (pure).  Called once for the scheduler plan, the nanny-host plan, the
    client plan and each worker plan, in that order, before transport selection
    (transport and memory decisions depend on the worker's GPU).

    :param ctx: the :class:`gpudask.context.PlanContext`.
    :param plan: the :class:`gpudask.plan.ProcessPlan` to fill; ``plan.role`` is one
        of ``"scheduler"``, ``"nanny"`` (the process hosting nannies: the
        ``dask worker`` CLI), ``"client"``, ``"worker"``; ``plan.index`` is the worker
        number for workers.
    :return: ignored; write decisions with ``plan.set_gpu``, ``plan.set_env``,
        ``plan.set_config``, ``plan.set_cpu_affinity``,
        ``plan.set_multiprocessing_method``, ``plan.note``.
    """


@hookspec
def gpudask_select_transport(ctx, plan):
    """Contribute to the transport of a process (UCX transports, environment, interface).

    Plan hook (pure).  Called for every plan after ``gpudask_plan_process``.  Several
    plugins contribute: each adds the UCX transports it needs with
    ``plan.add_ucx_transport(name, why)``; after the last plugin, gpudask composes
    ``UCX_TLS`` from all contributions (unless the user set ``UCX_TLS``, which always
    wins).  A plugin may also set ``UCX_*`` variables with ``plan.set_env``,
    ``distributed-ucxx.*`` keys with ``plan.set_config`` and the interface with
    ``plan.set_interface``.  Nothing is contributed when ``ctx.protocol`` is not UCX
    unless the plugin has a reason to (the interface, say).

    :return: ignored.
    """


@hookspec
def gpudask_plan_memory(ctx, plan):
    """Decide the device-memory setup of a process (allocator, pool sizes).

    Plan hook (pure).  Called for every plan after transport selection, so
    ``plan.ucx_transports`` is known.  Write the decision with ``plan.set_memory``;
    sizes must already be validated and resolved to bytes for this worker's GPU.

    :return: ignored.
    """


@hookspec
def gpudask_context_init(ctx, plan):
    """Prepare the CUDA context of the current process before UCX initialises.

    Apply hook.  Called in every process gpudask is preloaded into (scheduler,
    nanny host, worker) and in the client by :func:`gpudask.initialize`, at import time
    of the preload -- i.e. in ``Worker.__init__`` / ``Nanny.__init__`` /
    ``Scheduler.__init__`` before ``listen()`` -- after gpudask has applied the plan's
    environment and config to the process.  This is the last moment at which
    ``CUDA_VISIBLE_DEVICES`` and ``UCX_*`` still take effect.

    Implementations detect existing contexts (without creating one), create the
    worker's context on its own GPU when UCX needs it, and verify it.  When the facts
    are described (``ctx.facts.described``) nothing touching a real device may run.

    :return: ignored.  Raise :class:`gpudask.errors.GpudaskError` to stop the process.
    """


@hookspec
def gpudask_setup_memory(ctx, plan):
    """Apply the memory decision of ``plan.memory`` in a worker process.

    Apply hook.  Called only in worker processes (never nanny, CLI, client), at import
    time of the preload right after ``gpudask_context_init`` -- so before the first
    connection and the first task -- and again by gpudask's WorkerPlugin when it is
    registered on a running worker (``client.register_plugin``).  Raise to stop the
    worker: a worker never starts without the pool it was asked for.

    :return: a JSON-compatible dict describing what was set up (published in the
        worker's startup information under ``gpudask``), or ``None``.
    """


@hookspec
def gpudask_preload(ctx, plan, server):
    """Act on the running server (``dask_setup`` time).

    Apply hook.  Called with ``server`` a ``Worker``, ``Nanny`` or ``Scheduler`` from
    gpudask's ``dask_setup`` (after ``listen()``, before the worker registers with the
    scheduler), and from gpudask's WorkerPlugin / NannyPlugin / SchedulerPlugin when
    they are registered on a running cluster.  Use it to add plugins, metrics,
    startup information or resources.

    :return: ignored.
    """


@hookspec
def gpudask_scheduler_check(ctx, scheduler_facts, worker_facts):
    """Compare a worker (or a client) with the scheduler and report findings.

    Apply hook.  Called in the scheduler process by gpudask's SchedulerPlugin each time
    a worker joins (and for workers already connected when the plugin is registered
    late), and in a client by :func:`gpudask.check`.

    :param scheduler_facts: the reference side, a JSON-compatible dict
        ``{"role", "address", "facts" (schema 1), "protocol", "gpudask" (version),
        "facts_origin"}`` -- the scheduler, or a worker when the client is compared.
    :param worker_facts: the same shape for the other side (a worker or the client),
        or ``None`` when that process does not run gpudask.  It arrived over the network:
        treat it as untrusted data (types are validated, nothing is unpickled).
    :return: a list of :class:`gpudask.findings.Finding` (may be empty).  A plugin that
        raises, or returns something else, becomes a ``plugin-failed`` finding; the other
        plugins still run.
    """

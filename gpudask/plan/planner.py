"""plan inputs -> HostPlan, pure: ``gpudask_validate`` once, then for every process of the
host ``gpudask_plan_process``, ``gpudask_select_transport``, UCX_TLS composed from the plugins'
contributions, ``gpudask_plan_memory``, ``gpudask_plan_finish``; last the user's explicit
environment and ``--interface`` win over what was detected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpudask.errors import ConfigError
from gpudask.plan.context import PlanContext
from gpudask.plan.host_plan import HostPlan, UserValues
from gpudask.plan.model import ProcessPlan

if TYPE_CHECKING:
    from gpudask.plan.inputs import PlanInputs

# gpudask's own bookkeeping variables travel to child processes but are not decisions
INTERNAL_ENV_PREFIX = "GPUDASK_"

# a plan hook call at least this long is warned about (nothing can stop a slow one)
SLOW_PLAN_HOOK_S = 1.0
PLAN_HOOKS = ("gpudask_validate", "gpudask_plan_process", "gpudask_select_transport", "gpudask_plan_memory",
              "gpudask_plan_finish")


MAX_NWORKERS = 4096  # worker processes gpudask plans for on one host (its worker numbers: 0..4095)


def check_nworkers(nworkers: Any, name: str = "nworkers") -> None:
    """:raises ConfigError: one line when ``nworkers`` is not a count gpudask plans for."""
    if nworkers is None:
        return
    if isinstance(nworkers, bool) or not isinstance(nworkers, int) or not 0 <= nworkers <= MAX_NWORKERS:
        raise ConfigError(f"{name}={nworkers!r:.40} is not valid; accepted: an integer from 0 to {MAX_NWORKERS} "
                          "(worker processes on one host)")


def build_plan(inputs: PlanInputs, protocol: str = "tcp", nworkers: int | None = None,
               user_interface: str | None = None, planner: str | None = None) -> HostPlan:
    """The plan for every process on the host of ``inputs``.  ``user_interface``: a ``dask worker
    --interface`` the user gave; ``planner``: :attr:`PlanContext.planner`.

    :raises ConfigError: a protocol distributed does not know (one line)."""
    check_protocol(protocol)
    check_nworkers(nworkers)
    facts, manager = inputs.facts, inputs.manager
    if nworkers is None:
        nworkers = max(1, len(facts.visible_gpus()))
    ctx = PlanContext(facts, inputs.settings, protocol, nworkers, inputs.user_env, inputs.user_config,
                      user_interface=user_interface, manager=manager, planner=planner)
    _note_visible_devices(ctx)
    if ctx.uses_ucx:
        from gpudask.plan.ucx_tls import check_user_tls

        # the names this host's UCX offers, as the plugin that probes UCX says (gpudask_ucx_offered)
        check_user_tls(ctx.user_env.get("UCX_TLS"), manager.ucx_offered(facts))
    plans = [ProcessPlan("scheduler"), ProcessPlan("nanny"), ProcessPlan("client")]
    plans += [ProcessPlan("worker", index=i) for i in range(nworkers)]
    ctx.plans.extend(plans)
    with _timed_plan_hooks(manager, ctx):
        manager.validate(ctx)
        for step in (manager.plan_process, manager.select_transport, _compose_ucx_tls, manager.plan_memory,
                     manager.plan_finish, _explicit_env_wins, _explicit_interface_wins):
            for plan in plans:
                step(ctx, plan)
    scheduler, nanny, client, *workers = plans
    return HostPlan(facts, protocol, nworkers, [p.to_dict() for p in manager.plugins],
                    scheduler, nanny, client, workers, ctx.warnings, _user_values(ctx, plans), ctx=ctx)


def check_protocol(protocol: str) -> None:
    """A protocol distributed knows (its own, those packages register, and ucx/ucxx, whose
    missing package the transport plugins name)."""
    import importlib.metadata

    from distributed.comm.registry import backends

    # a scheduler may listen on several (``dask scheduler --protocol tcp,ws``)
    given = [p.strip() for p in protocol.split(",")] if protocol else [""]
    known = set(backends) | {"ucx", "ucxx"}
    if all(p in known for p in given):
        return  # the entry points are read only for a name not known yet (a scan of every package: 5 ms)
    known |= {ep.name for ep in importlib.metadata.entry_points(group="distributed.comm.backends")}
    if any(p not in known for p in given):
        raise ConfigError(f"protocol {protocol!r} is not valid; accepted: {', '.join(sorted(known))}, or several "
                          "separated by commas")


def _user_values(ctx: PlanContext, plans: list[ProcessPlan]) -> UserValues:
    """The user's value of every variable and dask config key any process of the plan sets."""
    import dask.config

    names = sorted({n for p in plans for n in p.env})
    keys = sorted({k for p in plans for k in p.config})
    config = dict(ctx.user_config)
    return UserValues({n: ctx.user_env.get(n) for n in names},
                      {k: dask.config.get(k, default=None, config=config) for k in keys})


@contextlib.contextmanager
def _timed_plan_hooks(manager: Any, ctx: PlanContext) -> Iterator[None]:
    """A plan hook call of :data:`SLOW_PLAN_HOOK_S` or more: one warning per plugin and hook."""
    spent: dict[tuple[str, str], list[float]] = {}

    def observe(plugin: str, hook: str, seconds: float) -> None:
        if hook in PLAN_HOOKS:
            spent.setdefault((plugin, hook), []).append(seconds)

    try:
        with manager.timing(observe):
            yield
    finally:
        for (plugin, hook), times in spent.items():
            if max(times) >= SLOW_PLAN_HOOK_S:
                ctx.warn(f"plugin {plugin!r} took {sum(times):.1f} s in {hook} ({len(times)} call(s), the longest "
                         f"{max(times):.1f} s): plan hooks run before every dask scheduler / dask worker / gpudask "
                         "info starts, once per process of the host, and cannot be stopped; a slow one delays "
                         "every start")


def _note_visible_devices(ctx: PlanContext) -> None:
    """CUDA_VISIBLE_DEVICES that cannot take effect is said once, not failed on."""
    facts, user_cvd = ctx.facts, ctx.user_env.get("CUDA_VISIBLE_DEVICES")
    if facts.cvd_ignored:
        # a login node, a container started without GPUs: CUDA would show nothing either
        ctx.warn(f"NVML sees no GPU on {facts.hostname} while CUDA_VISIBLE_DEVICES={facts.cuda_visible_devices} "
                 "is set: planning for a host without GPUs")
    elif facts.described and user_cvd is not None and user_cvd != facts.cuda_visible_devices:
        shown = "unset" if facts.cuda_visible_devices is None else repr(facts.cuda_visible_devices)
        ctx.warn(f"CUDA_VISIBLE_DEVICES={user_cvd} in the environment is ignored: the host is described by "
                 f"{facts.origin}, whose cuda_visible_devices ({shown}) is used")


def _compose_ucx_tls(ctx: PlanContext, plan: ProcessPlan) -> None:
    """One UCX_TLS from every plugin's contribution (transport selection is additive)."""
    if not ctx.uses_ucx or not plan.ucx_transports or "UCX_TLS" in plan.env:
        return
    plan.acting_plugin = "gpudask"
    detected = ",".join(plan.ucx_transports)
    if ctx.user_env.get("UCX_TLS"):
        plan.set_env("UCX_TLS", ctx.user_env["UCX_TLS"],
                     f"set by you in the environment: explicit settings win (detection chose {detected})")
        return
    contributors = sorted({r.plugin for r in plan.reasons if r.decision.startswith("UCX transport ")})
    plan.set_env("UCX_TLS", detected, f"transports contributed by {', '.join(contributors)}")


def _explicit_env_wins(ctx: PlanContext, plan: ProcessPlan) -> None:
    """A variable the user exported beats any detection (CUDA_VISIBLE_DEVICES is an input, not a rival)."""
    for name in list(plan.env):
        if name == "CUDA_VISIBLE_DEVICES" or name.startswith(INTERNAL_ENV_PREFIX):
            continue
        user = ctx.user_env.get(name)
        if user is not None and user != plan.env[name]:
            planned = plan.env[name]
            plan.env[name] = user
            plan.note(f"{name}={user}", f"set in the environment (explicit settings win; detection chose {planned})")
            continue
        # distributed-ucxx.environment.<name> is the user's UCX_<NAME>; an exported UCX_* would
        # beat it (distributed-ucxx prefers the environment), so gpudask exports none there
        configured = _ucxx_environment(ctx).get(name)
        if user is None and configured is not None and name.startswith("UCX_"):
            planned = plan.env.pop(name)
            plan.note(f"{name} not exported", f"distributed-ucxx.environment sets it to {configured!r} (explicit "
                                              f"settings win; detection chose {planned})")


def _ucxx_environment(ctx: PlanContext) -> dict[str, str]:
    """``distributed-ucxx.environment`` of the user's config, as UCX_* names."""
    import dask.config

    env = dask.config.get("distributed-ucxx.environment", default=None, config=dict(ctx.user_config)) or {}
    if not isinstance(env, dict):
        return {}
    return {"UCX_" + str(k).upper().replace("-", "_"): str(v) for k, v in env.items()}


def _explicit_interface_wins(ctx: PlanContext, plan: ProcessPlan) -> None:
    """``dask worker --interface X`` beats the interface detection chose for workers."""
    if plan.role != "worker" or not ctx.user_interface or plan.interface == ctx.user_interface:
        return
    planned = plan.interface
    plan.acting_plugin = "gpudask"
    plan.set_interface(ctx.user_interface, "dask worker --interface (explicit settings win"
                       + (f"; detection chose {planned})" if planned else ")"))

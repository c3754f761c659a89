"""The plan for this (or a described) host, from the process's settings and facts.

:func:`plan_host` is what ``gpudask info`` prints and what a scheduler, nanny host or
worker applies: the same inputs give the same plan everywhere.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from gpudask.plan.model import HostPlan


def plan_host(protocol: str | None = None, nworkers: int | None = None, facts_path: str | None = None,
              config_file: str | None = None, extra_plugins: Iterable[Any] = (),
              user_interface: str | None = None, user_env: Mapping[str, str] | None = None,
              user_config: Mapping[str, Any] | None = None, planner: str | None = None) -> HostPlan:
    """The plan for every process of this (or the described) host.  No side effects
    beyond loading config into dask.config.

    ``user_env`` / ``user_config`` are the environment and dask config as the user set
    them; left out, this process's own.  A process that applied a plan passes the user's
    values it kept (:func:`gpudask.apply.process.plan_host`).  ``planner``: the role of the
    process planning (:attr:`gpudask.plan.PlanContext.planner`).
    """
    import dask.config

    from gpudask.config import Settings, load_dask_config, register_defaults, warn_unknown
    from gpudask.facts import get_facts
    from gpudask.manager import PluginManager
    from gpudask.plan.planner import build_plan

    import os

    if user_env is None:
        user_env = dict(os.environ)
    load_dask_config(config_file)
    manager = PluginManager.from_environment(extra_plugins)
    options = manager.config_options()
    check_protocol(protocol or "tcp")
    # before the plugins' defaults are merged in: they would replace a section given one value
    Settings(options, config=copy.deepcopy(dict(user_config if user_config is not None else dask.config.config)),
             environ=dict(user_env)).check_sections()
    register_defaults(options)
    if user_config is None:
        user_config = dask.config.config
    settings = Settings(options, config=dict(user_config), environ=dict(user_env))
    warn_unknown(settings.validate_all())
    facts = get_facts(facts_path)
    return build_plan(facts, settings, manager, protocol or "tcp", nworkers, user_env, user_config, user_interface,
                      planner)


def check_protocol(protocol: str) -> None:
    """A protocol distributed knows (its own, the ones packages register, and ucx/ucxx, whose
    package the transport plugins name when it is missing)."""
    import importlib.metadata

    from distributed.comm.registry import backends

    from gpudask.errors import ConfigError

    known = set(backends) | {ep.name for ep in importlib.metadata.entry_points(group="distributed.comm.backends")}
    known |= {"ucx", "ucxx"}
    # a scheduler may listen on several (``dask scheduler --protocol tcp,ws``)
    if not protocol or any(p.strip() not in known for p in protocol.split(",")):
        raise ConfigError(f"protocol {protocol!r} is not valid; accepted: {', '.join(sorted(known))}, or several "
                          "separated by commas")

"""Once per process: the config, the plugins, the settings, the user's view and the facts
that plans are built from (the bootstrap stage, between plan and checks).

The result, :class:`~gpudask.plan.PlanInputs`, is cached per process, keyed by what can
differ: the facts path, the config file (and the ``gpudask.toml`` in effect), the extra
plugins, and the user's view itself -- so a test or a ``gpudask info --facts X`` with
other inputs gets a fresh one, and a process that plans again with the same inputs (a
scale-up, a plan-only session, the scheduler check) reuses the one it has.  The plan stage
(:func:`gpudask.plan.build_plan`) then only computes from it.  :func:`reset` forgets
everything (tests).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, cast

from gpudask import session
from gpudask.plan import HostPlan, PlanInputs, UserValues, build_plan, check_protocol
from gpudask.plan.context import snapshot
from gpudask.plan.planner import check_nworkers

if TYPE_CHECKING:
    from gpudask.config import Settings
    from gpudask.errors import PluginError
    from gpudask.plugin.manager import PluginManager
    from gpudask.plan.host_plan import PlanDocument

# gpudask's bookkeeping variables (the host plan file, the worker group): not the user's
_BOOKKEEPING = ("GPUDASK_HOST_PLAN", "GPUDASK_GROUP")
_MAX_CACHED = 16  # inputs keep changing (a test suite): the oldest are forgotten

_LOCK = threading.RLock()  # the scheduler check plans off the event loop, in threads
# what this module builds is held by the process state (gpudask.session): the plan inputs
# by key (plan_inputs), their facts-free part (plugins), the user's values of what gpudask
# applied in this process (kept), and the count of builds (counts["bootstrap"])


def inputs(facts_path: str | os.PathLike[str] | None = None, config_file: str | os.PathLike[str] | None = None,
           extra_plugins: Iterable[Any] = (), user_env: Mapping[str, str] | None = None) -> PlanInputs:
    """The plan inputs of this process (built once per distinct set of inputs).

    ``user_env``: the user's environment, when the caller knows it better than this process
    (left out: the user's view of this process, :func:`user_view`)."""
    extras = tuple(extra_plugins)
    return cast(PlanInputs, _cached("plan_inputs", lambda: _key(facts_path, config_file, extras, user_env),
                                    lambda: _build(facts_path, config_file, extras, user_env)))


def _cached(name: str, key_of: Callable[[], str], build: Callable[[], Any]) -> Any:
    """``build()``, kept in the process state's cache ``name`` under the key of its inputs."""
    with _LOCK:
        cache = getattr(session.current(), name)
        key = key_of()
        found = cache.get(key)
        if found is not None:
            cache.move_to_end(key)
            return found
        built = build()
        # loading config and registering defaults changed dask.config: the same inputs, asked
        # for again, now look like this
        for k in (key, key_of()):
            cache[k] = built
        while len(cache) > _MAX_CACHED:
            cache.popitem(last=False)
        return built


def plan_host(protocol: str | None = None, nworkers: int | None = None,
              facts_path: str | os.PathLike[str] | None = None, config_file: str | os.PathLike[str] | None = None,
              extra_plugins: Iterable[Any] = (), user_interface: str | None = None,
              user_env: Mapping[str, str] | None = None, planner: str | None = None) -> HostPlan:
    """The plan for every process of this (or the described) host: what ``gpudask info``
    prints and what a scheduler, nanny host or worker applies.  ``planner``: the role of
    the process planning (:attr:`gpudask.plan.PlanContext.planner`)."""
    check_protocol(protocol or "tcp")
    check_nworkers(nworkers)
    return build_plan(inputs(facts_path, config_file, extra_plugins, user_env), protocol or "tcp",
                      nworkers, user_interface, planner)


def plugins(broken: list[PluginError]) -> PluginManager:
    """The plugins in effect after this process's config is loaded, a plugin that cannot be
    loaded recorded in ``broken`` instead of raised (``gpudask plugins``); not cached."""
    from gpudask.config import load_dask_config
    from gpudask.plugin.manager import PluginManager

    load_dask_config()  # gpudask.toml may enable or disable plugins
    return PluginManager.from_environment(broken=broken)


def keep_user_values(values: UserValues | None) -> None:
    """Record the user's values of what gpudask applies in this process (None: forget
    them): later plans of this process see the user's view, not gpudask's changes."""
    session.current().kept = values


def user_view(kept: UserValues | None = None) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment and dask config as the user set them: this process's, with ``kept``
    (or what :func:`keep_user_values` recorded) put back.  Copies; changes nothing."""
    import dask.config

    kept = kept if kept is not None else session.current().kept
    env = dict(os.environ)
    config = snapshot(dask.config.config)
    if kept is not None:
        put_env(env, kept.env)
        for key, value in kept.config.items():
            dask.config.set({key: value}, config=config)
    return env, config


def put_env(env: MutableMapping[str, str], values: Mapping[str, str | None]) -> None:
    """Set each variable of ``values`` in ``env`` (``os.environ``, or a copy); None: unset it."""
    for name, value in values.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value


def reset() -> None:
    """Forget the cached inputs, the kept user values and everything else this process's
    state holds (tests; a process starts clean): :func:`gpudask.session.reset`."""
    with _LOCK:
        session.reset()


def builds() -> int:
    """How many times this process built a plugin manager and its settings (plan inputs
    for another facts file share them)."""
    return session.current().counts["bootstrap"]


def from_plan(doc: PlanDocument) -> PlanInputs:
    """The plan inputs of a worker process, taken from the host plan its parent wrote:
    the parent's facts (validated there) and its resolved settings, with their sources,
    as they are -- no config file read, no facts probed or validated, no setting parsed.
    Only the plugin manager is built, with the plugins the parent loaded, since this
    process calls their apply hooks."""
    from gpudask.config import CORE_OPTIONS, Settings, register_defaults
    from gpudask.plugin.manager import PluginManager

    env, config = user_view(doc.user_values)
    settings = Settings(CORE_OPTIONS, config=config, environ=env)
    settings.take_resolved(doc.settings)
    manager = PluginManager.from_plan_plugins(doc.plugins, core=settings)
    options = manager.config_options()
    settings.add_options(options)
    settings.take_resolved(doc.settings)
    register_defaults(options)  # dask.config.get("gpudask.<plugin key>") in the worker's own code
    return PlanInputs(doc.facts, settings, manager, env, config)


def manager() -> PluginManager:
    """The plugin manager of this process -- the one its plan inputs hold, built once with
    the settings -- without reading facts: ``gpudask status`` and the ``/gpudask`` page ask
    the plugins for their report rows through it."""
    return _plugins(None, (), None).manager


class _Plugins:
    """The part of the plan inputs that does not depend on the facts: one plugin manager and
    one :class:`~gpudask.config.Settings`, and the user's view they were built from."""

    def __init__(self, manager: PluginManager, settings: Settings, env: dict[str, str],
                 config: dict[str, Any]) -> None:
        self.manager, self.settings, self.env, self.config = manager, settings, env, config


def _plugins(config_file: str | os.PathLike[str] | None, extras: tuple[Any, ...],
             user_env: Mapping[str, str] | None) -> _Plugins:
    """The plugins and settings for these inputs (facts aside), built once per process."""
    return cast(_Plugins, _cached("plugins", lambda: _key(None, config_file, extras, user_env),
                                  lambda: _build_plugins(config_file, extras, user_env)))


def _build_plugins(config_file: str | os.PathLike[str] | None, extras: tuple[Any, ...],
                   user_env: Mapping[str, str] | None) -> _Plugins:
    from gpudask.config import CORE_OPTIONS, Settings, load_dask_config, register_defaults, warn_unknown
    from gpudask.plugin.manager import PluginManager

    load_dask_config(config_file)
    env, config = user_view()
    env = dict(user_env) if user_env is not None else env
    # one Settings: the core's options decide which plugins load, the plugins add theirs
    settings = Settings(CORE_OPTIONS, config=config, environ=env)
    manager = PluginManager.from_environment(extras, core=settings)
    options = manager.config_options()
    settings.add_options(options)
    # before the plugins' defaults are merged in: they would replace a section given one value
    settings.check_sections()
    register_defaults(options)
    config = user_view()[1]  # with the plugins' defaults, as dask.config.get sees them
    settings.read_config(config)
    warn_unknown(settings.validate_all())
    session.count("bootstrap")
    return _Plugins(manager, settings, env, config)


def _build(facts_path: str | os.PathLike[str] | None, config_file: str | os.PathLike[str] | None,
           extras: tuple[Any, ...], user_env: Mapping[str, str] | None) -> PlanInputs:
    from gpudask.facts import get_facts
    from gpudask.facts.sections import with_sections

    plugins = _plugins(config_file, extras, user_env)
    session.count("facts read")
    # the core's facts, then the plugins' own sections (read from a described host, probed on a real one)
    facts = with_sections(get_facts(facts_path, plugins.manager.facts_packages()), plugins.manager.facts_sections())
    return PlanInputs(facts, plugins.settings, plugins.manager, plugins.env, plugins.config)


def _key(facts_path: str | os.PathLike[str] | None, config_file: str | os.PathLike[str] | None,
         extras: tuple[Any, ...], user_env: Mapping[str, str] | None) -> str:
    """What the inputs depend on, as one string: the paths (and the files' identity), the
    extra plugins (by identity: the cache keeps them alive), the user's view, and the
    variables the plugin manager reads from the process itself."""
    env, config = user_view()
    files = [config_file, os.environ.get("GPUDASK_CONFIG"), pathlib.Path.cwd() / "gpudask.toml"]
    parts = [
        os.fspath(facts_path) if facts_path is not None else None,
        os.fspath(config_file) if config_file is not None else None,
        [id(p) for p in extras],
        [_file_identity(f) for f in files],
        sorted((k, v) for k, v in (user_env if user_env is not None else env).items() if k not in _BOOKKEEPING),
        sorted((k, v) for k, v in os.environ.items() if k.startswith("GPUDASK_") and k not in _BOOKKEEPING),
        _text(config),
    ]
    return hashlib.sha256(_text(parts).encode()).hexdigest()


def _file_identity(path: str | os.PathLike[str] | None) -> list[Any] | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return [os.fspath(path), None]
    return [os.fspath(path), st.st_mtime_ns, st.st_size, st.st_ino]


def _text(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError):  # keys that do not sort (mixed types)
        return repr(value)

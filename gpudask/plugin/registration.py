"""Which plugins load, and what a plugin must be to be registered: the stateless rules the
plugin manager registers by (pluggy registers, validates, blocks and loads entry points).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import os
import types
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import Any

import pluggy

from gpudask.plugin import hookspecs
from gpudask.config import CORE_OPTIONS, Settings, parse_bool, parse_name_list
from gpudask.errors import ConfigError, PluginError

ENTRY_POINT_GROUP = "gpudask"
BUILTIN_DISTRIBUTION = "gpudask"
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 0, 1000, 500
HOOKS = sorted(name for name in dir(hookspecs) if name.startswith("gpudask_"))

# The built-in plugins: (name, module).  Registered from here, not found through entry
# point metadata; a third-party entry point may not take one of these names.
BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("gpu-pinning", "gpudask.plugins.gpu_pinning"),
    ("cpu-affinity", "gpudask.plugins.cpu_affinity"),
    ("forkserver", "gpudask.plugins.forkserver"),
    ("cuda-context", "gpudask.plugins.cuda_context"),
    ("tcp", "gpudask.plugins.ucx.tcp"),
    ("nvlink", "gpudask.plugins.ucx.nvlink"),
    ("infiniband", "gpudask.plugins.ucx.infiniband"),
    ("rmm", "gpudask.plugins.rmm.plugin"),
    ("worker-memory", "gpudask.plugins.worker_memory"),
    ("spill", "gpudask.plugins.spill.plugin"),
    ("gpu-dask-defaults", "gpudask.plugins.dask_defaults.plugin"),
    ("gpu-graph-data", "gpudask.plugins.graph_data.plugin"),
    ("scheduler-parity", "gpudask.plugins.scheduler_parity.plugin"),
)

# The built-ins that cannot be disabled (pytest's ``essential_plugins``): ``tcp`` declares the
# settings the other transport plugins read and UCX's base transport, without which a ucx://
# connection has nothing to connect over.  Disabling any other removes its behaviour only.
ESSENTIAL_PLUGINS: tuple[str, ...] = ("tcp",)

# pluggy hookimpl options gpudask does not run: they would order or wrap calls around priority
REFUSED_HOOKIMPL_OPTIONS = ("wrapper", "hookwrapper", "tryfirst", "trylast")


@dataclass
class LoadedPlugin:
    name: str
    priority: int
    source: str  # "builtin" | "entry point" | "registered"
    distribution: str | None
    obj: Any
    hooks: list[str] = field(default_factory=list)
    reads: tuple[str, ...] = ()  # the plan sections of other plugins it reads (its reads_sections)
    # its config_read_at_start: prefixes of the dask config keys it sets that are read only at start
    read_at_start: tuple[str, ...] = ()
    # what pluggy holds: ``obj``, or a hashable view of it (pluggy's subset hook callers keep
    # the plugins they leave out in a set; a SimpleNamespace cannot be hashed)
    registered: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "priority": self.priority, "source": self.source,
                "distribution": self.distribution, "hooks": list(self.hooks),
                **({"reads_sections": list(self.reads)} if self.reads else {})}


def _close_match(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, sorted(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _env_flag(name: str) -> bool:
    try:
        return parse_bool(os.environ.get(name, "0") or "0")
    except ValueError:
        raise ConfigError(f"${name}={os.environ[name]!r} is not valid; accepted: 1 or 0") from None


def _third_party_entry_points() -> dict[str, tuple[importlib.metadata.EntryPoint, str | None]]:
    """name -> (entry point, distribution) of the ``gpudask`` group, gpudask's own left out."""
    builtin_modules = dict(BUILTIN_PLUGINS)
    found: dict[str, tuple[importlib.metadata.EntryPoint, str | None]] = {}
    # every distribution's own entry points, as pluggy reads them: entry_points(group=...)
    # keeps one per name and would hide a second distribution declaring the same name
    for ep, dist in [(ep, d.metadata["name"]) for d in importlib.metadata.distributions() for ep in d.entry_points
                     if ep.group == ENTRY_POINT_GROUP]:
        if ep.name in builtin_modules:
            raise PluginError(ep.name, dist, "registration",
                              f"entry point {ep.name} = {ep.value} takes the name of the built-in plugin "
                              f"{ep.name!r} ({builtin_modules[ep.name]}); a third-party plugin needs a name of "
                              "its own")
        if ep.name in found:
            first, first_dist = found[ep.name]
            if (first_dist, first.value) != (dist, ep.value):  # (the same one found twice on sys.path: fine)
                # pluggy would load whichever it meets first and skip the other without a word
                raise PluginError(ep.name, dist, "registration",
                                  f"entry point {ep.name} = {ep.value} ({dist or 'unknown distribution'}) takes a "
                                  f"name that {first_dist or 'another distribution'} declares too ({ep.name} = "
                                  f"{first.value}); one plugin name per distribution: uninstall one of them")
            continue
        found[ep.name] = (ep, dist)
    return found


@dataclass(frozen=True)
class Selection:
    """Which plugins load in this process (:func:`select`); the manager loads them."""

    trace: bool  # trace every hook call
    blocked: tuple[str, ...]  # disabled, or left out by an enable list: pluggy blocks them
    builtins: tuple[tuple[str, str], ...]  # (name, module) of the built-ins to import, in order
    entry_points: tuple[tuple[str, str | None], ...]  # (name, distribution) of the entry points to load


def trace_wanted(core: Settings) -> bool:
    """Trace every hook call (``gpudask.plugins.trace``, ``$GPUDASK_TRACE_PLUGINS``)?"""
    return bool(core["gpudask.plugins.trace"] or _env_flag("GPUDASK_TRACE_PLUGINS"))


def select(extra: Iterable[Any] = (), core: Settings | None = None) -> Selection:
    """Which plugins load, from the enable/disable lists, autoload, ``$GPUDASK_LOAD_PLUGINS`` and
    the installed entry points; ``extra``: the plugin objects registered besides.

    :raises ConfigError: one line for a list naming no plugin, or disabling an essential one.
    :raises PluginError: an entry point that takes a built-in's name."""
    core = Settings(CORE_OPTIONS) if core is None else core
    enable = parse_name_list(os.environ["GPUDASK_PLUGINS"]) if os.environ.get("GPUDASK_PLUGINS") \
        else core["gpudask.plugins.enable"]
    disable = set(core["gpudask.plugins.disable"]) | set(parse_name_list(os.environ.get("GPUDASK_DISABLE_PLUGINS")))
    autoload = core["gpudask.plugins.autoload"] and not _env_flag("GPUDASK_DISABLE_PLUGIN_AUTOLOAD")
    # entry points loaded whether or not autoload is on (pytest's ``-p NAME``): a test
    # session turns autoload off and still loads the plugin it tests
    load = parse_name_list(os.environ.get("GPUDASK_LOAD_PLUGINS"))
    trace = trace_wanted(core)

    third_party = _third_party_entry_points()
    known = {n for n, _ in BUILTIN_PLUGINS} | set(third_party) | {getattr(p, "name", "") for p in extra}
    for wanted in load:
        if wanted not in third_party:
            raise ConfigError(f"$GPUDASK_LOAD_PLUGINS names {wanted!r}, which is no entry point of the "
                              f"'{ENTRY_POINT_GROUP}' group (installed: {', '.join(sorted(third_party)) or 'none'})"
                              f"{_close_match(wanted, third_party)}; built-ins always load")
    for name in [*enable, *disable]:
        if name not in known:
            raise ConfigError(f"no gpudask plugin named {name!r} (installed: {', '.join(sorted(known))})"
                              f"{_close_match(name, known)}")
    refused = sorted(disable & set(ESSENTIAL_PLUGINS))
    if refused:
        optional = sorted(n for n, _ in BUILTIN_PLUGINS if n not in ESSENTIAL_PLUGINS)
        raise ConfigError(f"gpudask plugin {refused[0]!r} is essential and cannot be disabled (it declares the "
                          "transport settings the other transport plugins read); accepted in a disable list: "
                          f"{', '.join(optional)} and third-party plugins")
    blocked = tuple(name for name in sorted(known)
                    if name not in ESSENTIAL_PLUGINS and (name in disable or (enable and name not in enable)))
    return Selection(
        trace=trace, blocked=blocked,
        builtins=tuple((name, module) for name, module in BUILTIN_PLUGINS if name not in blocked),
        # pluggy skips a blocked name itself
        entry_points=tuple((name, dist) for name, (_ep, dist) in sorted(third_party.items())
                           if autoload or name in load))


def declared(obj: Any, name: str, distribution: str | None) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """Plugin ``name``'s declarations, checked: ``(priority, reads_sections, config_read_at_start)``.

    :raises PluginError: one line for a declaration of the wrong shape."""
    priority = getattr(obj, "priority", DEFAULT_PRIORITY)
    if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise PluginError(name, distribution, "registration",
                          f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority!r}")
    names: dict[str, tuple[str, ...]] = {}
    for attr, what in (("reads_sections", "plugin names"), ("config_read_at_start", "dask config key prefixes")):
        value = getattr(obj, attr, ())
        if isinstance(value, str) or not isinstance(value, (tuple, list)) or \
                not all(isinstance(r, str) and r for r in value):
            raise PluginError(name, distribution, "registration", f"{attr} must be a tuple of {what}, "
                              f"got {value!r:.80}")
        names[attr] = tuple(value)
    refused_args = getattr(obj, "dask_cuda_refused", {})
    if not isinstance(refused_args, dict) or \
            not all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in refused_args.items()):
        raise PluginError(name, distribution, "registration", "dask_cuda_refused must be a dict {LocalCUDACluster "
                          f"argument: what to use instead}} of strings, got {refused_args!r:.80}")
    return priority, names["reads_sections"], names["config_read_at_start"]


def pluggy_target(obj: Any, name: str) -> Any:
    """What pluggy holds for a plugin: the object itself, or, when it cannot be hashed (a
    ``SimpleNamespace``), a module with its attributes, hooks included.  pluggy's subset hook
    callers keep the plugins they leave out in a set, and pluggy reads hooks statically (no proxy)."""
    try:
        hash(obj)  # (a frozen dataclass holding a list says it is Hashable, and is not)
        return obj
    except TypeError:
        pass
    copy = types.ModuleType(f"gpudask-plugin-{name}")
    for attr in dir(obj):
        if not attr.startswith("__"):
            try:
                setattr(copy, attr, getattr(obj, attr))
            except Exception:  # noqa: BLE001 - an attribute that cannot be read is pluggy's to report
                continue
    return copy


def refused_option(pm: pluggy.PluginManager, obj: Any, name: str) -> str | None:
    """The first of plugin ``name``'s hookimpls (registered in ``pm`` as ``obj``) marked with an
    option gpudask does not run, said in one line; None when there is none."""
    for caller in sorted(pm.get_hookcallers(obj) or [], key=lambda c: c.name):
        for impl in caller.get_hookimpls():
            if impl.plugin_name != name:
                continue
            marked = [opt for opt in REFUSED_HOOKIMPL_OPTIONS if impl.opts.get(opt)]
            if marked:
                return (f"{caller.name} is marked {', '.join(f'{opt}=True' for opt in marked)}, which gpudask "
                        f"does not run; accepted: a plain @hookimpl, ordered by the plugin's integer "
                        f"'priority' ({MIN_PRIORITY}-{MAX_PRIORITY}, lower first)")
    return None


def unknown_hook(pm: pluggy.PluginManager, error: pluggy.PluginValidationError) -> str:
    """pluggy's refusal of a hook no spec declares, in one line (with the closest hook)."""
    unknown = sorted(n for n, caller in vars(pm.hook).items()
                     if n.startswith(hookspecs.PROJECT) and caller.spec is None)
    if not unknown:
        return str(error)
    return f"unknown hook {unknown[0]!r}{_close_match(unknown[0], HOOKS)}"

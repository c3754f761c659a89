"""Which plugins load, and their registration: the loading half of the plugin manager.

pluggy does the registration and the spec validation (argument names checked against the
spec), the blocking of disabled plugins (``set_blocked``), the loading of entry points
(``load_setuptools_entrypoints``) and the check for unknown hooks (``check_pending``).
gpudask adds what pluggy has no notion of: the built-ins registered from
:data:`BUILTIN_PLUGINS` (the *essential* ones, :data:`ESSENTIAL_PLUGINS`, cannot be
disabled), the enable/disable lists and their one-line errors, an explicit integer
``priority``, and the refusal of what gpudask would not run as written -- hook wrappers and
``tryfirst``/``trylast`` (:data:`REFUSED_HOOKIMPL_OPTIONS`), and hooks and parameters
renamed since gpudask 0.1.0 (:data:`gpudask.hookspecs.RENAMED_HOOKS`,
:data:`gpudask.hookspecs.RENAMED_PARAMETERS`), which would otherwise never run.

Calling the hooks is :class:`gpudask.manager.PluginManager`'s, a :class:`Registry`.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import os
import types
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import Any, TypeVar

import pluggy

from gpudask import hookspecs
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
    ("scheduler-parity", "gpudask.plugins.scheduler_parity.plugin"),
)

# The built-ins that cannot be disabled (pytest's ``essential_plugins``): an enable list
# keeps them and a disable list naming them is refused.  ``tcp`` declares the settings the
# other transport plugins read (``gpudask.transport.mode``, ``.interface``) and UCX's base
# transport, without which a ucx:// connection has nothing to connect over.  Every other
# built-in is a *default* plugin: disabling it removes its behaviour and nothing else.
ESSENTIAL_PLUGINS: tuple[str, ...] = ("tcp",)

# pluggy hookimpl options gpudask does not run: they would order or wrap calls around priority
REFUSED_HOOKIMPL_OPTIONS = ("wrapper", "hookwrapper", "tryfirst", "trylast")

_R = TypeVar("_R", bound="Registry")


@dataclass
class LoadedPlugin:
    name: str
    priority: int
    source: str  # "builtin" | "entry point" | "registered"
    distribution: str | None
    obj: Any
    hooks: list[str] = field(default_factory=list)
    reads: tuple[str, ...] = ()  # the plan sections of other plugins it reads (its reads_sections)
    # prefixes of the dask config keys it sets that are read once, when the process starts or
    # first connects (its config_read_at_start): set late in a running process, they need a new one
    read_at_start: tuple[str, ...] = ()
    # what pluggy holds: ``obj``, or a hashable view of it (pluggy's subset hook callers keep
    # the plugins they leave out in a set; a SimpleNamespace cannot be hashed)
    registered: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "priority": self.priority, "source": self.source,
                "distribution": self.distribution, "hooks": list(self.hooks),
                **({"reads_sections": list(self.reads)} if self.reads else {})}


def _hashable(obj: Any) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


def _hashable_copy(obj: Any, name: str) -> types.ModuleType:
    """What pluggy holds for a plugin object that cannot be hashed (a ``SimpleNamespace``):
    a module with its attributes, hooks included.  pluggy's subset hook callers keep the
    plugins they leave out in a set, and pluggy reads hooks statically (no proxy)."""
    copy = types.ModuleType(f"gpudask-plugin-{name}")
    for attr in dir(obj):
        if not attr.startswith("__"):
            try:
                setattr(copy, attr, getattr(obj, attr))
            except Exception:  # noqa: BLE001 - an attribute that cannot be read is pluggy's to report
                continue
    return copy


def _env_flag(name: str) -> bool:
    try:
        return parse_bool(os.environ.get(name, "0") or "0")
    except ValueError:
        raise ConfigError(f"${name}={os.environ[name]!r} is not valid; accepted: 1 or 0") from None


def _third_party_entry_points() -> dict[str, tuple[importlib.metadata.EntryPoint, str | None]]:
    """name -> (entry point, distribution) of the ``gpudask`` group, gpudask's own left out."""
    builtin_modules = dict(BUILTIN_PLUGINS)
    found: dict[str, tuple[importlib.metadata.EntryPoint, str | None]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else None
        if dist == BUILTIN_DISTRIBUTION and builtin_modules.get(ep.name) == ep.value:
            continue  # metadata of an older gpudask install that still lists its built-ins
        if ep.name in builtin_modules:
            raise PluginError(ep.name, dist, "registration",
                              f"entry point {ep.name} = {ep.value} takes the name of the built-in plugin "
                              f"{ep.name!r} ({builtin_modules[ep.name]}); a third-party plugin needs a name of "
                              "its own")
        found.setdefault(ep.name, (ep, dist))
    return found


class _Pluggy(pluggy.PluginManager):
    """pluggy's manager, whose entry-point loading registers through gpudask's checks."""

    def __init__(self, owner: Registry) -> None:
        super().__init__(hookspecs.PROJECT)
        self.owner = owner
        self.direct = False  # True while gpudask's own register() calls pluggy's

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        if self.direct:
            return super().register(plugin, name)
        loaded = self.owner.register(plugin, name=name, source="entry point", distribution=self.owner.loading_dist)
        return loaded.name if loaded is not None else None


class Registry:
    """The plugins allowed by config and environment, registered in priority order."""

    def __init__(self) -> None:
        self._pm = _Pluggy(self)
        self._pm.add_hookspecs(hookspecs)
        self.loading_dist: str | None = None  # the distribution of the entry point being loaded
        self.plugins: list[LoadedPlugin] = []

    # -- loading ---------------------------------------------------------------
    @classmethod
    def from_environment(cls: type[_R], extra: Iterable[Any] = (), broken: list[PluginError] | None = None,
                         core: Settings | None = None) -> _R:
        """Load built-ins and entry points, honouring enable/disable lists and autoload.

        A plugin that cannot be loaded raises :class:`PluginError`; with ``broken`` (a
        list), it is recorded there instead and the others load (``gpudask plugins``).
        ``core``: the settings holding the core's options (the bootstrap's one Settings of
        the process); left out, read from dask's config."""
        manager = cls()
        core = Settings(CORE_OPTIONS) if core is None else core
        enable = parse_name_list(os.environ["GPUDASK_PLUGINS"]) if os.environ.get("GPUDASK_PLUGINS") \
            else core["gpudask.plugins.enable"]
        disable = set(core["gpudask.plugins.disable"]) | set(parse_name_list(os.environ.get("GPUDASK_DISABLE_PLUGINS")))
        autoload = core["gpudask.plugins.autoload"] and not _env_flag("GPUDASK_DISABLE_PLUGIN_AUTOLOAD")
        # entry points loaded whether or not autoload is on (pytest's ``-p NAME``): a test
        # session turns autoload off and still loads the plugin it tests
        load = parse_name_list(os.environ.get("GPUDASK_LOAD_PLUGINS"))
        if core["gpudask.plugins.trace"] or _env_flag("GPUDASK_TRACE_PLUGINS"):
            manager.enable_tracing()

        third_party = _third_party_entry_points()
        extra = list(extra)
        known = {n for n, _ in BUILTIN_PLUGINS} | set(third_party) | {getattr(p, "name", "") for p in extra}
        for wanted in load:
            if wanted not in third_party:
                close = difflib.get_close_matches(wanted, sorted(third_party), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"$GPUDASK_LOAD_PLUGINS names {wanted!r}, which is no entry point of the "
                                  f"'{ENTRY_POINT_GROUP}' group (installed: {', '.join(sorted(third_party)) or 'none'})"
                                  f"{hint}; built-ins always load")
        for name in [*enable, *disable]:
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"no gpudask plugin named {name!r} (installed: {', '.join(sorted(known))}){hint}")
        refused = sorted(disable & set(ESSENTIAL_PLUGINS))
        if refused:
            optional = sorted(n for n, _ in BUILTIN_PLUGINS if n not in ESSENTIAL_PLUGINS)
            raise ConfigError(f"gpudask plugin {refused[0]!r} is essential and cannot be disabled (it declares the "
                              "transport settings the other transport plugins read); accepted in a disable list: "
                              f"{', '.join(optional)} and third-party plugins")
        for name in sorted(known):
            if name in ESSENTIAL_PLUGINS:
                continue
            if name in disable or (enable and name not in enable):
                manager._pm.set_blocked(name)

        for name, module in BUILTIN_PLUGINS:
            if manager._pm.is_blocked(name):
                continue
            try:
                obj = importlib.import_module(module)
            except Exception as e:  # noqa: BLE001 - any import failure is reported the same way
                error = PluginError(name, BUILTIN_DISTRIBUTION, "import", e)
                if broken is None:
                    raise error from e
                broken.append(error)
                continue
            manager.register(obj, name=name, source="builtin", distribution=BUILTIN_DISTRIBUTION)
        for name, (ep, dist) in sorted(third_party.items()):
            if autoload or name in load:
                try:
                    manager._load_entry_point(name, dist)
                except PluginError as e:
                    if broken is None:
                        raise
                    broken.append(e)
        for obj in extra:
            name = getattr(obj, "name", None)
            if name and not manager._pm.is_blocked(name):
                manager.register(obj, source="registered")
        return manager

    def _load_entry_point(self, name: str, dist: str | None) -> None:
        """One entry point through pluggy, which skips blocked names; failures name the plugin."""
        self.loading_dist = dist  # for the one-line errors of its registration
        from gpudask.hookcall import call_isolated

        try:
            # the module body runs here: isolated like a hook (sys.exit() in it ends nothing)
            call_isolated(name, dist, "import", lambda: self._pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP,
                                                                                             name=name), ())
        except PluginError as e:
            if isinstance(e.__cause__, PluginError):  # refused at registration: that line as it is
                raise e.__cause__ from None
            raise
        finally:
            self.loading_dist = None
        # the distribution it came from, as pluggy recorded it
        for obj, distribution in self._pm.list_plugin_distributions():
            for plugin in self.plugins:
                if plugin.obj is obj and plugin.source == "entry point":
                    plugin.distribution = distribution.metadata["name"]

    def register(self, obj: Any, name: str | None = None, source: str = "registered",
                 distribution: str | None = None) -> LoadedPlugin | None:
        """Register ``obj`` (a module or object with ``name``, ``priority`` and hooks).
        None when the name is blocked (disabled)."""
        name = getattr(obj, "name", None) or name
        if not isinstance(name, str) or not name:
            raise PluginError(repr(obj), distribution, "registration", "a plugin needs a non-empty string 'name'")
        if self._pm.is_blocked(name):
            return None
        priority = getattr(obj, "priority", DEFAULT_PRIORITY)
        if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise PluginError(name, distribution, "registration",
                              f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority!r}")
        reads = getattr(obj, "reads_sections", ())
        if isinstance(reads, str) or not isinstance(reads, (tuple, list)) or \
                not all(isinstance(r, str) and r for r in reads):
            raise PluginError(name, distribution, "registration",
                              f"reads_sections must be a tuple of plugin names, got {reads!r:.80}")
        read_at_start = getattr(obj, "config_read_at_start", ())
        if isinstance(read_at_start, str) or not isinstance(read_at_start, (tuple, list)) or \
                not all(isinstance(r, str) and r for r in read_at_start):
            raise PluginError(name, distribution, "registration", "config_read_at_start must be a tuple of dask "
                              f"config key prefixes, got {read_at_start!r:.80}")
        refused_args = getattr(obj, "dask_cuda_refused", {})
        if not isinstance(refused_args, dict) or \
                not all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in refused_args.items()):
            raise PluginError(name, distribution, "registration", "dask_cuda_refused must be a dict {LocalCUDACluster "
                              f"argument: what to use instead}} of strings, got {refused_args!r:.80}")
        if any(p.name == name for p in self.plugins):
            raise PluginError(name, distribution, "registration", "another plugin already has this name")
        renamed = self._renamed(obj)
        if renamed is not None:
            raise PluginError(name, distribution, "registration", renamed)
        target = obj if _hashable(obj) else _hashable_copy(obj, name)
        self._pm.direct = True
        try:
            self._pm.register(target, name=name)
        except (pluggy.PluginValidationError, ValueError) as e:
            raise PluginError(name, distribution, "registration", " ".join(str(e).split())) from e
        finally:
            self._pm.direct = False
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as e:
            self._pm.unregister(target)
            raise PluginError(name, distribution, "registration", self._unknown_hook(e)) from e
        refused = self._refused_option(target, name)
        if refused is not None:
            self._pm.unregister(target)
            raise PluginError(name, distribution, "registration", refused)
        hooks = sorted(caller.name for caller in self._pm.get_hookcallers(target) or [])
        plugin = LoadedPlugin(name, priority, source, distribution, obj, hooks, tuple(reads), tuple(read_at_start),
                              registered=target)
        self.plugins.append(plugin)
        self.plugins.sort(key=lambda p: (p.priority, p.name))
        self._registered()
        return plugin

    def _registered(self) -> None:
        """After each registration (the calling half forgets what it cached)."""

    def _refused_option(self, obj: Any, name: str) -> str | None:
        """The first of plugin ``name``'s hookimpls marked with an option gpudask does not
        run, said in one line; None when there is none."""
        for caller in sorted(self._pm.get_hookcallers(obj) or [], key=lambda c: c.name):
            for impl in caller.get_hookimpls():
                if impl.plugin_name != name:
                    continue
                marked = [opt for opt in REFUSED_HOOKIMPL_OPTIONS if impl.opts.get(opt)]
                if marked:
                    return (f"{caller.name} is marked {', '.join(f'{opt}=True' for opt in marked)}, which gpudask "
                            f"does not run; accepted: a plain @hookimpl, ordered by the plugin's integer "
                            f"'priority' ({MIN_PRIORITY}-{MAX_PRIORITY}, lower first)")
        return None

    def _renamed(self, obj: Any) -> str | None:
        """A hookimpl of ``obj`` under a hook name or with parameter names renamed since
        gpudask 0.1.0, said in one line with the new name; None when there is none.  (pluggy
        would keep an old hook name pending, never called, and refuse an old parameter with
        its own three lines.)"""
        for attr in sorted(dir(obj)):
            try:
                # pluggy's public parse: None unless the attribute is marked with @hookimpl
                opts = self._pm.parse_hookimpl_opts(obj, attr)
            except Exception:  # noqa: BLE001 - an attribute that cannot be read is pluggy's to report
                continue
            if opts is None:
                continue
            hook = opts.get("specname") or attr
            if hook in hookspecs.RENAMED_HOOKS:
                new = hookspecs.RENAMED_HOOKS[hook]
                return (f"hook {hook} was renamed {new} after gpudask 0.1.0 (same arguments); rename the "
                        f"implementation to {new}, or it would never run")
            old = hookspecs.RENAMED_PARAMETERS.get(hook)
            if old:
                try:
                    argnames = list(inspect.signature(getattr(obj, attr)).parameters)
                except (TypeError, ValueError):
                    continue  # pluggy reports what it cannot read
                stale = [arg for arg in argnames if arg in old]
                if stale:
                    said = ", ".join(f"{arg} -> {old[arg]}" for arg in stale)
                    return (f"{hook}'s parameters were renamed after gpudask 0.1.0 ({said}); accepted "
                            f"parameters: {', '.join(self._spec_argnames(hook))}")
        return None

    def _spec_argnames(self, hook_name: str) -> tuple[str, ...]:
        spec = getattr(self._pm.hook, hook_name).spec
        return tuple(spec.argnames) if spec is not None else ()

    def _unknown_hook(self, error: pluggy.PluginValidationError) -> str:
        unknown = sorted(n for n, caller in vars(self._pm.hook).items()
                         if n.startswith(hookspecs.PROJECT) and caller.spec is None)
        if not unknown:
            return str(error)
        close = difflib.get_close_matches(unknown[0], HOOKS, n=1)
        return f"unknown hook {unknown[0]!r}" + (f"; did you mean {close[0]!r}?" if close else "")

    def names(self) -> list[str]:
        return [p.name for p in self.plugins]

    def enable_tracing(self) -> None:
        """Trace every hook call: the calling half's (:class:`gpudask.manager.PluginManager`)."""
        raise NotImplementedError

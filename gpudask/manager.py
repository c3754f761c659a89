"""Finding, ordering and calling plugins.

A thin typed layer over pluggy (in the manner of tox's plugin manager): the rest of
gpudask calls ``manager.select_transport(ctx, plan)``, never ``pm.hook.x``.  Each hook
implementation is called on its own, in priority order, so that a failure names the
plugin, its distribution and the hook, and so that reasons are attributed to the
plugin that made them.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import logging
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from gpudask import hookspecs
from gpudask.config import CORE_OPTIONS, Option, Settings, parse_bool, parse_name_list
from gpudask.errors import ConfigError, GpudaskError, PluginError

logger = logging.getLogger("distributed.gpudask")
trace_logger = logging.getLogger("distributed.gpudask.trace")

ENTRY_POINT_GROUP = "gpudask"
BUILTIN_DISTRIBUTION = "gpudask"
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 0, 1000, 500
HOOKS = [name for name in dir(hookspecs) if name.startswith("gpudask_")]


@dataclass
class LoadedPlugin:
    name: str
    priority: int
    source: str  # "builtin" | "entry point" | "registered"
    distribution: str | None
    obj: Any
    hooks: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "priority": self.priority, "source": self.source,
                "distribution": self.distribution, "hooks": list(self.hooks)}


def _env_flag(name: str) -> bool:
    try:
        return parse_bool(os.environ.get(name, "0") or "0")
    except ValueError:
        raise ConfigError(f"${name}={os.environ[name]!r} is not valid; accepted: 1 or 0") from None


class PluginManager:
    """Loads the plugins allowed by config and environment and calls their hooks."""

    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self.plugins: list[LoadedPlugin] = []
        self.trace = False

    # -- loading ---------------------------------------------------------------
    @classmethod
    def from_environment(cls, extra: Iterable[Any] = ()) -> PluginManager:
        """Load built-ins and entry points, honouring enable/disable lists and autoload."""
        manager = cls()
        core = Settings(CORE_OPTIONS)
        enable = parse_name_list(os.environ["GPUDASK_PLUGINS"]) if os.environ.get("GPUDASK_PLUGINS") \
            else core["gpudask.plugins.enable"]
        disable = set(core["gpudask.plugins.disable"]) | set(parse_name_list(os.environ.get("GPUDASK_DISABLE_PLUGINS")))
        autoload = core["gpudask.plugins.autoload"] and not _env_flag("GPUDASK_DISABLE_PLUGIN_AUTOLOAD")
        manager.trace = core["gpudask.plugins.trace"] or _env_flag("GPUDASK_TRACE_PLUGINS")

        found: dict[str, tuple[importlib.metadata.EntryPoint, str | None]] = {}
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist is not None else None
            found.setdefault(ep.name, (ep, dist))
        known = set(found) | {getattr(p, "name", "") for p in extra}
        for name in [*enable, *disable]:
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"no gpudask plugin named {name!r} (installed: {', '.join(sorted(known))}){hint}")

        for name, (ep, dist) in sorted(found.items()):
            builtin = dist == BUILTIN_DISTRIBUTION or ep.value.startswith("gpudask.plugins.")
            if (enable and name not in enable) or name in disable or (not builtin and not autoload):
                continue
            try:
                obj = ep.load()
            except Exception as e:  # noqa: BLE001 - any import failure is reported the same way
                raise PluginError(name, dist, "import", e) from e
            manager.register(obj, name=name, source="builtin" if builtin else "entry point", distribution=dist)
        for obj in extra:
            name = getattr(obj, "name", None)
            if name and not ((enable and name not in enable) or name in disable):
                manager.register(obj, source="registered")
        return manager

    def register(self, obj: Any, name: str | None = None, source: str = "registered",
                 distribution: str | None = None) -> LoadedPlugin:
        name = getattr(obj, "name", None) or name
        if not isinstance(name, str) or not name:
            raise PluginError(repr(obj), distribution, "registration", "a plugin needs a non-empty string 'name'")
        priority = getattr(obj, "priority", DEFAULT_PRIORITY)
        if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise PluginError(name, distribution, "registration",
                              f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority!r}")
        if any(p.name == name for p in self.plugins):
            raise PluginError(name, distribution, "registration", "another plugin already has this name")
        try:
            self._pm.register(obj, name=name)
        except pluggy.PluginValidationError as e:
            raise PluginError(name, distribution, "registration", str(e)) from e
        unknown = [a for a in dir(obj) if a.startswith("gpudask_") and a not in HOOKS]
        if unknown:
            self._pm.unregister(obj)
            close = difflib.get_close_matches(unknown[0], HOOKS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PluginError(name, distribution, "registration", f"unknown hook {unknown[0]!r}{hint}")
        hooks = sorted(impl.function.__name__ for impl in self._hookimpls_of(obj))
        plugin = LoadedPlugin(name, priority, source, distribution, obj, hooks)
        self.plugins.append(plugin)
        self.plugins.sort(key=lambda p: (p.priority, p.name))
        return plugin

    def _hookimpls_of(self, obj: Any) -> list[Any]:
        out = []
        for hook_name in HOOKS:
            caller = getattr(self._pm.hook, hook_name)
            out += [impl for impl in caller.get_hookimpls() if impl.plugin is obj]
        return out

    def names(self) -> list[str]:
        return [p.name for p in self.plugins]

    # -- calling ---------------------------------------------------------------
    def _call(self, hook_name: str, plan: Any = None, isolate: bool = False,
              **kwargs: Any) -> list[tuple[LoadedPlugin, Any]]:
        """Call each implementation in priority order.  With ``isolate`` a failing plugin's
        PluginError is returned as its result instead of stopping the others."""
        caller = getattr(self._pm.hook, hook_name)
        impls = {impl.plugin_name: impl for impl in caller.get_hookimpls()}
        results = []
        for plugin in self.plugins:
            impl = impls.get(plugin.name)
            if impl is None:
                continue
            args = dict(kwargs, plan=plan) if plan is not None else kwargs
            wanted = {k: v for k, v in args.items() if k in impl.argnames}
            if plan is not None:
                plan.acting_plugin = plugin.name
            start = time.perf_counter()
            try:
                result = impl.function(**wanted)
            except Exception as e:  # noqa: BLE001
                # a plugin's own one-line error keeps its text; anything else its type too
                error = PluginError(plugin.name, plugin.distribution, hook_name,
                                    str(e) if isinstance(e, GpudaskError) else e)
                if not isolate:
                    raise error from e
                result = error
            finally:
                if plan is not None:
                    plan.acting_plugin = "gpudask"
            if self.trace:
                where = f" role={plan.role} index={plan.index}" if plan is not None else ""
                _trace(f"{hook_name} -> {plugin.name}{where}: {result!r} ({(time.perf_counter() - start) * 1e3:.1f} ms)")
            results.append((plugin, result))
        return results

    def config_options(self) -> list[Option]:
        options = list(CORE_OPTIONS)
        for plugin, result in self._call("gpudask_config_options"):
            for opt in result or []:
                if not isinstance(opt, Option) or not opt.key.startswith("gpudask."):
                    raise PluginError(plugin.name, plugin.distribution, "gpudask_config_options",
                                      f"options must be gpudask.config.Option with keys under 'gpudask.', got {opt!r}")
                options.append(opt)
        return options

    def validate(self, ctx: Any) -> None:
        self._call("gpudask_validate", ctx=ctx)

    def plan_process(self, ctx: Any, plan: Any) -> None:
        self._call("gpudask_plan_process", plan, ctx=ctx)

    def select_transport(self, ctx: Any, plan: Any) -> None:
        self._call("gpudask_select_transport", plan, ctx=ctx)

    def plan_memory(self, ctx: Any, plan: Any) -> None:
        self._call("gpudask_plan_memory", plan, ctx=ctx)

    def context_init(self, ctx: Any, plan: Any) -> None:
        self._call("gpudask_context_init", plan, ctx=ctx)

    def setup_memory(self, ctx: Any, plan: Any) -> dict[str, Any]:
        return {p.name: r for p, r in self._call("gpudask_setup_memory", plan, ctx=ctx) if r is not None}

    def preload(self, ctx: Any, plan: Any, server: Any) -> None:
        self._call("gpudask_preload", plan, ctx=ctx, server=server)

    def scheduler_check(self, ctx: Any, scheduler_facts: Any, worker_facts: Any) -> list[Any]:
        """Findings of every plugin; a plugin that raises (or returns something that is
        not a Finding) becomes a ``plugin-failed`` finding, the others still run."""
        from gpudask.findings import Finding

        findings = []
        for plugin, result in self._call("gpudask_scheduler_check", isolate=True, ctx=ctx,
                                         scheduler_facts=scheduler_facts, worker_facts=worker_facts):
            if isinstance(result, PluginError):
                findings.append(Finding("warning", "plugin-failed", f"the check could not finish: {result}",
                                        plugin=plugin.name))
                continue
            for finding in result or []:
                if isinstance(finding, dict):
                    finding = Finding.from_dict(finding) if _is_finding_dict(finding) else finding
                if not isinstance(finding, Finding):
                    finding = Finding("warning", "plugin-failed", f"the check could not finish: plugin returned "
                                      f"{type(finding).__name__}, not a gpudask.findings.Finding", plugin=plugin.name)
                finding.plugin = finding.plugin or plugin.name
                findings.append(finding)
        return findings

def _is_finding_dict(data: dict[str, Any]) -> bool:
    return isinstance(data.get("severity"), str) and isinstance(data.get("code"), str) \
        and isinstance(data.get("message"), str)


def _trace(message: str) -> None:
    if not trace_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("gpudask trace: %(message)s"))
        trace_logger.addHandler(handler)
        trace_logger.setLevel(logging.INFO)
        trace_logger.propagate = False
    trace_logger.info(message)

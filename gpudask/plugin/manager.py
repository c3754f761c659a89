"""The plugin manager: the plugins of this process, registered into pluggy, and their hook calls.

The rest of gpudask calls ``manager.select_transport(ctx, plan)``, never ``pm.hook.x``.  Each
plugin is called on its own, in priority order, through pluggy's hook caller for it alone
(``subset_hook_caller``), isolated (:func:`gpudask.plugin.hookcall.call_isolated`), so a failure
names the plugin, its distribution and the hook, and an isolating hook lets the others run.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

from gpudask.plugin import hookresults, hookspecs, hooktrace
from gpudask.config import CORE_OPTIONS, Option, Settings
from gpudask.errors import PluginError
from gpudask.findings import Finding
from gpudask.plugin.hookcall import PluginStopped, call_isolated
from gpudask.plugin.registration import (BUILTIN_DISTRIBUTION, BUILTIN_PLUGINS, ENTRY_POINT_GROUP, ESSENTIAL_PLUGINS,
                                         HOOKS, LoadedPlugin, declared, pluggy_target, refused_option, select,
                                         trace_wanted, unknown_hook)

logger = logging.getLogger("distributed.gpudask")

if TYPE_CHECKING:
    from gpudask.facts.model import Facts
    from gpudask.facts.sections import FactsSection
    from gpudask.findings import ProcessSide
    from gpudask.plan.context import PlanContext
    from gpudask.plan.model import ProcessPlan

__all__ = ["BUILTIN_PLUGINS", "ESSENTIAL_PLUGINS", "HOOKS", "PluginManager"]  # what other modules import from here


class _Pluggy(pluggy.PluginManager):
    """pluggy's manager, whose entry-point loading registers through gpudask's checks."""

    def __init__(self, owner: PluginManager) -> None:
        super().__init__(hookspecs.PROJECT)
        self.owner = owner

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        # a plain module: only a function of its __dict__ marked as a hook can be one, and most
        # of a module's names are not (its imports, its helpers); pluggy's own lookup
        # (inspect.getattr_static, for descriptors a module has none of) took 5 ms a process
        if type(plugin) is types.ModuleType:
            value = plugin.__dict__.get(name)
            if isinstance(value, types.FunctionType):
                if not hasattr(value, f"{self.project_name}_impl"):
                    return None
            elif not isinstance(value, (staticmethod, classmethod, types.MethodType)):
                return None
        return super().parse_hookimpl_opts(plugin, name)

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        # load_setuptools_entrypoints registers here; gpudask's own register() calls pluggy's directly
        loaded = self.owner.register(plugin, name=name, source="entry point", distribution=self.owner.loading_dist)
        return loaded.name if loaded is not None else None


class PluginManager:
    """The plugins allowed by config and environment, registered in priority order, and the
    calls of their hooks."""

    def __init__(self) -> None:
        self._pm = _Pluggy(self)
        self._pm.add_hookspecs(hookspecs)
        self.loading_dist: str | None = None  # the distribution of the entry point being loaded
        self.plugins: list[LoadedPlugin] = []
        self._callers: dict[tuple[str, str], pluggy.HookCaller] = {}
        self.trace = False
        self._observe: Callable[[str, str, float], None] | None = None

    @classmethod
    def from_environment(cls, extra: Iterable[Any] = (), broken: list[PluginError] | None = None,
                         core: Settings | None = None) -> PluginManager:
        """Load the plugins :func:`~gpudask.plugin.registration.select` chooses.

        A plugin that cannot be loaded raises :class:`PluginError`, or with ``broken`` (a list)
        is recorded there while the others load (``gpudask plugins``).  ``core``: the settings
        holding the core's options; left out, read from dask's config."""
        manager = cls()
        extra = list(extra)
        chosen = select(extra, core)
        if chosen.trace:
            manager.enable_tracing()
        for name in chosen.blocked:
            manager._pm.set_blocked(name)
        loads: list[tuple[Callable[[str, Any], None], str, Any]] = [
            *((manager._load_builtin, name, module) for name, module in chosen.builtins),
            *((manager._load_entry_point, name, dist) for name, dist in chosen.entry_points)]
        for load, name, where in loads:
            try:
                load(name, where)
            except PluginError as e:
                if broken is None:
                    raise
                broken.append(e)
        for obj in extra:
            named = getattr(obj, "name", None)
            if named and not manager._pm.is_blocked(named):
                manager.register(obj, source="registered")
        return manager

    @classmethod
    def from_plan_plugins(cls, plugins: Iterable[Mapping[str, Any]], core: Settings) -> PluginManager:
        """The plugins a planning process loaded (its host plan's ``plugins``), loaded again by
        name in a worker process it started, as the parent chose them (its enable and disable
        lists applied).  The installed distributions are scanned only for an entry point (3 ms
        of a worker's start); objects the parent registered itself are not loaded.

        :raises PluginError: a plugin that cannot be loaded (one line)."""
        manager = cls()
        if trace_wanted(core):
            manager.enable_tracing()
        modules = dict(BUILTIN_PLUGINS)
        for plugin in plugins:
            name, source = plugin.get("name"), plugin.get("source")
            if not isinstance(name, str):
                continue  # no plugin gpudask listed (parse_document checks that each entry is an object)
            if source == "builtin" and name in modules:
                manager._load_builtin(name, modules[name])
            elif source == "entry point":
                manager._load_entry_point(name, plugin.get("distribution"))
        return manager

    def _load_builtin(self, name: str, module: str) -> None:
        try:
            obj = importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - any import failure is reported the same way
            raise PluginError(name, BUILTIN_DISTRIBUTION, "import", e) from e
        self.register(obj, name=name, source="builtin", distribution=BUILTIN_DISTRIBUTION)

    def _load_entry_point(self, name: str, dist: str | None) -> None:
        self.loading_dist = dist  # for the one-line errors of its registration
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

    def register(self, obj: Any, name: str | None = None, source: str = "registered",
                 distribution: str | None = None) -> LoadedPlugin | None:
        """Register ``obj`` (a module or object with ``name``, ``priority`` and hooks); None when
        the name is blocked (disabled)."""
        name = getattr(obj, "name", None) or name
        if not isinstance(name, str) or not name:
            raise PluginError(repr(obj), distribution, "registration", "a plugin needs a non-empty string 'name'")
        if self._pm.is_blocked(name):
            return None
        priority, reads, read_at_start = declared(obj, name, distribution)
        if any(p.name == name for p in self.plugins):
            raise PluginError(name, distribution, "registration", "another plugin already has this name")
        target = pluggy_target(obj, name)
        try:
            pluggy.PluginManager.register(self._pm, target, name=name)
        except (pluggy.PluginValidationError, ValueError) as e:
            raise PluginError(name, distribution, "registration", " ".join(str(e).split())) from e
        try:
            self._pm.check_pending()
            refused = refused_option(self._pm, target, name)
        except pluggy.PluginValidationError as e:
            refused = unknown_hook(self._pm, e)
        if refused is not None:
            self._pm.unregister(target)
            raise PluginError(name, distribution, "registration", refused)
        hooks = sorted(caller.name for caller in self._pm.get_hookcallers(target) or [])
        plugin = LoadedPlugin(name, priority, source, distribution, obj, hooks, reads, read_at_start,
                              registered=target)
        self.plugins.append(plugin)
        self.plugins.sort(key=lambda p: (p.priority, p.name))
        self._callers.clear()
        return plugin

    def names(self) -> list[str]:
        return [p.name for p in self.plugins]

    def enable_tracing(self) -> None:
        """Log every hook call, one line per plugin (:mod:`gpudask.plugin.hooktrace`)."""
        if not self.trace:
            self.trace = True
            self._pm.add_hookcall_monitoring(hooktrace.before, hooktrace.after)

    def _caller(self, hook_name: str, plugin: LoadedPlugin) -> pluggy.HookCaller:
        key = (hook_name, plugin.name)
        if key not in self._callers:
            others = [p.registered for p in self.plugins if p is not plugin and hook_name in p.hooks]
            self._callers[key] = self._pm.subset_hook_caller(hook_name, remove_plugins=others)
        return self._callers[key]

    def _call_one(self, hook_name: str, plugin: LoadedPlugin, kwargs: Mapping[str, Any]) -> Any:
        returned = self._caller(hook_name, plugin)(**kwargs)
        result = returned[0] if returned else None  # pluggy leaves None results out of its list
        # checked and made plain data inside the call's isolation: no plugin code runs after it
        return hookresults.take(hook_name, plugin.name, result)

    def hook_functions(self, hook_name: str) -> dict[str, Callable[..., Any]]:
        """plugin name -> the function implementing ``hook_name``."""
        return {impl.plugin_name: impl.function for impl in getattr(self._pm.hook, hook_name).get_hookimpls()}

    @contextlib.contextmanager
    def timing(self, observe: Callable[[str, str, float], None]) -> Iterator[None]:
        """Within the block, ``observe(plugin, hook, seconds)`` after every implementation call."""
        previous, self._observe = self._observe, observe
        try:
            yield
        finally:
            self._observe = previous

    def _call(self, hook_name: str, plan: ProcessPlan | Mapping[str, Any] | None = None, isolate: bool = False,
              **kwargs: Any) -> list[tuple[LoadedPlugin, Any]]:
        """Each implementation's result, in priority order; with ``isolate`` a failing plugin's
        PluginError is its result instead of stopping the others."""
        if plan is not None:
            kwargs = dict(kwargs, plan=plan)
        # a ProcessPlan being built or applied (not a published plan's dict): its reasons name
        # the acting plugin, and section() shows the earlier steps' decisions only
        tracked = plan if plan is not None and not isinstance(plan, Mapping) else None
        if tracked is not None:
            tracked.settle_sections()
        results = []
        for plugin in self.plugins:
            if hook_name not in plugin.hooks:
                continue
            if tracked is not None:
                tracked.acting_plugin, tracked.acting_reads = plugin.name, plugin.reads
            start = time.perf_counter()
            try:
                result: Any = call_isolated(plugin.name, plugin.distribution, hook_name, self._call_one,
                                            [hook_name, plugin, kwargs])
            except PluginError as error:
                if not isolate or isinstance(error, PluginStopped):
                    raise
                result = error
            finally:
                if tracked is not None:
                    tracked.acting_plugin, tracked.acting_reads = "gpudask", ()
                if self._observe is not None:
                    self._observe(plugin.name, hook_name, time.perf_counter() - start)
            results.append((plugin, result))
        return results

    def config_options(self) -> list[Option]:
        options = list(CORE_OPTIONS)
        for _plugin, result in self._call("gpudask_config_options"):
            options += result or []
        return options

    def facts_sections(self) -> list[tuple[str, FactsSection]]:
        """Every plugin's facts sections, checked: ``[(plugin, section)]`` in priority order."""
        from gpudask.facts.sections import check_declared

        out: list[tuple[str, FactsSection]] = []
        taken: dict[str, str] = {}
        for plugin, result in self._call("gpudask_facts_sections"):
            for section in check_declared(plugin.name, plugin.distribution, result, taken):
                taken[section.name] = plugin.name
                out.append((plugin.name, section))
        return out

    def facts_packages(self) -> dict[str, list[str]]:
        """The packages the plugins read: ``{key: distributions}``, the first plugin's wins."""
        out: dict[str, list[str]] = {}
        for _plugin, result in self._call("gpudask_facts_packages"):
            for key, dists in (result or {}).items():
                out.setdefault(key, list(dists))
        return out

    def _names(self, hook_name: str, **kwargs: Any) -> list[str] | None:
        """Every answer's names in priority order, each once; None when every plugin said None."""
        found: list[str] | None = None
        for _plugin, result in self._call(hook_name, **kwargs):
            if result is not None:
                found = found or []
                found += [name for name in result if name not in found]
        return found

    def preimport(self, facts: Facts, role: str, protocol: str | None) -> list[str]:
        """The modules a ``role`` process of this host imports as it starts (``gpudask_preimport``)."""
        return self._names("gpudask_preimport", facts=facts, role=role, protocol=protocol) or []

    def likely_protocol(self, facts: Facts) -> str | None:
        """The protocol this host's scheduler most likely listens on, as the first plugin that
        knows says (``gpudask_likely_protocol``), or None."""
        return next((str(result) for _plugin, result in self._call("gpudask_likely_protocol", facts=facts)
                     if result is not None), None)

    def ucx_offered(self, facts: Facts) -> list[str] | None:
        """The transports this host's UCX offers (``gpudask_ucx_offered``), or None when no plugin knows."""
        return self._names("gpudask_ucx_offered", facts=facts)

    def validate(self, ctx: PlanContext) -> None:
        self._call("gpudask_validate", ctx=ctx)

    def plan_process(self, ctx: PlanContext, plan: ProcessPlan) -> None:
        self._call("gpudask_plan_process", plan, ctx=ctx)

    def select_transport(self, ctx: PlanContext, plan: ProcessPlan) -> None:
        self._call("gpudask_select_transport", plan, ctx=ctx)

    def plan_memory(self, ctx: PlanContext, plan: ProcessPlan) -> None:
        self._call("gpudask_plan_memory", plan, ctx=ctx)

    def plan_finish(self, ctx: PlanContext, plan: ProcessPlan) -> None:
        self._call("gpudask_plan_finish", plan, ctx=ctx)

    def report_rows(self, plan: Mapping[str, Any], published: Mapping[str, Any] | None
                    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Every plugin's report rows, checked: ``(rows, problems)``; a plugin that raises or
        returns a malformed row is left out with one problem line (its rows are not shown)."""
        rows: list[dict[str, Any]] = []
        problems: list[str] = []
        seen: dict[str, str] = {}  # column -> the plugin that has it
        for plugin, result in self._call("gpudask_report_rows", plan, isolate=True, published=published):
            if isinstance(result, PluginError):
                # a malformed row: what is wrong with it; a call that failed: its one line
                refused = isinstance(result.__cause__, hookresults.ResultProblem)
                problems.append(f"plugin {plugin.name}'s report rows left out: "
                                f"{result.cause if refused else result}")
                continue
            for row in result or []:
                first = seen.setdefault(row["column"], plugin.name)
                if first == plugin.name:
                    rows.append({"plugin": plugin.name, **row})
                else:
                    hookresults.warn_column_twice(row["column"], first, plugin.name)
        return rows, problems

    def context_init(self, ctx: PlanContext, plan: ProcessPlan) -> None:
        self._call("gpudask_context_init", plan, ctx=ctx)

    def listen_ahead(self, ctx: PlanContext, plan: ProcessPlan) -> None:
        """``gpudask_listen_ahead`` of every plugin; a failure is one debug line (the process's
        own listen meets its cause again and reports it there)."""
        for plugin, result in self._call("gpudask_listen_ahead", plan, isolate=True, ctx=ctx):
            if isinstance(result, PluginError):
                logger.debug("gpudask: %s", result)

    def client_setup(self, ctx: PlanContext, plan: ProcessPlan) -> None:
        self._call("gpudask_client_setup", plan, ctx=ctx)

    def _by_plugin(self, hook_name: str, ctx: PlanContext, plan: ProcessPlan, empty: bool) -> dict[str, Any]:
        """``{plugin: result}``, None results left out (and empty ones unless ``empty``)."""
        return {plugin.name: result for plugin, result in self._call(hook_name, plan, ctx=ctx)
                if result is not None and (empty or result)}

    def setup_memory(self, ctx: PlanContext, plan: ProcessPlan) -> dict[str, Any]:
        """``{plugin: its gpudask_setup_memory result}``.  Runs the hooks at every call: the
        once-per-process rule is :func:`gpudask.apply.process.setup_memory`'s."""
        return self._by_plugin("gpudask_setup_memory", ctx, plan, empty=True)

    def server_setup(self, ctx: PlanContext, plan: ProcessPlan, server: Any) -> None:
        self._call("gpudask_server_setup", plan, ctx=ctx, server=server)

    def applied_state(self, ctx: PlanContext, plan: ProcessPlan) -> dict[str, dict[str, Any]]:
        """Each plugin's read-back of what it applied: ``{plugin: {key: {planned, actual}}}``."""
        return self._by_plugin("gpudask_applied_state", ctx, plan, empty=False)

    def scheduler_check(self, ctx: PlanContext | None, reference: ProcessSide | Mapping[str, Any],
                        subject: ProcessSide | Mapping[str, Any] | None) -> list[Finding]:
        """Findings of every plugin; a plugin that raises (or returns something that is
        not a Finding) becomes a ``plugin-failed`` finding, the others still run."""
        findings = []
        for plugin, result in self._call("gpudask_scheduler_check", isolate=True, ctx=ctx,
                                         reference=reference, subject=subject):
            if isinstance(result, PluginError):
                findings.append(Finding("warning", "plugin-failed", f"the check could not finish: {result}",
                                        plugin=plugin.name))
                continue
            findings += result
        return findings

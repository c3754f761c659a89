"""The plugin manager: the plugins of this process, registered into pluggy, and the calls of their hooks.

In the manner of pytest's and tox's plugin managers, one object holds the plugins and
calls them: the rest of gpudask calls ``manager.select_transport(ctx, plan)``, never
``pm.hook.x``.  Which plugins load and what a plugin must be to be registered are
:mod:`gpudask.plugin.registration`'s rules (:func:`~gpudask.plugin.registration.select`,
:data:`BUILTIN_PLUGINS`, :data:`ESSENTIAL_PLUGINS`, re-exported here); the manager imports
and registers what they select, each entry point's module run isolated like a hook.

It calls the plugins one at a time in priority order, each through pluggy's hook caller
for that plugin alone (``PluginManager.subset_hook_caller`` without every other plugin,
cached per hook and plugin), so that a failure names the plugin, its distribution and the
hook, reasons are attributed to the plugin that made them, and a hook that isolates
failures lets the others run; and traces the calls (``enable_tracing``: :mod:`gpudask.plugin.hooktrace`
through pluggy's ``add_hookcall_monitoring``, one line per plugin and call).  Each call goes
through :func:`gpudask.plugin.hookcall.call_isolated`, which bounds it and turns whatever it raises
into a one-line PluginError; what it returns is checked by :mod:`gpudask.plugin.hookresults` before
gpudask uses it.

Only pluggy's public API is used.  What pluggy would order or wrap differently -- hook
wrappers (``wrapper=True``, ``hookwrapper=True``) and ``tryfirst``/``trylast`` -- is refused
at registration: gpudask's order is the plugin's ``priority``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

from gpudask.plugin import hookresults, hookspecs, hooktrace
from gpudask.config import CORE_OPTIONS, Option, Settings
from gpudask.errors import PluginError
from gpudask.findings import Finding
from gpudask.plugin.hookcall import PluginStopped, call_isolated
from gpudask.plugin.registration import (BUILTIN_DISTRIBUTION, BUILTIN_PLUGINS, DEFAULT_PRIORITY, ENTRY_POINT_GROUP,
                                  ESSENTIAL_PLUGINS, HOOKS, MAX_PRIORITY, MIN_PRIORITY, REFUSED_HOOKIMPL_OPTIONS,
                                  LoadedPlugin, declared, pluggy_target, refused_option, select,
                                  unknown_hook)

logger = logging.getLogger("distributed.gpudask")

if TYPE_CHECKING:
    from gpudask.facts.model import Facts
    from gpudask.facts.sections import FactsSection
    from gpudask.findings import ProcessSide
    from gpudask.plan.context import PlanContext
    from gpudask.plan.model import ProcessPlan

__all__ = ["BUILTIN_DISTRIBUTION", "BUILTIN_PLUGINS", "DEFAULT_PRIORITY", "ENTRY_POINT_GROUP", "ESSENTIAL_PLUGINS",
           "HOOKS", "MAX_PRIORITY", "MIN_PRIORITY", "REFUSED_HOOKIMPL_OPTIONS", "LoadedPlugin", "PluginManager"]

_M = TypeVar("_M", bound="PluginManager")


class _Pluggy(pluggy.PluginManager):
    """pluggy's manager, whose entry-point loading registers through gpudask's checks."""

    def __init__(self, owner: PluginManager) -> None:
        super().__init__(hookspecs.PROJECT)
        self.owner = owner
        self.direct = False  # True while gpudask's own register() calls pluggy's

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        if self.direct:
            return super().register(plugin, name)
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
        self._impls_of: dict[str, dict[str, pluggy.HookImpl]] = {}
        self._callers: dict[tuple[str, str], pluggy.HookCaller] = {}
        self.trace = False
        self._observe: Callable[[str, str, float], None] | None = None

    # -- loading ---------------------------------------------------------------
    @classmethod
    def from_environment(cls: type[_M], extra: Iterable[Any] = (), broken: list[PluginError] | None = None,
                         core: Settings | None = None) -> _M:
        """Load built-ins and entry points, honouring enable/disable lists and autoload
        (:func:`gpudask.plugin.registration.select`).

        A plugin that cannot be loaded raises :class:`PluginError`; with ``broken`` (a
        list), it is recorded there instead and the others load (``gpudask plugins``).
        ``core``: the settings holding the core's options (the bootstrap's one Settings of
        the process); left out, read from dask's config."""
        manager = cls()
        extra = list(extra)
        chosen = select(extra, core)
        if chosen.trace:
            manager.enable_tracing()
        for name in chosen.blocked:
            manager._pm.set_blocked(name)
        for name, module in chosen.builtins:
            try:
                obj = importlib.import_module(module)
            except Exception as e:  # noqa: BLE001 - any import failure is reported the same way
                error = PluginError(name, BUILTIN_DISTRIBUTION, "import", e)
                if broken is None:
                    raise error from e
                broken.append(error)
                continue
            manager.register(obj, name=name, source="builtin", distribution=BUILTIN_DISTRIBUTION)
        for name, dist in chosen.entry_points:
            try:
                manager._load_entry_point(name, dist)
            except PluginError as e:
                if broken is None:
                    raise
                broken.append(e)
        for obj in extra:
            named = getattr(obj, "name", None)
            if named and not manager._pm.is_blocked(named):
                manager.register(obj, source="registered")
        return manager

    def _load_entry_point(self, name: str, dist: str | None) -> None:
        """One entry point through pluggy, which skips blocked names; failures name the plugin."""
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
        # the distribution it came from, as pluggy recorded it
        for obj, distribution in self._pm.list_plugin_distributions():
            for plugin in self.plugins:
                if plugin.obj is obj and plugin.source == "entry point":
                    plugin.distribution = distribution.metadata["name"]

    def register(self, obj: Any, name: str | None = None, source: str = "registered",
                 distribution: str | None = None) -> LoadedPlugin | None:
        """Register ``obj`` (a module or object with ``name``, ``priority`` and hooks), checked
        by :mod:`gpudask.plugin.registration`'s rules.  None when the name is blocked (disabled)."""
        name = getattr(obj, "name", None) or name
        if not isinstance(name, str) or not name:
            raise PluginError(repr(obj), distribution, "registration", "a plugin needs a non-empty string 'name'")
        if self._pm.is_blocked(name):
            return None
        priority, reads, read_at_start = declared(obj, name, distribution)
        if any(p.name == name for p in self.plugins):
            raise PluginError(name, distribution, "registration", "another plugin already has this name")
        target = pluggy_target(obj, name)
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
            raise PluginError(name, distribution, "registration", unknown_hook(self._pm, e)) from e
        refused = refused_option(self._pm, target, name)
        if refused is not None:
            self._pm.unregister(target)
            raise PluginError(name, distribution, "registration", refused)
        hooks = sorted(caller.name for caller in self._pm.get_hookcallers(target) or [])
        plugin = LoadedPlugin(name, priority, source, distribution, obj, hooks, reads, read_at_start,
                              registered=target)
        self.plugins.append(plugin)
        self.plugins.sort(key=lambda p: (p.priority, p.name))
        # what the calls cached is for the plugins before this one
        self._impls_of.clear()
        self._callers.clear()
        return plugin

    def names(self) -> list[str]:
        return [p.name for p in self.plugins]

    # -- tracing ---------------------------------------------------------------
    def enable_tracing(self) -> None:
        """Log every hook call, one line per plugin: ``gpudask trace: <hook> -> <plugin>
        role=<role> index=<n>: <result> (<ms> ms)`` (docs/troubleshooting.md), through pluggy's
        ``add_hookcall_monitoring`` (each call is one plugin's: :meth:`_caller`)."""
        if not self.trace:
            self.trace = True
            self._pm.add_hookcall_monitoring(hooktrace.before, hooktrace.after)

    # -- calling ---------------------------------------------------------------
    def _impls(self, hook_name: str) -> dict[str, pluggy.HookImpl]:
        """plugin name -> its implementation of ``hook_name`` (pluggy's public HookImpl)."""
        if hook_name not in self._impls_of:
            caller = getattr(self._pm.hook, hook_name)
            self._impls_of[hook_name] = {impl.plugin_name: impl for impl in caller.get_hookimpls()}
        return self._impls_of[hook_name]

    def _caller(self, hook_name: str, plugin: LoadedPlugin) -> pluggy.HookCaller:
        """pluggy's hook caller of ``hook_name`` for ``plugin``'s implementation alone
        (``subset_hook_caller`` without every other plugin): each plugin is called on its
        own, so a failure names it, its reasons are its own and the others can still run."""
        key = (hook_name, plugin.name)
        if key not in self._callers:
            others = [p.registered for p in self.plugins if p.name != plugin.name and p.name in self._impls(hook_name)]
            self._callers[key] = self._pm.subset_hook_caller(hook_name, remove_plugins=others)
        return self._callers[key]

    def _call_one(self, hook_name: str, plugin: LoadedPlugin, kwargs: Mapping[str, Any]) -> Any:
        """``plugin``'s implementation of ``hook_name``, through pluggy, which hands it the
        arguments it names (checked against the spec at registration); its result or None."""
        returned = self._caller(hook_name, plugin)(**kwargs)
        result = returned[0] if returned else None  # pluggy leaves None results out of its list
        # still inside the call's isolation: the result checked and made plain data here
        # (gpudask.plugin.hookresults.take), so nothing of the plugin's runs once the call is left
        return hookresults.take(hook_name, plugin.name, result)

    def hook_functions(self, hook_name: str) -> dict[str, Callable[..., Any]]:
        """plugin name -> the function implementing ``hook_name`` (e.g. to tell which
        plugin a thread is in from its stack)."""
        return {name: impl.function for name, impl in self._impls(hook_name).items()}

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
        """Call each implementation in priority order.  With ``isolate`` a failing plugin's
        PluginError is returned as its result instead of stopping the others."""
        if plan is not None:
            kwargs = dict(kwargs, plan=plan)
        # a ProcessPlan being built or applied (not a published plan's dict): its reasons name
        # the acting plugin, and what section() shows is settled at the start of each step
        tracked = plan if plan is not None and not isinstance(plan, Mapping) else None
        impls = self._impls(hook_name)
        if tracked is not None:
            tracked.settle_sections()  # what section() shows: the earlier steps' decisions only
        results = []
        for plugin in self.plugins:
            if plugin.name not in impls:
                continue
            if tracked is not None:
                tracked.acting_plugin, tracked.acting_reads = plugin.name, plugin.reads
            start = time.perf_counter()
            try:
                # through pluggy's hook caller for this plugin alone; gpudask.plugin.hookcall isolates the call
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
            options += result  # checked in the call (hookresults.take)
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

    def preimport(self, facts: Facts, role: str, protocol: str | None) -> list[str]:
        """The modules a ``role`` process of this host imports as it starts, as the plugins
        name them (``gpudask_preimport``): every answer's names in priority order, each once."""
        found: list[str] = []
        for _plugin, result in self._call("gpudask_preimport", facts=facts, role=role, protocol=protocol):
            found += [m for m in result or () if m not in found]
        return found

    def likely_protocol(self, facts: Facts) -> str | None:
        """The protocol this host's scheduler most likely listens on, as the first plugin that
        knows says (``gpudask_likely_protocol``), or None."""
        for _plugin, result in self._call("gpudask_likely_protocol", facts=facts):
            if result is not None:
                return str(result)
        return None

    def ucx_offered(self, facts: Facts) -> list[str] | None:
        """The transports this host's UCX offers, as the plugins say (``gpudask_ucx_offered``):
        every answer's names together, in priority order, or None when no plugin knows."""
        hook = "gpudask_ucx_offered"
        found: list[str] | None = None
        for _plugin, result in self._call(hook, facts=facts):
            if result is None:
                continue
            found = found if found is not None else []
            found += [t for t in result if t not in found]
        return found

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

    def setup_memory(self, ctx: PlanContext, plan: ProcessPlan) -> dict[str, Any]:
        """Each plugin's ``gpudask_setup_memory`` result: ``{plugin: result}``, Nones left out.
        Runs the hooks at every call: the once-per-process rule is the apply stage's
        (:func:`gpudask.apply.process.setup_memory`)."""
        out = {}
        for plugin, result in self._call("gpudask_setup_memory", plan, ctx=ctx):
            if result is not None:
                out[plugin.name] = result
        return out

    def server_setup(self, ctx: PlanContext, plan: ProcessPlan, server: Any) -> None:
        self._call("gpudask_server_setup", plan, ctx=ctx, server=server)

    def applied_state(self, ctx: PlanContext, plan: ProcessPlan) -> dict[str, dict[str, Any]]:
        """Each plugin's read-back of what it applied: ``{plugin: {key: {planned, actual}}}``."""
        out = {}
        for plugin, result in self._call("gpudask_applied_state", plan, ctx=ctx):
            if result:
                out[plugin.name] = result
        return out

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
            findings += result  # plain Findings, made in the call (hookresults.findings_of)
        return findings

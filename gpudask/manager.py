"""Finding, ordering and calling plugins.

A thin typed layer over pluggy (in the manner of tox's plugin manager): the rest of
gpudask calls ``manager.select_transport(ctx, plan)``, never ``pm.hook.x``.  pluggy
does the registration and spec validation, the blocking of disabled plugins
(``set_blocked``), the loading of entry points (``load_setuptools_entrypoints``), the
check for unknown hooks (``check_pending``) and the tracing (``enable_tracing``).
gpudask adds what pluggy has no notion of: the built-ins registered from
:data:`BUILTIN_PLUGINS`, an explicit integer priority, and a call of one
implementation at a time in priority order, so that a failure names the plugin, its
distribution and the hook, and reasons are attributed to the plugin that made them.

Only pluggy's public API is used: the implementations come from
``HookCaller.get_hookimpls()`` and gpudask calls each one's ``function`` itself, with the
arguments it names.  What pluggy would order or wrap differently -- hook wrappers
(``wrapper=True``, ``hookwrapper=True``) and ``tryfirst``/``trylast`` -- is refused at
registration: gpudask's order is the plugin's ``priority``.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.metadata
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from gpudask import hookspecs
from gpudask.config import CORE_OPTIONS, Option, Settings, parse_bool, parse_name_list
from gpudask.errors import ConfigError, GpudaskError, PluginError
from gpudask.findings import Finding

if TYPE_CHECKING:
    from gpudask.plan.context import PlanContext
    from gpudask.plan.model import ProcessPlan

logger = logging.getLogger("distributed.gpudask")
trace_logger = logging.getLogger("distributed.gpudask.trace")

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


@dataclass
class LoadedPlugin:
    name: str
    priority: int
    source: str  # "builtin" | "entry point" | "registered"
    distribution: str | None
    obj: Any
    hooks: list[str] = field(default_factory=list)
    reads: tuple[str, ...] = ()  # the plan sections of other plugins it reads (its reads_sections)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "priority": self.priority, "source": self.source,
                "distribution": self.distribution, "hooks": list(self.hooks),
                **({"reads_sections": list(self.reads)} if self.reads else {})}


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
    """Loads the plugins allowed by config and environment and calls their hooks."""

    def __init__(self) -> None:
        self._pm = _Pluggy(self)
        self._pm.add_hookspecs(hookspecs)
        self.loading_dist: str | None = None  # the distribution of the entry point being loaded
        self.plugins: list[LoadedPlugin] = []
        self._callers: dict[str, dict[str, pluggy.HookImpl]] = {}
        self.trace = False
        self._observe: Callable[[str, str, float], None] | None = None

    # -- loading ---------------------------------------------------------------
    @classmethod
    def from_environment(cls, extra: Iterable[Any] = (), broken: list[PluginError] | None = None) -> PluginManager:
        """Load built-ins and entry points, honouring enable/disable lists and autoload.

        A plugin that cannot be loaded raises :class:`PluginError`; with ``broken`` (a
        list), it is recorded there instead and the others load (``gpudask plugins``)."""
        manager = cls()
        core = Settings(CORE_OPTIONS)
        enable = parse_name_list(os.environ["GPUDASK_PLUGINS"]) if os.environ.get("GPUDASK_PLUGINS") \
            else core["gpudask.plugins.enable"]
        disable = set(core["gpudask.plugins.disable"]) | set(parse_name_list(os.environ.get("GPUDASK_DISABLE_PLUGINS")))
        autoload = core["gpudask.plugins.autoload"] and not _env_flag("GPUDASK_DISABLE_PLUGIN_AUTOLOAD")
        if core["gpudask.plugins.trace"] or _env_flag("GPUDASK_TRACE_PLUGINS"):
            manager.enable_tracing()

        third_party = _third_party_entry_points()
        extra = list(extra)
        known = {n for n, _ in BUILTIN_PLUGINS} | set(third_party) | {getattr(p, "name", "") for p in extra}
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
        if autoload:
            for name, (ep, dist) in sorted(third_party.items()):
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
        self.loading_dist = dist
        try:
            self._pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
        except PluginError:
            raise
        except Exception as e:  # noqa: BLE001 - an import failure of a third-party plugin
            raise PluginError(name, dist, "import", e) from e
        finally:
            self.loading_dist = None

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
        if any(p.name == name for p in self.plugins):
            raise PluginError(name, distribution, "registration", "another plugin already has this name")
        self._pm.direct = True
        try:
            self._pm.register(obj, name=name)
        except (pluggy.PluginValidationError, ValueError) as e:
            raise PluginError(name, distribution, "registration", str(e)) from e
        finally:
            self._pm.direct = False
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as e:
            self._pm.unregister(obj)
            raise PluginError(name, distribution, "registration", self._unknown_hook(e)) from e
        refused = self._refused_option(obj, name)
        if refused is not None:
            self._pm.unregister(obj)
            raise PluginError(name, distribution, "registration", refused)
        hooks = sorted(caller.name for caller in self._pm.get_hookcallers(obj) or [])
        plugin = LoadedPlugin(name, priority, source, distribution, obj, hooks, tuple(reads))
        self.plugins.append(plugin)
        self.plugins.sort(key=lambda p: (p.priority, p.name))
        self._callers.clear()
        return plugin

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

    def _unknown_hook(self, error: pluggy.PluginValidationError) -> str:
        unknown = sorted(n for n, caller in vars(self._pm.hook).items()
                         if n.startswith(hookspecs.PROJECT) and caller.spec is None)
        if not unknown:
            return str(error)
        close = difflib.get_close_matches(unknown[0], HOOKS, n=1)
        return f"unknown hook {unknown[0]!r}" + (f"; did you mean {close[0]!r}?" if close else "")

    def names(self) -> list[str]:
        return [p.name for p in self.plugins]

    # -- tracing ---------------------------------------------------------------
    def enable_tracing(self) -> None:
        """Log every hook call (through pluggy's tracer, in the lines of its
        ``enable_tracing``) and, per plugin, its result and duration."""
        self.trace = True
        self._pm.trace.root.setwriter(_trace_write)

    # -- calling ---------------------------------------------------------------
    def _impls(self, hook_name: str) -> dict[str, pluggy.HookImpl]:
        """plugin name -> its implementation of ``hook_name`` (pluggy's public HookImpl)."""
        if hook_name not in self._callers:
            caller = getattr(self._pm.hook, hook_name)
            self._callers[hook_name] = {impl.plugin_name: impl for impl in caller.get_hookimpls()}
        return self._callers[hook_name]

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
            impl = impls.get(plugin.name)
            if impl is None:
                continue
            if tracked is not None:
                tracked.acting_plugin, tracked.acting_reads = plugin.name, plugin.reads
            start = time.perf_counter()
            if self.trace:
                hooktrace = self._pm.trace.root.get("hook")
                hooktrace.root.indent += 1
                hooktrace(hook_name, kwargs)
            try:
                # an implementation takes any subset of the hook's arguments (pluggy checked
                # them against the spec at registration)
                result: Any = impl.function(*[kwargs[arg] for arg in impl.argnames])
                if self.trace:
                    hooktrace("finish", hook_name, "-->", [result])
            except Exception as e:  # noqa: BLE001
                # a plugin's own one-line error keeps its text; anything else its type too
                error = PluginError(plugin.name, plugin.distribution, hook_name,
                                    str(e) if isinstance(e, GpudaskError) else e)
                if not isolate:
                    raise error from e
                result = error
            finally:
                if tracked is not None:
                    tracked.acting_plugin, tracked.acting_reads = "gpudask", ()
                if self.trace:
                    hooktrace.root.indent -= 1
                if self._observe is not None:
                    self._observe(plugin.name, hook_name, time.perf_counter() - start)
            if self.trace:
                where = f" role={tracked.role} index={tracked.index}" if tracked is not None else ""
                # pluggy's "finish" line above carries the result; this one names the plugin
                outcome = "failed" if isinstance(result, PluginError) else "done"
                self._pm.trace.root.get("gpudask")(
                    f"{hook_name} -> {plugin.name}{where}: {outcome} in {(time.perf_counter() - start) * 1e3:.1f} ms")
            results.append((plugin, result))
        return results

    def config_options(self) -> list[Option]:
        options = list(CORE_OPTIONS)
        for plugin, result in self._call("gpudask_config_options"):
            for opt in result or []:
                if not isinstance(opt, Option) or not opt.key.startswith("gpudask."):
                    raise PluginError(plugin.name, plugin.distribution, "gpudask_config_options",
                                      f"options must be gpudask.pluginapi.Option with keys under 'gpudask.', "
                                      f"got {opt!r}")
                options.append(opt)
        return options

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
        seen: set[str] = set()
        for plugin, result in self._call("gpudask_report_rows", plan, isolate=True, published=published):
            problem = str(result) if isinstance(result, PluginError) else _report_rows_problem(result)
            if problem is not None:
                problems.append(f"plugin {plugin.name}'s report rows left out: {problem}")
                continue
            for row in result or []:
                if row["column"] not in seen:
                    seen.add(row["column"])
                    rows.append({"plugin": plugin.name, **row})
        return rows, problems

    def context_init(self, ctx: PlanContext, plan: ProcessPlan) -> None:
        self._call("gpudask_context_init", plan, ctx=ctx)

    def setup_memory(self, ctx: PlanContext, plan: ProcessPlan) -> dict[str, Any]:
        """Each plugin's ``gpudask_setup_memory`` result: ``{plugin: result}``, Nones left out.
        Runs the hooks at every call: the once-per-process rule is the apply stage's
        (:func:`gpudask.apply.process.setup_memory`)."""
        return {p.name: r for p, r in self._call("gpudask_setup_memory", plan, ctx=ctx) if r is not None}

    def preload(self, ctx: PlanContext, plan: ProcessPlan, server: Any) -> None:
        self._call("gpudask_preload", plan, ctx=ctx, server=server)

    def applied_state(self, ctx: PlanContext, plan: ProcessPlan) -> dict[str, dict[str, Any]]:
        """Each plugin's read-back of what it applied: ``{plugin: {key: {planned, actual}}}``."""
        out = {}
        for plugin, result in self._call("gpudask_applied_state", plan, ctx=ctx):
            if not result:
                continue
            problem = _applied_state_problem(result)
            if problem is not None:
                raise PluginError(plugin.name, plugin.distribution, "gpudask_applied_state",
                                  f"returned {problem}; expected None or a dict "
                                  "{key: {'planned': value, 'actual': value}}")
            out[plugin.name] = result
        return out

    def scheduler_check(self, ctx: PlanContext | None, scheduler_facts: Mapping[str, Any] | None,
                        worker_facts: Mapping[str, Any] | None) -> list[Finding]:
        """Findings of every plugin; a plugin that raises (or returns something that is
        not a Finding) becomes a ``plugin-failed`` finding, the others still run."""
        findings = []
        for plugin, result in self._call("gpudask_scheduler_check", isolate=True, ctx=ctx,
                                         scheduler_facts=scheduler_facts, worker_facts=worker_facts):
            if isinstance(result, PluginError):
                findings.append(Finding("warning", "plugin-failed", f"the check could not finish: {result}",
                                        plugin=plugin.name))
                continue
            for finding in result or []:
                if isinstance(finding, dict) and Finding.is_finding_dict(finding):
                    finding = Finding.from_dict(finding)
                if not isinstance(finding, Finding):
                    finding = Finding("warning", "plugin-failed", f"the check could not finish: plugin returned "
                                      f"{type(finding).__name__}, not a gpudask.pluginapi.Finding",
                                      plugin=plugin.name)
                finding.plugin = finding.plugin or plugin.name
                findings.append(finding)
        return findings


def _applied_state_problem(result: Any) -> str | None:
    """What is wrong with a ``gpudask_applied_state`` result, or None."""
    if not isinstance(result, Mapping):
        return f"a {type(result).__name__}"
    for key, pair in result.items():
        if not isinstance(key, str):
            return f"a {type(key).__name__} key {key!r:.60}"
        if not isinstance(pair, Mapping):
            return f"{type(pair).__name__} for key {key!r:.60}"
        if "planned" not in pair or "actual" not in pair:
            return f"{sorted(map(str, pair))!r:.80} for key {key!r:.60}"
    return None


REPORT_ROW_KEYS: dict[str, type | tuple[type, ...]] = {"column": str, "summary": str, "note": (str, type(None)),
                                                      "bytes": bool, "keys": (list, tuple)}


def _report_rows_problem(result: Any) -> str | None:
    """What is wrong with a ``gpudask_report_rows`` result, or None."""
    if result is None:
        return None
    if not isinstance(result, (list, tuple)):
        return f"returned a {type(result).__name__}; expected None or a list of rows"
    for row in result:
        if not isinstance(row, Mapping) or not isinstance(row.get("column"), str) or not isinstance(
                row.get("summary", ""), str):
            return f"a row {row!r:.80} is not a dict with a string 'column' and 'summary'"
        for key, kinds in REPORT_ROW_KEYS.items():
            if key in row and not isinstance(row[key], kinds):
                return f"a row's {key!r} is a {type(row[key]).__name__}"
    return None


def _trace_write(message: str) -> None:
    if not trace_logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("gpudask trace: %(message)s"))
        trace_logger.addHandler(handler)
        trace_logger.setLevel(logging.INFO)
        trace_logger.propagate = False
    for line in message.rstrip("\n").splitlines():
        trace_logger.info(line)

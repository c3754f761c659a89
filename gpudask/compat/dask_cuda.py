"""dask-cuda's ``LocalCUDACluster`` keyword arguments, as the plugins declare them.

This is migration knowledge about another project's API (docs/migrating-from-dask-cuda.md),
not planning: nothing here decides anything, and the core names none of the arguments.
Each plugin says which argument one of its settings stands for (``Option.dask_cuda_kwarg``,
``dask_cuda_convert``), and which arguments of its topic gpudask has no equivalent for (its
module attribute ``dask_cuda_refused``).  An argument whose plugin is not loaded is found
among the built-in plugins that are not loaded, so its line names its setting all the same.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpudask.errors import ConfigError

# the one refusal that names no plugin's setting: CUDA_VISIBLE_DEVICES is the process's
REFUSED_BY_CORE = {
    "CUDA_VISIBLE_DEVICES": "set the CUDA_VISIBLE_DEVICES environment variable of this process before creating the "
                            "cluster (gpudask reads it when it plans)",
}
# pre_import is LocalGPUCluster's own (added to preload); it is listed with the others
OWN_ARGUMENTS = ("pre_import",)


@dataclass(frozen=True)
class Argument:
    """One ``LocalCUDACluster`` argument that is a gpudask setting."""

    name: str  # the keyword argument
    key: str  # the gpudask setting it is
    convert: Callable[[Any], Any] | None  # the value as the setting's (None: as given)
    loaded: bool  # the plugin declaring the setting is loaded

    def take(self, given: Any, shown: str, spelled: str, settings: dict[str, Any], names: dict[str, str]) -> None:
        """The setting ``given`` (``shown``: as given) stands for into ``settings`` and
        ``names``; refused in one line when no loaded plugin provides it (``spelled``: the
        argument or option to leave out)."""
        if not self.loaded:
            raise ConfigError(f"{shown} sets {self.key}, which no loaded gpudask plugin provides (is its plugin "
                              f"disabled? `gpudask plugins` lists them); accepted: enable the plugin or leave "
                              f"{spelled} out")
        value = given if self.convert is None else self.convert(given)
        if value is not None:
            settings[self.key], names[self.key] = value, shown


@dataclass(frozen=True)
class Table:
    arguments: dict[str, Argument]
    refused: dict[str, str]  # argument -> what to use instead


def table() -> Table:
    """The arguments the loaded plugins declare, then those of the built-in plugins that are
    not loaded (``loaded=False``: refused, naming the setting)."""
    arguments: dict[str, Argument] = {}
    refused = dict(REFUSED_BY_CORE)
    for options, plugins, loaded in _declarations():
        for option in options:
            name = getattr(option, "dask_cuda_kwarg", None)
            if isinstance(name, str) and name not in arguments:
                arguments[name] = Argument(name, option.key, option.dask_cuda_convert, loaded)
        _refusals(plugins, "dask_cuda_refused", "", refused)
    return Table(arguments, refused)


def _declarations() -> list[tuple[list[Any], list[Any], bool]]:
    """``(options, plugin objects, loaded)`` of the loaded plugins, then of the built-ins that
    are not loaded (disabled): those are read only to name what an argument would have set."""
    from gpudask import bootstrap
    from gpudask.plugin.registration import BUILTIN_PLUGINS

    inputs = bootstrap.inputs()  # the bootstrap registers the plugins' defaults: the cluster's settings put back
    loaded = {p.name for p in inputs.manager.plugins}
    unloaded = []
    for name, module_name in BUILTIN_PLUGINS:
        if name not in loaded:
            try:
                unloaded.append(importlib.import_module(module_name))
            except Exception:  # noqa: BLE001 - a built-in that cannot load is reported where plugins load
                continue
    return [(list(inputs.settings.options.values()), [p.obj for p in inputs.manager.plugins], True),
            ([option for module in unloaded for option in _options_of(module)], unloaded, False)]


def _options_of(plugin: Any) -> list[Any]:
    """The options ``plugin`` declares ([] when its declaration fails: reported where plugins load)."""
    declare = getattr(plugin, "gpudask_config_options", None)
    try:
        return list(declare() or []) if callable(declare) else []
    except Exception:  # noqa: BLE001
        return []


def _refusals(plugins: Iterable[Any], attribute: str, prefix: str, refused: dict[str, str]) -> None:
    """The refusals the plugins declare (their module attribute ``attribute``: ``{name: what
    to use instead}``, names starting with ``prefix``) into ``refused``, the first one standing."""
    for plugin in plugins:
        declared = getattr(plugin, attribute, None)
        for name, instead in declared.items() if isinstance(declared, dict) else ():
            if isinstance(name, str) and name.startswith(prefix) and isinstance(instead, str):
                refused.setdefault(name, instead)


def take_arguments(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Take ``LocalCUDACluster``'s arguments out of ``kwargs``.

    :return: ``({setting: value}, {setting: argument})`` for the arguments that are a
        gpudask setting (None values, dask-cuda's "not given", are dropped).
    :raises ConfigError: one line for an argument gpudask has no equivalent for, or whose
        setting no loaded plugin provides.
    """
    known = table()
    for name, instead in known.refused.items():
        given = kwargs.pop(name, None)
        # None is dask-cuda's "not given"; False, a plugin's refused flag turned off
        if given is not None and not (given is False and name not in REFUSED_BY_CORE):
            raise ConfigError(f"{name}={given!r} (a dask-cuda LocalCUDACluster argument) is not supported by "
                              f"LocalGPUCluster; instead: {instead}")
    settings: dict[str, Any] = {}
    names: dict[str, str] = {}
    for arg in known.arguments.values():
        given = kwargs.pop(arg.name, None)
        if given is not None:  # None: dask-cuda's "not given"
            arg.take(given, f"{arg.name}={given!r}", arg.name, settings, names)
    return settings, names


def accepted_names() -> list[str]:
    """The ``LocalCUDACluster`` arguments ``LocalGPUCluster`` takes (for a refusal's line)."""
    return sorted([a.name for a in table().arguments.values() if a.loaded] + list(OWN_ARGUMENTS))


# -- dask-cuda's worker options on stock `dask worker` / `dask scheduler --preload gpudask` --
# the one dask cuda worker option that names no plugin's setting: stock has its own form
REFUSED_OPTIONS_BY_CORE = {
    "--pre-import": "stock --preload, after gpudask (--preload gpudask --preload cudf)",
}


def refused_options() -> dict[str, str]:
    """``dask cuda worker`` options gpudask has no equivalent for: ``{option: what to do
    instead}``, from the core and each plugin's ``dask_cuda_refused_options`` (the loaded
    plugins and the disabled built-ins: the option is refused either way)."""
    refused = dict(REFUSED_OPTIONS_BY_CORE)
    for _options, plugins, _loaded in _declarations():
        _refusals(plugins, "dask_cuda_refused_options", "--", refused)
    return refused


@dataclass(frozen=True)
class CliOption:
    """One ``dask cuda worker`` option that is a gpudask setting."""

    spelling: str  # as declared: "--rmm-pool-size" or "--enable-nvlink/--disable-nvlink"
    argument: Argument

    @property
    def flag(self) -> bool:
        return "/" in self.spelling

    @property
    def names(self) -> list[str]:
        return self.spelling.split("/")

    @property
    def dest(self) -> str:
        return self.names[0].lstrip("-").replace("-", "_")


def cli_options() -> list[CliOption]:
    """The dask-cuda worker options the loaded plugins (and the disabled built-ins, to be
    refused naming their setting) declare, sorted by name."""
    found: dict[str, CliOption] = {}
    for options, _plugins, loaded in _declarations():
        for option in options:
            spelling = getattr(option, "dask_cuda_option", None)
            if isinstance(spelling, str) and spelling.startswith("--") and spelling not in found:
                found[spelling] = CliOption(spelling, Argument(option.dask_cuda_kwarg or spelling, option.key,
                                                               option.dask_cuda_convert, loaded))
    return sorted(found.values(), key=lambda o: o.names[0])


def click_params() -> list[Any]:
    """The options as click parameters (gpudask's ``dask_setup`` command takes them)."""
    import click

    return [click.Option([o.spelling] if o.flag else [o.names[0]], o.dest, default=None,
                         is_flag=False if not o.flag else None, help=f"gpudask setting {o.argument.key}")
            for o in cli_options()]


def known_option(arg: str) -> bool:
    """Is ``arg`` (``--x`` or ``--x=v``) a dask-cuda option gpudask takes?"""
    name = arg.split("=", 1)[0]
    return any(name in o.names for o in cli_options()) or name in refused_options()


def take_cli_argv(argv: list[str] | tuple[str, ...], command: str) -> tuple[dict[str, Any], dict[str, str]]:
    """dask-cuda's worker options given after ``--preload gpudask`` on ``dask {command}``.

    :return: ``({setting: value}, {setting: the option as given})``.
    :raises ConfigError: one line for an unknown option (with the closest known one), an
        option missing its value, one gpudask has no equivalent for, or one whose setting no
        loaded plugin provides.
    """
    import difflib

    import click

    options = cli_options()
    where = f"dask {command} --preload gpudask"
    accepted = ", ".join(o.spelling for o in options)
    refused = refused_options()
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name in refused:
            raise ConfigError(f"{name} (a dask cuda worker option) is not taken by {where}; instead: "
                              f"{refused[name]}")
        if name.startswith("-") and not any(name in o.names for o in options):
            every = [n for o in options for n in o.names]
            close = difflib.get_close_matches(name, every, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"{name}: not an option of {where}{hint} accepted after --preload gpudask: stock "
                              f"dask {command} options, and dask-cuda's worker options {accepted}")
    command_obj = click.Command("dask_setup", params=click_params())
    try:
        ctx = command_obj.make_context("dask_setup", list(argv), allow_extra_args=False, help_option_names=[])
    except click.UsageError as e:
        raise ConfigError(f"{where} {' '.join(argv)}: {e.format_message().rstrip('.')}") from None
    settings: dict[str, Any] = {}
    names: dict[str, str] = {}
    for option in options:
        given = ctx.params.get(option.dest)
        if given is None:
            continue
        shown = (option.names[0] if given else option.names[1]) if option.flag else f"{option.names[0]} {given}"
        option.argument.take(given, shown, option.names[0], settings, names)
    return settings, names


def without_effect(host: Any, given_as: dict[str, str]) -> list[str]:
    """The arguments given that do nothing here: a UCX-only setting (``Option.ucx_only``) with
    another protocol, and those whose plugin skipped every worker of ``host``'s plan (no GPU
    visible, ...): one line each, naming the argument and why."""
    from gpudask import bootstrap

    inputs = bootstrap.inputs()
    options = inputs.settings.options
    ucx_only = [given for key, given in given_as.items() if getattr(options.get(key), "ucx_only", False)]
    lines = []
    if ucx_only and host.protocol not in ("ucx", "ucxx"):
        lines.append(f"{', '.join(ucx_only)} {'has' if len(ucx_only) == 1 else 'have'} no effect: the protocol is "
                     f"{host.protocol}, and UCX transports apply only over UCX (--protocol ucx, a ucx:// scheduler)")
    declared: dict[str, str] = {}  # setting -> the loaded plugin declaring it
    for loaded in inputs.manager.plugins:
        for option in _options_of(loaded.obj):
            declared.setdefault(option.key, loaded.name)
    by_plugin: dict[tuple[str, str], list[str]] = {}
    for key, given in given_as.items():
        if given in ucx_only and lines:
            continue  # said above
        plugin = declared.get(key)
        skipped = [next((r.why for r in plan.reasons if r.plugin == plugin and r.decision == "skipped"), None)
                   for plan in host.workers]
        if plugin is None or not skipped or any(why is None for why in skipped):
            continue
        by_plugin.setdefault((plugin, str(skipped[0])), []).append(given)
    return lines + [f"{', '.join(given)} {'has' if len(given) == 1 else 'have'} no effect: plugin {plugin} is "
                    f"skipped in every worker ({why})" for (plugin, why), given in by_plugin.items()]

"""dask-cuda's ``LocalCUDACluster`` keyword arguments, as the plugins declare them.

This is migration knowledge about another project's API (docs/migrating-from-dask-cuda.md),
not planning: nothing here decides anything, and the core names none of the arguments.
Each plugin says which argument one of its settings stands for (``Option.dask_cuda_kwarg``,
with ``dask_cuda_convert`` turning the argument's value into the setting's), and which
arguments of its topic gpudask has no equivalent for (its module attribute
``dask_cuda_refused``: ``{argument: what to use instead}``).  ``LocalGPUCluster`` takes an
argument as the setting for that cluster, and refuses in one line an argument gpudask has
no equivalent for, or one whose plugin is not loaded (disabled): that one is found among
the built-in plugins that are not loaded, so the line names its setting all the same.
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

    def value(self, given: Any) -> Any:
        return given if self.convert is None or given is None else self.convert(given)


@dataclass(frozen=True)
class Table:
    arguments: dict[str, Argument]
    refused: dict[str, str]  # argument -> what to use instead


def table() -> Table:
    """The arguments the loaded plugins declare, then those of the built-in plugins that are
    not loaded (``loaded=False``: refused, naming the setting)."""
    from gpudask import bootstrap

    inputs = bootstrap.inputs()  # the bootstrap registers the plugins' defaults: the cluster's settings put back
    arguments: dict[str, Argument] = {}
    refused = dict(REFUSED_BY_CORE)
    _add(arguments, refused, inputs.settings.options.values(), (p.obj for p in inputs.manager.plugins), True)
    loaded = {p.name for p in inputs.manager.plugins}
    options, modules = _unloaded_builtins(loaded)
    _add(arguments, refused, options, modules, False)
    return Table(arguments, refused)


def _add(arguments: dict[str, Argument], refused: dict[str, str], options: Iterable[Any], plugins: Iterable[Any],
         loaded: bool) -> None:
    for option in options:
        name = getattr(option, "dask_cuda_kwarg", None)
        if isinstance(name, str) and name not in arguments:
            arguments[name] = Argument(name, option.key, option.dask_cuda_convert, loaded)
    for plugin in plugins:
        declared = getattr(plugin, "dask_cuda_refused", None)
        if isinstance(declared, dict):
            for name, instead in declared.items():
                if isinstance(name, str) and isinstance(instead, str):
                    refused.setdefault(name, instead)


def _unloaded_builtins(loaded: set[str]) -> tuple[list[Any], list[Any]]:
    """The options and modules of the built-in plugins that are not loaded (disabled): read
    only to name what an argument would have set."""
    from gpudask.registration import BUILTIN_PLUGINS

    options: list[Any] = []
    modules: list[Any] = []
    for name, module_name in BUILTIN_PLUGINS:
        if name in loaded:
            continue
        try:
            module = importlib.import_module(module_name)
            declare = getattr(module, "gpudask_config_options", None)
            options += list(declare() or []) if callable(declare) else []
        except Exception:  # noqa: BLE001 - a built-in that cannot load is reported where plugins load
            continue
        modules.append(module)
    return options, modules


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
        if arg.name not in kwargs:
            continue
        given = kwargs.pop(arg.name)
        if given is None:
            continue  # dask-cuda's "not given"
        if not arg.loaded:
            raise ConfigError(f"{arg.name}={given!r} sets {arg.key}, which no loaded gpudask plugin provides (is its "
                              f"plugin disabled? `gpudask plugins` lists them); accepted: enable the plugin or leave "
                              f"{arg.name} out")
        value = arg.value(given)
        if value is not None:
            settings[arg.key] = value
            names[arg.key] = f"{arg.name}={given!r}"
    return settings, names


def accepted_names() -> list[str]:
    """The ``LocalCUDACluster`` arguments ``LocalGPUCluster`` takes (for a refusal's line)."""
    return sorted([a.name for a in table().arguments.values() if a.loaded] + list(OWN_ARGUMENTS))

"""Plans for described hosts, for a plugin's tests: no GPU, no process, no gpudask internals.

Imports nothing heavy at import time; only the standard library until :func:`plan_for` runs.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import pathlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudask.plan import HostPlan

__all__ = ["example_host", "example_hosts", "facts_file", "plan_for"]

_AUTOLOAD = "GPUDASK_DISABLE_PLUGIN_AUTOLOAD"


def _hosts_dir() -> pathlib.Path:
    return pathlib.Path(str(importlib.resources.files("gpudask.testing") / "hosts"))


def example_hosts() -> list[str]:
    """The names of the described hosts gpudask ships (``example_host(name)`` reads one)."""
    return sorted(p.stem for p in _hosts_dir().glob("*.json"))


def example_host(name: str) -> pathlib.Path:
    """The facts file of the shipped example host ``name`` (e.g. ``"dgx-8gpu-nvswitch-4ib"``)."""
    path = _hosts_dir() / f"{name.removesuffix('.json')}.json"
    if not path.is_file():
        raise ValueError(f"no example host {name!r}; accepted: {', '.join(example_hosts())}")
    return path


def facts_file(directory: str | os.PathLike[str], base: str | Mapping[str, Any] = "single-gpu",
               **changes: Any) -> pathlib.Path:
    """A new facts file in ``directory``: ``base`` (an example host's name, or the facts as a
    dict) with the top-level keys in ``changes`` replaced -- ``facts_file(tmp_path,
    "hgx-4gpu-2ib", cuda_visible_devices="0,1")``.  Each call writes a file of its own (facts are read
    once per path)."""
    data = dict(base) if isinstance(base, Mapping) else json.loads(example_host(base).read_text())
    data.update(changes)
    folder = pathlib.Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    stem = data.get("hostname") if isinstance(data.get("hostname"), str) else "host"
    n = 0
    while (folder / f"{stem}-{n}.json").exists():
        n += 1
    path = folder / f"{stem}-{n}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def plan_for(facts: str | os.PathLike[str], protocol: str = "ucx", nworkers: int | None = None, *,
             plugins: Iterable[Any] = (), config: Mapping[str, Any] | None = None,
             autoload: bool = False) -> HostPlan:
    """The host plan for the described host ``facts`` (a path, or an example host's name) by
    the built-in plugins and ``plugins`` (modules or objects), with the dask config ``config``
    set: what ``gpudask info --facts FILE --protocol P --json`` prints (``plan.to_dict()``).
    ``autoload``: also load the plugins installed through entry points (off: an installed copy
    of the plugin under test is not loaded beside ``plugins``)."""
    import dask.config

    from gpudask.bootstrap import plan_host, put_env

    path = os.fspath(facts)
    if not os.path.exists(path) and os.sep not in path:
        path = os.fspath(example_host(path))
    before = os.environ.get(_AUTOLOAD)
    os.environ[_AUTOLOAD] = "0" if autoload else "1"
    try:
        with dask.config.set(dict(config or {})):
            return plan_host(protocol, nworkers, facts_path=path, extra_plugins=tuple(plugins))
    finally:  # only this variable as it was (planning may set others: they stay)
        put_env(os.environ, {_AUTOLOAD: before})

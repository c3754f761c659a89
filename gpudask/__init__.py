"""gpudask: stock dask scheduler/worker, configured for GPUs by plugins.

``dask worker ADDR --preload gpudask`` imports this module in the CLI process and in
each worker process; ``dask scheduler --preload gpudask`` in the scheduler.  On import
in such a process gpudask plans for the host and applies this process's part before
``listen()`` (docs/architecture.md).  In any other process importing gpudask does nothing but
define names: no CUDA, no cupy/rmm/ucxx, no probing.
"""

from __future__ import annotations

from typing import Any

from gpudask._version import __version__
from gpudask.plugin.hookspecs import hookimpl

__all__ = ["__version__", "hookimpl", "initialize", "check", "cluster_kwargs", "LocalGPUCluster",
           "Option", "dask_setup", "GpudaskError"]

_LAZY = {
    "initialize": ("gpudask.apply.preload", "initialize"),
    "dask_setup": ("gpudask.apply.preload", "dask_setup"),
    "Option": ("gpudask.config", "Option"),
    "GpudaskError": ("gpudask.errors", "GpudaskError"),
    "check": ("gpudask.checks", "check"),
    "cluster_kwargs": ("gpudask.cluster", "cluster_kwargs"),
    "LocalGPUCluster": ("gpudask.cluster", "LocalGPUCluster"),
    "WorkerPlugin": ("gpudask.apply.server_plugins", "WorkerPlugin"),
    "NannyPlugin": ("gpudask.apply.server_plugins", "NannyPlugin"),
    "SchedulerPlugin": ("gpudask.apply.server_plugins", "SchedulerPlugin"),
}


def __getattr__(name: str) -> Any:
    import sys

    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    # a worker forked from gpudask's fork server finds the submodules loaded there, which its
    # own import of this package does not bind as attributes (gpudask_forkserver)
    sub = sys.modules.get(f"{__name__}.{name}")
    if sub is not None:
        return sub
    raise AttributeError(f"module 'gpudask' has no attribute {name!r}")


def _is_dask_server_process() -> bool:
    """Cheap test run on every import: are we a dask CLI or a nanny's worker process?"""
    import sys

    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.current_process().name == "Dask Worker process (from Nanny)":
        return True
    click = sys.modules.get("click")
    return click is not None and click.get_current_context(silent=True) is not None


if _is_dask_server_process():
    from gpudask.apply.preload import on_import as _on_import

    _on_import()
    # distributed looks for dask_setup on the module it preloaded
    from gpudask.apply.preload import dask_setup  # noqa: E402,F401

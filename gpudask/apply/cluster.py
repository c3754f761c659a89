"""One worker per GPU on this machine, from Python: ``LocalGPUCluster`` and ``cluster_kwargs``.

Both start *stock* dask workers (``Nanny`` processes) with gpudask preloaded, like
``dask worker --preload gpudask`` does, and a scheduler with gpudask preloaded, like
``dask scheduler --preload gpudask``.  Both call :func:`gpudask.initialize` first, so the
client process gets its part of the plan (UCX environment and config, the start method
of worker processes) before anything listens.

* ``gpudask.LocalGPUCluster(...)`` is a ``LocalCluster`` whose workers are named 0, 1, ...
  (``scale()`` adds the lowest free names).
* ``LocalCluster(**gpudask.cluster_kwargs(...))`` uses plain ``LocalCluster``.

In both, each worker process claims the lowest free worker number of this client's
workers when it starts and takes that worker's plan (its GPU) from the host plan the
client wrote -- the same mechanism as ``dask worker --nworkers N --preload gpudask``, and
the same whether the script imports gpudask at the top or inside its main block.

Importing this module imports ``distributed`` but never CUDA.
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

from distributed import LocalCluster
from dask.system import CPU_COUNT

from gpudask.errors import ConfigError

PRELOAD = "gpudask"

# dask-cuda's LocalCUDACluster arguments -> the gpudask setting each one is.  This is
# migration knowledge about another project's API (the same table as
# docs/migrating-from-dask-cuda.md), not planning: nothing here decides anything.  The core
# still learns no plugin's settings from it -- each key is looked up in the settings
# registry the loaded plugins contribute (`gpudask config`), and an argument whose
# setting no loaded plugin provides (a plugin disabled) is refused in one line naming it.
# (argument, setting, how the value becomes the setting's; None: the value as given)
_DASK_CUDA_SETTINGS: tuple[tuple[str, str, Any], ...] = (
    ("rmm_pool_size", "gpudask.rmm.pool-size", None),
    ("rmm_maximum_pool_size", "gpudask.rmm.maximum-pool-size", None),
    ("rmm_managed_memory", "gpudask.rmm.managed-memory", bool),
    ("rmm_async", "gpudask.rmm.allocator", lambda v: "async" if v else None),
    ("rmm_allocator_external_lib_list", "gpudask.rmm.libraries",
     lambda v: [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v),
    ("rmm_release_threshold", "gpudask.rmm.release-threshold", None),
    ("rmm_log_directory", "gpudask.rmm.log-directory", None),
    ("rmm_track_allocations", "gpudask.rmm.track-allocations", bool),
    ("device_memory_limit", "gpudask.spill.device-memory-limit", lambda v: None if v == "default" else v),
    ("enable_cudf_spill", "gpudask.spill.cudf", bool),
    ("cudf_spill_stats", "gpudask.spill.cudf-stats", None),
    ("log_spilling", "gpudask.spill.log", bool),
    ("enable_tcp_over_ucx", "gpudask.transport.tcp", None),
    ("enable_infiniband", "gpudask.transport.infiniband", None),
    ("enable_nvlink", "gpudask.transport.nvlink", None),
    ("enable_rdmacm", "gpudask.transport.rdmacm", None),
)
# LocalCUDACluster arguments gpudask has no equivalent for: what to use instead
_DASK_CUDA_REFUSED = {
    "CUDA_VISIBLE_DEVICES": "set the CUDA_VISIBLE_DEVICES environment variable of this process before creating the "
                            "cluster (gpudask reads it when it plans)",
    "jit_unspill": "gpudask has no JIT-unspill proxy objects; spilling is gpudask.spill.device-memory-limit",
    "shared_filesystem": "it only serves dask-cuda's JIT unspilling, which gpudask does not have; leave it out",
}


def _dask_cuda_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take LocalCUDACluster's arguments out of ``kwargs``: ``{setting: value}`` for those
    that map to a gpudask setting (None values, dask-cuda's "not given", are dropped).

    :raises ConfigError: one line for an argument gpudask has no equivalent for, or whose
        setting no loaded plugin provides.
    """
    for name, instead in _DASK_CUDA_REFUSED.items():
        if name in kwargs and kwargs[name] is not None and not (name == "jit_unspill" and kwargs[name] is False):
            raise ConfigError(f"{name}={kwargs[name]!r} (a dask-cuda LocalCUDACluster argument) is not supported by "
                              f"LocalGPUCluster; instead: {instead}")
        kwargs.pop(name, None)
    given = [(arg, key, convert) for arg, key, convert in _DASK_CUDA_SETTINGS if arg in kwargs]
    if not given:
        return {}
    from gpudask import bootstrap

    # the bootstrap registers the plugins' defaults: leaving this cluster's settings puts them back
    known = set(bootstrap.inputs().settings.options)
    settings: dict[str, Any] = {}
    for arg, key, convert in given:
        value = kwargs.pop(arg)
        if key not in known:
            raise ConfigError(f"{arg}={value!r} sets {key}, which no loaded gpudask plugin provides (is its plugin "
                              f"disabled? `gpudask plugins` lists them); accepted: enable the plugin or leave {arg} out")
        value = value if convert is None or value is None else convert(value)
        if value is not None:
            settings[key] = value
    return settings


def _nested(settings: dict[str, Any]) -> dict[str, Any]:
    """{"a.b.c": v} -> {"a": {"b": {"c": v}}} (the form of a Nanny's ``config``)."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        *parents, last = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def _client_session(protocol: str, n_workers: int | None) -> Any:
    """The client's gpudask session for ``protocol`` (applied in this process)."""
    from gpudask.apply.preload import initialize

    return initialize(protocol=protocol, nworkers=n_workers)


def _protocol_name(protocol: str | None) -> str:
    name = (protocol or "tcp").strip()
    return name[: -len("://")] if name.endswith("://") else name


def _merged_preload(value: Any) -> list[str]:
    if value is None:
        items: list[str] = []
    elif isinstance(value, str):
        items = [value]
    else:
        items = list(value)
    # gpudask first: RAPIDS_NO_INITIALIZE and the GPU pinning must be in place before a
    # user's preload imports cudf or touches CUDA
    return [PRELOAD, *(i for i in items if i != PRELOAD)]


def cluster_kwargs(n_workers: int | None = None, protocol: str | None = None,
                   threads_per_worker: int | None = None, **kwargs: Any) -> dict[str, Any]:
    """Keyword arguments for ``distributed.LocalCluster``: one worker per GPU, gpudask
    preloaded in the scheduler and every worker.

    ``LocalCluster(**gpudask.cluster_kwargs())`` is the one-liner.  Calls
    :func:`gpudask.initialize` (``protocol``) in this process first.

    :param n_workers: default: one per visible GPU (``CUDA_VISIBLE_DEVICES`` applied),
        1 without a GPU.  More workers than GPUs share GPUs round-robin (gpudask warns).
    :param protocol: ``"tcp"`` (default), ``"ucx"`` or ``"ucxx"``.
    :param threads_per_worker: default: 1 with GPUs (like dask-cuda), otherwise
        ``LocalCluster``'s default.
    :param kwargs: any other ``LocalCluster`` argument; ``preload``, ``env`` and
        ``scheduler_kwargs`` are merged with gpudask's, not replaced.
    """
    name = _protocol_name(protocol)
    s = _client_session(name, n_workers)
    gpus = s.host.facts.visible_gpus()
    n = n_workers if n_workers is not None else max(1, len(gpus))
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ConfigError(f"n_workers={n_workers!r} is not valid; accepted: an integer >= 0")
    if threads_per_worker is None and gpus:
        threads_per_worker = 1
    if kwargs.get("processes") is False:
        raise ConfigError("processes=False is not valid with gpudask; accepted: processes=True (each worker needs "
                          "its own process to get its own GPU and environment)")
    worker_class = kwargs.get("worker_class")
    if worker_class is not None and not _is_nanny(worker_class):
        raise ConfigError(f"worker_class={worker_class!r} is not valid with gpudask; accepted: a Nanny subclass "
                          "(each worker needs its own process to get its own GPU and environment)")
    if worker_class is None:
        _check_arguments(kwargs)
    out = dict(kwargs)
    out.update(n_workers=n, protocol=name, processes=True)
    if threads_per_worker is not None:
        out["threads_per_worker"] = threads_per_worker
    out["preload"] = _merged_preload(kwargs.get("preload"))
    env = {str(k): str(v) for k, v in (kwargs.get("env") or {}).items()}
    if env:
        out["env"] = env
    scheduler_kwargs = dict(kwargs.get("scheduler_kwargs") or {})
    scheduler_kwargs["preload"] = _merged_preload(scheduler_kwargs.get("preload"))
    out["scheduler_kwargs"] = scheduler_kwargs
    return out


def _check_arguments(kwargs: dict[str, Any]) -> None:
    """Refuse, before anything starts, an argument that neither ``LocalCluster`` nor the
    ``Nanny`` and ``Worker`` it hands its other arguments to accept (distributed would fail
    inside the worker process, with two tracebacks)."""
    import inspect

    from distributed import Nanny, Worker

    accepted = {name for f in (LocalCluster.__init__, Nanny.__init__, Worker.__init__)
                for name, p in inspect.signature(f).parameters.items()
                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ConfigError(f"{', '.join(unknown)}: not an argument of LocalCluster, Nanny or Worker; accepted: theirs, "
                          f"and in LocalGPUCluster dask-cuda's LocalCUDACluster arguments ("
                          f"{', '.join(a for a, _, _ in _DASK_CUDA_SETTINGS)}, pre_import)")


def _is_nanny(cls: Any) -> bool:
    from distributed import Nanny

    if isinstance(cls, str):
        from dask.utils import import_term

        cls = import_term(cls)
    return isinstance(cls, type) and issubclass(cls, Nanny)


class LocalGPUCluster(LocalCluster):
    """A ``LocalCluster`` with one stock worker per GPU and gpudask preloaded everywhere.

    The counterpart of dask-cuda's ``LocalCUDACluster``::

        from distributed import Client
        import gpudask

        cluster = gpudask.LocalGPUCluster()            # or protocol="ucx"
        client = Client(cluster)

    Each worker applies its own plan from ``gpudask info``: ``CUDA_VISIBLE_DEVICES`` rotated
    to start with its GPU, the ``GPU=1`` resource, UCX settings, CPU affinity, the memory
    pool.  ``scale(n)`` adds workers with the lowest free names and worker numbers.

    Parameters are those of :func:`cluster_kwargs` (and so of ``LocalCluster``), and
    dask-cuda's ``LocalCUDACluster`` arguments: each becomes its gpudask setting for this
    cluster (``rmm_pool_size="1GB"`` is ``gpudask.rmm.pool-size: 1GB``; the table is in
    the migration guide), ``pre_import`` is added to ``preload``; one gpudask has no
    equivalent for is refused in one line naming what to use instead.
    """

    def __init__(self, n_workers: int | None = None, protocol: str | None = None,
                 threads_per_worker: int | None = None, **kwargs: Any):
        import dask.config

        settings = _dask_cuda_arguments(kwargs)
        pre_import = kwargs.pop("pre_import", None)
        if pre_import:
            items = pre_import.split(",") if isinstance(pre_import, str) else list(pre_import)
            kwargs["preload"] = _merged_preload(kwargs.get("preload")) + [i.strip() for i in items if i.strip()]
        if settings:
            # the plan (made in this process) and every worker process see the settings;
            # the user's own dask config outside this cluster is left as it was
            kwargs["config"] = dask.config.merge(_nested(settings), kwargs.get("config") or {})
        try:
            with dask.config.set(settings):
                self._gpudask_init(n_workers, protocol, threads_per_worker, kwargs)
        except ConfigError as e:
            # name the argument the user typed, not only the setting it became
            given = next((f"{arg}={v!r}" for arg, key, _ in _DASK_CUDA_SETTINGS for k, v in settings.items()
                          if k == key and key in str(e)), None)
            if given is None:
                raise
            raise ConfigError(f"{given}: {e}") from None

    def _gpudask_init(self, n_workers: int | None, protocol: str | None, threads_per_worker: int | None,
                      kwargs: dict[str, Any]) -> None:
        kw = cluster_kwargs(n_workers, protocol, threads_per_worker, **kwargs)
        n = kw.pop("n_workers")
        self._gpudask_nworkers = n
        if kw.get("threads_per_worker") is None:
            kw["threads_per_worker"] = max(1, math.ceil(CPU_COUNT / max(n, 1)))
        if n and "memory_limit" not in kw:
            from distributed.worker_memory import parse_memory_limit

            kw["memory_limit"] = parse_memory_limit("auto", 1, n, logger=logging.getLogger("distributed.deploy"))
        # start with no worker, then add workers with their numbers (LocalCluster would give
        # every worker the same spec)
        super().__init__(n_workers=0, **kw)
        for _ in range(n):
            self.worker_spec.update(self.new_worker_spec())
        if not self.asynchronous and n:
            try:
                self.sync(self._correct_state)
            except Exception:
                self.close()
                raise

    def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
        """The lowest free name (the worker claims its number, and so its GPU, itself)."""
        taken = {name for name in self.worker_spec if isinstance(name, int)}
        index = next(i for i in range(len(taken) + 1) if i not in taken)
        return {index: copy.copy(self.new_spec)}

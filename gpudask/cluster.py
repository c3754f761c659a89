"""One worker per GPU on this machine, from Python: ``LocalGPUCluster`` and ``cluster_kwargs``.

Both start stock ``Nanny`` workers and a scheduler with gpudask preloaded, after
:func:`gpudask.initialize` gave this process its part of the plan.  Each worker process
claims the lowest free worker number and takes its plan (its GPU) from the host plan this
process wrote, as under ``dask worker --nworkers N --preload gpudask``.  Imports no CUDA.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
from typing import Any

import dask.config
from dask.system import CPU_COUNT
from distributed import LocalCluster, Nanny, Worker

from gpudask.compat import dask_cuda
from gpudask.config import shown
from gpudask.errors import ConfigError, GpudaskError, PluginError


PRELOAD = "gpudask"


def _protocol_name(protocol: str | None) -> str:
    if protocol is not None and not isinstance(protocol, str):
        raise ConfigError(f"protocol={shown(protocol)} is not valid; accepted: a string, \"tcp\" (default), "
                          "\"ucx\" or \"ucxx\"")
    name = (protocol or "tcp").strip()
    return name[: -len("://")] if name.endswith("://") else name


def _check_tls(name: str, kwargs: dict[str, Any]) -> None:
    """``protocol="tls"`` needs certificates: without ``security=`` or distributed's TLS
    config, LocalCluster ends in "Cluster failed to start" after a traceback per process."""
    if "tls" not in [p.strip() for p in name.split(",")] or kwargs.get("security") is not None:
        return
    from distributed.security import Security

    try:
        context = Security().get_connection_args("client").get("ssl_context")
    except Exception as e:  # noqa: BLE001 - a certificate file that is missing or not PEM
        raise ConfigError(f"protocol={name!r}: distributed's TLS settings cannot be used ({type(e).__name__}: "
                          f"{(str(e).splitlines() or ['?'])[0][:200]})") from None
    if context is None:
        raise ConfigError(f"protocol={name!r} needs certificates; accepted: security=Security(...) (e.g. "
                          "Security.temporary()) or distributed's TLS config (distributed.comm.tls.*)")


def _merged_preload(value: Any) -> list[str]:
    items: list[str] = [] if value is None else [value] if isinstance(value, str) else list(value)
    # gpudask first: RAPIDS_NO_INITIALIZE and the GPU pinning must be in place before a
    # user's preload imports cudf or touches CUDA
    return [PRELOAD, *(i for i in items if i != PRELOAD)]


def _warn_if_sharing_gpus(n: int) -> None:
    """Warn when another process of this host already runs workers on this cluster's GPUs."""
    from gpudask.apply import hostfile, process

    s = process.current()
    if not n or s is None:
        return
    found = hostfile.sharing_gpus(s.host)
    if found is not None:
        import warnings

        pids, indices = found
        warnings.warn(f"gpudask: another gpudask process on this host (pid {pids}) already runs workers on GPU(s) "
                      f"{indices}: this LocalGPUCluster's {n} worker(s) share them (each process numbers its "
                      "workers from 0); start one cluster for all the GPUs, or give each process its own "
                      "CUDA_VISIBLE_DEVICES", UserWarning, stacklevel=4)


def cluster_kwargs(n_workers: int | None = None, protocol: str | None = None,
                   threads_per_worker: int | None = None, **kwargs: Any) -> dict[str, Any]:
    """Keyword arguments for ``distributed.LocalCluster``: one worker per GPU, gpudask preloaded
    in the scheduler and every worker (``LocalCluster(**gpudask.cluster_kwargs())``); calls
    :func:`gpudask.initialize` first.

    :param n_workers: default: one per visible GPU, 1 without a GPU (more share GPUs round-robin).
    :param protocol: ``"tcp"`` (default), ``"ucx"`` or ``"ucxx"``.
    :param threads_per_worker: default: 1 with GPUs, otherwise ``LocalCluster``'s default.
    :param kwargs: any other ``LocalCluster`` argument; ``preload``, ``env`` and
        ``scheduler_kwargs`` are merged with gpudask's, not replaced.
    """
    from gpudask.plan.planner import check_nworkers

    check_nworkers(n_workers, "n_workers")  # before planning: 2.5 or 10**7 plan nothing
    name = _protocol_name(protocol)
    _check_tls(name, kwargs)
    from gpudask.apply.preload import initialize

    s = initialize(protocol=name, nworkers=n_workers)  # the client's session, applied in this process
    gpus = s.host.facts.visible_gpus()
    n = n_workers if n_workers is not None else max(1, len(gpus))  # n_workers checked above
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
    """Refuse an argument none of ``LocalCluster``, ``Nanny`` and ``Worker`` accepts, before
    anything starts (distributed would fail in the worker process, with two tracebacks)."""
    accepted = {name for f in (LocalCluster.__init__, Nanny.__init__, Worker.__init__)
                for name, p in inspect.signature(f).parameters.items()
                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        import difflib

        ours = dask_cuda.accepted_names()
        close = {name: difflib.get_close_matches(name, sorted(accepted | set(ours)), n=1) for name in unknown}
        hint = "".join(f" (did you mean {match[0]}{'' if len(unknown) == 1 else f' for {name}'}?)"
                       for name, match in close.items() if match)
        raise ConfigError(f"{', '.join(unknown)}: not an argument of LocalCluster, Nanny or Worker{hint}; accepted: "
                          "theirs, "
                          f"and in LocalGPUCluster dask-cuda's LocalCUDACluster arguments ({', '.join(ours)})")


def _one_line(error: GpudaskError, given_as: dict[str, str]) -> GpudaskError:
    """The error a LocalGPUCluster raises: no chain, a plugin's refusal of a setting as the
    setting's own line, naming the keyword given when the line does not already."""
    if isinstance(error, PluginError) and isinstance(error.__cause__, ConfigError):
        error = error.__cause__
    text = str(error)
    given = next((arg for key, arg in given_as.items() if key in text and arg not in text), None)
    if isinstance(error, PluginError):
        return PluginError(error.plugin, error.distribution, error.hook, error.cause if given is None else
                           f"{given}: {error.cause}")
    return type(error)(text if given is None else f"{given}: {text}")


def _is_nanny(cls: Any) -> bool:
    if isinstance(cls, str):
        from dask.utils import import_term

        cls = import_term(cls)
    return isinstance(cls, type) and issubclass(cls, Nanny)


class LocalGPUCluster(LocalCluster):
    """A ``LocalCluster`` with one stock worker per GPU and gpudask preloaded everywhere: the
    counterpart of dask-cuda's ``LocalCUDACluster`` (``scale(n)`` adds workers with the lowest
    free names and worker numbers).

    Parameters are those of :func:`cluster_kwargs`, and dask-cuda's ``LocalCUDACluster``
    arguments: each becomes the gpudask setting its plugin declares (the migration guide's
    table); ``pre_import`` is added to ``preload``; one without an equivalent is refused.
    """

    def __init__(self, n_workers: int | None = None, protocol: str | None = None,
                 threads_per_worker: int | None = None, **kwargs: Any):
        settings, given_as = dask_cuda.take_arguments(kwargs)
        pre_import = kwargs.pop("pre_import", None)
        if pre_import:
            items = pre_import.split(",") if isinstance(pre_import, str) else list(pre_import)
            kwargs["preload"] = _merged_preload(kwargs.get("preload")) + [i.strip() for i in items if i.strip()]
        if settings:
            # this process's plan and every worker see them; the user's config stays as it was.
            # A Nanny's config is nested: dask's dotted-key setter writes into a fresh dict
            nested: dict[str, Any] = {}
            dask.config.set(settings, config=nested)
            kwargs["config"] = dask.config.merge(nested, kwargs.get("config") or {})
        from gpudask.config import forget_source, label_source

        for key, value in settings.items():  # reasons and errors name the keyword, not "dask config"
            label_source(key, value, f"LocalGPUCluster({given_as[key]})")
        try:
            with dask.config.set(settings):
                self._gpudask_init(n_workers, protocol, threads_per_worker, kwargs)
        except GpudaskError as e:
            raise _one_line(e, given_as) from None
        finally:
            for key in settings:
                forget_source(key)
        from gpudask.apply import process

        session = process.current()
        if session is not None and given_as:
            # dask-cuda's GPU keywords on a host without a GPU: say so, as enable_cudf_spill does
            for line in dask_cuda.without_effect(session.host, given_as):
                logging.getLogger("distributed.gpudask").warning("gpudask: %s", line)

    def _gpudask_init(self, n_workers: int | None, protocol: str | None, threads_per_worker: int | None,
                      kwargs: dict[str, Any]) -> None:
        kw = cluster_kwargs(n_workers, protocol, threads_per_worker, **kwargs)
        n = kw.pop("n_workers")
        _warn_if_sharing_gpus(n)
        if kw.get("threads_per_worker") is None:
            kw["threads_per_worker"] = max(1, math.ceil(CPU_COUNT / max(n, 1)))
        if n and "memory_limit" not in kw:
            from distributed.worker_memory import parse_memory_limit

            kw["memory_limit"] = parse_memory_limit("auto", 1, n, logger=logging.getLogger("distributed.deploy"))
        # the scheduler's plan, now: a setting it refuses is this call's exception (in the
        # scheduler's dask_setup it would stop this process)
        from gpudask.apply.preload import session_for

        session_for("scheduler")
        # no worker first, then workers with their names (LocalCluster would give all one spec)
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

"""Functions that run on the workers of a benchmarked cluster, sent as :func:`detached` copies
(no module globals) that cloudpickle ships by value: stock workers never import gpudask."""

from __future__ import annotations

from typing import Callable


def make_array(nbytes, backend, seed):
    import importlib

    xp = importlib.import_module(backend)  # numpy or cupy
    x = xp.random.default_rng(seed).random(nbytes // 8)
    if backend == "cupy":
        xp.cuda.get_current_stream().synchronize()
    return x


def consume(x):
    return float(x.sum())


def random_block(block, backend, block_info=None):
    import importlib

    seed = 0
    if block_info is not None:
        seed = hash(tuple(block_info[0]["chunk-location"])) & 0xFFFFFFFF
    return importlib.import_module(backend).random.default_rng(seed).random(block.shape)


def to_float(x):
    return float(x)


async def pull_times(addr, key, reps, backend, dask_worker=None):
    """Seconds of each of ``reps`` pulls of ``key`` from worker ``addr`` into this worker, with
    distributed's own ``get_data_from_worker`` as ``gather_dep`` calls it: no scheduling, no
    task, the transfer and its request/reply only (the device synchronised before the clock
    stops).  The one pull function of ``gpudask bench`` and lab/bench/pull-levers.py: send it with
    :func:`detached` so that stock workers stay stock."""
    import time

    from distributed.worker import get_data_from_worker

    out = []
    for _ in range(reps):
        t = time.perf_counter()
        r = await get_data_from_worker(dask_worker.rpc, [key], addr, who=dask_worker.address)
        if backend == "cupy":
            import cupy

            cupy.cuda.runtime.deviceSynchronize()
        out.append(time.perf_counter() - t)
        if r.get("status") != "OK" or key not in r.get("data", {}):
            raise RuntimeError(f"pull of {key} from {addr}: {r.get('status')}")
        del r
    return out


def incoming(key, dask_worker=None):
    """This worker's transfer_incoming_log entries that brought ``key``."""
    return [{"duration": float(entry["duration"]), "total": int(entry["total"]),
             "bandwidth": float(entry["bandwidth"]), "who": str(entry.get("who"))}
            for entry in list(dask_worker.transfer_incoming_log) if key in (entry.get("keys") or {})]


def worker_info(dask_worker=None):
    """What this worker process uses: UCX config and transports, GPU, gpudask."""
    import os
    import sys

    import dask

    cfg = dask.config.get("distributed-ucxx", default=None) or {}
    info = {"pid": os.getpid(), "gpudask_loaded": "gpudask" in sys.modules,
            "env": {k: v for k, v in sorted(os.environ.items())
                    if k.startswith("UCX_") or k in ("CUDA_VISIBLE_DEVICES", "RAPIDS_NO_INITIALIZE")},
            "distributed_ucxx": {k: v for k, v in cfg.items() if k != "version"} or None}
    ucxx = getattr(sys.modules.get("distributed_ucxx.ucxx"), "ucxx", None)
    if ucxx is not None:
        for key, read in (("ucx_tls", lambda: ucxx.get_config().get("TLS")),
                          ("active_transports", lambda: sorted(ucxx.get_active_transports()))):
            try:
                info[key] = read()
            except Exception as e:
                info[key] = f"error: {e}"
    try:
        from distributed.diagnostics.nvml import has_cuda_context

        ctx = has_cuda_context()
        info["cuda_context"] = bool(ctx.has_context)
        if ctx.has_context and ctx.device_info is not None:
            info["cuda_device"] = str(ctx.device_info.uuid)
    except Exception:
        info["cuda_context"] = None
    rmm = sys.modules.get("rmm")
    if rmm is not None and info.get("cuda_context"):
        try:
            info["rmm_resource"] = type(rmm.mr.get_current_device_resource()).__name__
        except Exception:
            pass
    return info


def getpid():
    import os

    return os.getpid()


def detached(f: Callable) -> Callable:
    """A copy of ``f`` that belongs to no importable module, so distributed/cloudpickle
    ship its code by value and the receiving worker never imports ``gpudask``."""
    import builtins
    import types

    g = types.FunctionType(f.__code__, {"__name__": "__main__", "__builtins__": builtins}, f.__name__,
                           f.__defaults__, f.__closure__)
    g.__kwdefaults__ = f.__kwdefaults__
    g.__qualname__ = f"_bench{f.__name__}"
    return g


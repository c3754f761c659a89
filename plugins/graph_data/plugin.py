"""gpu-graph-data: GPU objects in task graphs never materialise on the scheduler (:mod:`.deferral`,
``gpudask_server_setup``), and a gpudask client scatters large ones worker-direct before sending a
graph (:mod:`.lifting`, ``gpudask_client_setup``); a scheduler that sees no GPU also tells gpudask
clients (metadata ``["gpudask", "graph-data"]``) to gather and scatter ``direct=True``."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import (Option, format_bytes, hookimpl, parse_bool, parse_bytes, parse_name_list, plugin_state,
                               wrap_direct_default, wrap_graph_submission, wrap_handler, wrap_pickle_family_loads)

from . import deferral, lifting

if TYPE_CHECKING:
    from collections.abc import Iterator

    from distributed import Nanny, Scheduler, Worker

    from gpudask.pluginapi import PlanContext, ProcessPlan

name = "gpu-graph-data"
priority = 190  # before scheduler-parity, whose relay reads what this one decided

ENABLED = "gpudask.gpu-graph-data.enabled"
THRESHOLD = "gpudask.gpu-graph-data.scatter-threshold"
MODULES = "gpudask.gpu-graph-data.deferred-modules"
METADATA_KEYS = ["gpudask", "graph-data"]

logger = logging.getLogger("distributed.gpudask")


def parse_size(value: Any) -> int:
    """A size in bytes: ``"1MiB"``, ``"4MB"``, ``1048576``; 0 lifts every GPU object."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError("a size such as '1MiB' or 1048576")
    try:
        n = parse_bytes(value) if isinstance(value, str) else int(value)
    except (ValueError, TypeError, OverflowError):
        raise ValueError("a size such as '1MiB' or 1048576") from None
    if not 0 <= n <= 2**62:
        raise ValueError("a size such as '1MiB' or 1048576, between 0 and 4 EiB")
    return n


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [
        Option(ENABLED, True, "Keep GPU objects in task graphs host bytes on the scheduler (made on the worker that "
               "runs the task) and scatter large ones worker-direct from gpudask clients.", parse_bool,
               "true or false"),
        Option(THRESHOLD, "1MiB", "GPU objects at least this large in a gpudask client's graphs are scattered "
               "straight to a worker (GPU to GPU) before the graph is sent; smaller ones stay in the graph.",
               parse_size, "a size such as '1MiB', '64MB' or 1048576"),
        Option(MODULES, [], "More modules whose objects live in GPU memory (beyond cupy, cupyx, cudf, rmm, "
               "numba.cuda and distributed's serializers of them): their objects in a graph are not made on the "
               "scheduler.", parse_name_list, "a list of module names"),
    ]


@dataclass
class State:
    """What this plugin keeps for this process (``plugin_state``)."""

    deferred: tuple[str, ...] = deferral.DEFAULT_DEFERRED_MODULES  # what this process's graph reads defer
    client: tuple[int, tuple[str, ...]] | None = None  # (threshold, modules) once a client plan is set up
    direct: weakref.WeakKeyDictionary[Any, bool] = field(default_factory=weakref.WeakKeyDictionary)  # by client
    counter: Iterator[int] = field(default_factory=lambda: itertools.count(1))  # lifted arguments' key suffix


def _state() -> State:
    return plugin_state(name, State)


def deferred_modules(ctx: PlanContext) -> tuple[str, ...]:
    return deferral.DEFAULT_DEFERRED_MODULES + tuple(ctx.value(MODULES) or ())


@hookimpl
def gpudask_plan_process(ctx: PlanContext, plan: ProcessPlan) -> None:
    if plan.role not in ("scheduler", "client"):
        return
    if not ctx.value(ENABLED):
        plan.note("GPU objects in graphs: as distributed does", f"{ENABLED}=false: the scheduler unpickles them "
                  "(it needs the GPU packages and a GPU for graphs that carry any)")
        return
    if plan.role == "scheduler":
        gpu = "" if ctx.gpus else "; this scheduler sees no GPU, so gpudask clients gather and scatter worker-direct"
        plan.note("GPU objects in graphs stay host bytes here",
                  "objects of GPU modules (cupy, cudf, rmm, ...) are made by the worker that runs the task: no GPU, "
                  "cupy or CUDA context needed here" + gpu)
    else:
        threshold = ctx.value(THRESHOLD)
        plan.note(f"GPU objects >= {format_bytes(threshold)} in graphs scattered worker-direct",
                  f"{THRESHOLD}={threshold}: such submit/map/delayed arguments and da.from_array data go GPU to GPU "
                  "to a worker; smaller ones stay in the graph (not from asynchronous clients)")


# -- the scheduler --------------------------------------------------------------------------
def _reading_graph(original: Any) -> Any:
    """The scheduler's ``update-graph`` handler, run with graphs read deferring GPU globals (it
    deserialises the graph before its first await, in this task's context)."""

    async def update_graph(**kwargs: Any) -> Any:
        token = deferral.READING_GRAPH.set(True)
        try:
            result = original(**kwargs)
            return (await result) if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future) else result
        finally:
            deferral.READING_GRAPH.reset(token)

    return update_graph


@hookimpl
def gpudask_server_setup(ctx: PlanContext, plan: ProcessPlan, server: Scheduler | Worker | Nanny) -> None:
    if plan.role != "scheduler" or not ctx.value(ENABLED):
        return
    _state().deferred = deferred_modules(ctx)
    wrap_pickle_family_loads(lambda original: deferral.deferring_pickle_loads(original, lambda: _state().deferred))
    wrap_handler(server, "update-graph", _reading_graph, name, stream=True)
    scheduler: Any = server  # the role says so; distributed is not annotated
    scheduler.set_metadata(keys=METADATA_KEYS, value={"direct": not ctx.gpus})


# -- the client -----------------------------------------------------------------------------
def _rewrite(client: Any, expr: Any) -> tuple[Any, Any]:
    """A client's graph with its large GPU objects scattered worker-direct (and the futures)."""
    state = _state()
    if state.client is None or _on_event_loop() or getattr(client, "asynchronous", False):
        return expr, None
    try:
        scatter = functools.partial(client.scatter, direct=True, hash=False)
        return lifting.lift(expr, scatter, *state.client, f"gpudask-arg-{client.id}-{next(state.counter)}")
    except Exception as e:  # noqa: BLE001 - the graph goes as it is, the user's call is not broken
        logger.warning("gpudask: large GPU objects stay in this graph (%s: %s)", type(e).__name__, e)
        return expr, None


def _on_event_loop() -> bool:
    """Is this thread running an event loop (an asynchronous client: it cannot wait here)?"""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _direct(client: Any) -> bool:
    """Does ``client``'s scheduler ask for worker-direct gathers and scatters (it has no GPU)?"""
    cache = _state().direct
    known = cache.get(client)
    if known is None:
        try:
            meta = await client.scheduler.get_metadata(keys=METADATA_KEYS, default=None)
        except Exception:  # noqa: BLE001 - a scheduler without gpudask: distributed's default
            meta = None
        known = bool(isinstance(meta, dict) and meta.get("direct") is True)
        cache[client] = known
    return known


@hookimpl
def gpudask_client_setup(ctx: PlanContext, plan: ProcessPlan) -> None:
    if not ctx.value(ENABLED):
        return
    _state().client = (ctx.value(THRESHOLD), deferred_modules(ctx))
    wrap_graph_submission(_rewrite)
    wrap_direct_default(_direct)

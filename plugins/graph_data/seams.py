"""Where gpu-graph-data meets distributed: every name it relies on, in one module.

distributed offers no client-side hook between "a graph is built" and "it is pickled for the
scheduler", nor a per-client default for ``direct=`` beyond ``direct_to_workers``, so two
private methods of ``distributed.Client`` are wrapped (once per process, chaining whatever
is there): ``_graph_to_futures(expr, keys, span_metadata, ...)``, which every ``submit``,
``map``, ``compute``, ``persist`` and ``get`` goes through, and ``_gather`` /
``_scatter``'s ``direct`` argument.  On the scheduler, only public names: the ``pickle``
serialization family (``register_serialization_family``), ``Scheduler.stream_handlers``
and ``Scheduler.set_metadata``.  ``tests/test_graph_data.py`` holds each of these to what is
relied on here (the contract tests), so a distributed release that changes one fails there.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

WRAPPED = "__gpudask_graph_data__"

# rewrite(client, expr) -> (expr to send, objects to keep alive until it is sent)
Rewrite = Callable[[Any, Any], "tuple[Any, Any]"]
# decide(client) -> should a gather/scatter with direct=None go straight to the workers?
DirectDefault = Callable[[Any], Awaitable[bool]]


def on_event_loop() -> bool:
    """Is this thread running an event loop (an asynchronous client: it cannot wait here)?"""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def wrap_graph_submission(rewrite: Rewrite) -> bool:
    """Have every client of this process pass its graphs through ``rewrite`` before sending."""
    from distributed import Client

    original: Any = Client._graph_to_futures  # distributed is not annotated
    if getattr(original, WRAPPED, False):
        return False

    @functools.wraps(original)
    def _graph_to_futures(self: Any, expr: Any, keys: Any, *args: Any, **kwargs: Any) -> Any:
        expr, keep = rewrite(self, expr)
        try:
            return original(self, expr, keys, *args, **kwargs)
        finally:
            del keep  # after the graph is queued: the scheduler sees it before any release

    setattr(_graph_to_futures, WRAPPED, True)
    setattr(Client, "_graph_to_futures", _graph_to_futures)  # noqa: B010 - distributed's private method, wrapped
    return True


def wrap_direct_default(decide: DirectDefault) -> bool:
    """``gather``/``scatter`` with ``direct=None`` (and no ``direct_to_workers``): ask ``decide``."""
    from distributed import Client

    gather: Any = Client._gather  # distributed is not annotated
    scatter: Any = Client._scatter
    if getattr(gather, WRAPPED, False):
        return False

    @functools.wraps(gather)
    async def _gather(self: Any, futures: Any, errors: str = "raise", direct: Any = None,
                      local_worker: Any = None) -> Any:
        if direct is None and self.direct_to_workers is None and not local_worker:
            direct = await decide(self) or None
        return await gather(self, futures, errors=errors, direct=direct, local_worker=local_worker)

    @functools.wraps(scatter)
    async def _scatter(self: Any, data: Any, workers: Any = None, broadcast: bool = False, direct: Any = None,
                       **kwargs: Any) -> Any:
        if direct is None and self.direct_to_workers is None:
            direct = await decide(self) or None
        return await scatter(self, data, workers=workers, broadcast=broadcast, direct=direct, **kwargs)

    setattr(_gather, WRAPPED, True)
    setattr(_scatter, WRAPPED, True)
    setattr(Client, "_gather", _gather)  # noqa: B010 - distributed's private methods, wrapped
    setattr(Client, "_scatter", _scatter)  # noqa: B010
    return True


async def scheduler_metadata(client: Any, keys: list[str]) -> Any:
    """What the scheduler holds under ``keys`` (``Scheduler.set_metadata``), None if nothing."""
    return await client.scheduler.get_metadata(keys=keys, default=None)


# -- the scheduler -----------------------------------------------------------------------------
def wrap_pickle_family(make_loads: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace the ``pickle`` serialization family's loader with ``make_loads(distributed's)``."""
    from distributed.protocol.serialize import families, register_serialization_family

    dumps, loads, _ = families["pickle"]
    if getattr(loads, "gpudask_deferring", False):
        return False
    register: Any = register_serialization_family  # distributed is not annotated
    register("pickle", dumps, make_loads(loads))
    return True


def wrap_stream_handler(scheduler: Any, op: str, around: Callable[[], Any]) -> bool:
    """Run the scheduler's ``op`` stream handler inside ``around()`` (a context manager)."""
    original = scheduler.stream_handlers.get(op)
    if original is None or getattr(original, WRAPPED, False):
        return False

    async def handler(**kwargs: Any) -> Any:
        with around():
            result = original(**kwargs)
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
            return result

    setattr(handler, WRAPPED, True)
    handler.__name__ = getattr(original, "__name__", op)
    scheduler.stream_handlers[op] = handler
    return True

"""Where gpudask reaches into distributed beyond its public API: every such reach, in one place.

Each function names the private thing it relies on and why no public API does; each is held
by a contract test against the installed distributed (tests/test_compat_contract.py), and
pyproject.toml bounds distributed to the versions those tests ran on.  docs/architecture.md
("What gpudask patches") lists them for users.

Nothing here is imported by ``import gpudask``; distributed is imported where a function needs it.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, cast


# -- the preload, before a server exists ----------------------------------------------------
def preload_argv_being_validated() -> Any:
    """The ``--preload-argv`` values distributed's ``validate_preload_argv`` (a click callback
    of ``dask scheduler`` / ``dask worker``) is validating while it imports the preloads:
    its local ``value``.  No API hands them to a preload imported there."""
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code.co_name == "validate_preload_argv" and "value" in frame.f_locals:
            return frame.f_locals["value"]
        frame = frame.f_back
    return None


def worker_init_locals() -> dict[str, Any]:
    """The arguments of the ``Worker.__init__`` importing the preload, if any (``preload_argv``,
    ``nanny``, ``host``, ``interface``, ``self``): which scheduler and nanny this worker
    belongs to, before the worker has parsed them."""
    frame = inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__init__" and "preload_argv" in code.co_varnames and "nanny" in code.co_varnames:
            return dict(frame.f_locals)
        frame = frame.f_back
    return {}


def set_worker_interface(worker: Any, interface: str) -> None:
    """Make a ``Worker`` under construction listen on ``interface``: ``Worker._interface``,
    read by ``Worker.start_unsafe`` at ``listen()`` (``Worker.__init__`` takes it only as an
    argument, already parsed when the preload runs)."""
    worker._interface = interface


def imported_by_distributed_preload(depth: int = 2) -> bool:
    """Is the caller's import run by distributed's preload machinery (``distributed/preloading.py``:
    ``--preload``, ``--preload-nanny``, ``distributed.*.preload``), i.e. before ``listen()``?"""
    suffix = os.path.join("distributed", "preloading.py")
    frame: Any = sys._getframe(depth)
    while frame is not None:
        if frame.f_code.co_filename.endswith(suffix):
            return True
        frame = frame.f_back
    return False


def worker_instances() -> list[Any]:
    """The ``Worker`` objects of this process (``Worker._instances``, a WeakSet), or [] when
    distributed's worker module is not imported."""
    module = sys.modules.get("distributed.worker")
    return [] if module is None else list(module.Worker._instances)


# -- a client's coroutines, inside gpudask's own event loop ----------------------------------
# (the public methods block on the client's loop, which the probe runs on)
def client_run(client: Any, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Coroutine[Any, Any, Any]:
    """``Client._run``: the coroutine behind ``client.run``."""
    return cast(Coroutine[Any, Any, Any], client._run(function, *args, **kwargs))


def client_run_on_scheduler(client: Any, function: Callable[..., Any], *args: Any) -> Coroutine[Any, Any, Any]:
    """``Client._run_on_scheduler``: the coroutine behind ``client.run_on_scheduler``."""
    return cast(Coroutine[Any, Any, Any], client._run_on_scheduler(function, *args))


def futures_done(futures: list[Any]) -> Coroutine[Any, Any, Any]:
    """``distributed.client._wait``: the coroutine behind ``distributed.wait``, which waits for
    the tasks only (their data stays on the workers)."""
    from distributed.client import _wait

    return _wait(futures)


def client_gather(client: Any, futures: list[Any], direct: bool) -> Coroutine[Any, Any, Any]:
    """``Client._gather``: the coroutine behind ``client.gather``."""
    return cast(Coroutine[Any, Any, Any], client._gather(futures, direct=direct))


# -- a scheduler's handlers ---------------------------------------------------------------
MARK = "__gpudask_relay__"  # set on a wrapper: which guard installed it


def wrap_handler(server: Any, name: str, make: Callable[[Any], Any], owner: Any, stream: bool = False) -> Any:
    """Replace the server's RPC handler ``name`` (``server.handlers``; ``stream``:
    ``server.stream_handlers``, the batched-stream ones) by ``make(original)``, marked as
    ``owner``'s.  distributed has no API to wrap a built-in handler (``gather``,
    ``subscribe-topic``, ``update-graph``).  Returns the original, or None when the server
    has no such handler or ``owner`` already wrapped it."""
    table = server.stream_handlers if stream else server.handlers
    original = table.get(name)
    if original is None or getattr(original, MARK, None) is owner:
        return None
    wrapper = make(original)
    setattr(wrapper, MARK, owner)
    table[name] = wrapper
    return original


def unwrap_handler(server: Any, name: str, original: Any, owner: Any, stream: bool = False) -> None:
    """Put ``original`` back, if the handler in place is still ``owner``'s wrapper."""
    table = server.stream_handlers if stream else server.handlers
    if original is not None and getattr(table.get(name), MARK, None) is owner:
        table[name] = original


def wrap_report(scheduler: Any, make: Callable[[Any], Any], owner: Any) -> Any:
    """Replace ``Scheduler.report`` of this scheduler instance (what sends a client its
    ``task-erred`` messages) by ``make(original)``; returns the original."""
    original = scheduler.report
    wrapper = make(original)
    setattr(wrapper, MARK, owner)
    scheduler.report = wrapper
    return original


def unwrap_report(scheduler: Any, original: Any, owner: Any) -> None:
    if original is not None and getattr(scheduler.report, MARK, None) is owner:
        scheduler.report = original


# -- a client's graphs, gathers and scatters (gpu-graph-data) ---------------------------------
# distributed has no client-side hook between "a graph is built" and "it is pickled for the
# scheduler", nor a per-client default for ``direct=`` beyond ``direct_to_workers``: three private
# methods of ``Client`` are wrapped, once per process, chaining whatever is there.
CLIENT_MARK = "__gpudask_graph_data__"


def wrap_graph_submission(rewrite: Callable[[Any, Any], tuple[Any, Any]]) -> bool:
    """Every client of this process passes its graph through ``rewrite(client, expr) -> (expr,
    keep)`` before ``Client._graph_to_futures`` (what ``submit``, ``map``, ``compute``,
    ``persist`` and ``get`` go through) sends it; ``keep`` lives until the graph is queued.
    False when already wrapped."""
    from distributed import Client

    original: Any = Client._graph_to_futures  # distributed is not annotated
    if getattr(original, CLIENT_MARK, False):
        return False

    def _graph_to_futures(self: Any, expr: Any, keys: Any, *args: Any, **kwargs: Any) -> Any:
        expr, keep = rewrite(self, expr)
        try:
            return original(self, expr, keys, *args, **kwargs)
        finally:
            del keep  # after the graph is queued: the scheduler sees it before any release

    setattr(_graph_to_futures, CLIENT_MARK, True)
    setattr(Client, "_graph_to_futures", _graph_to_futures)  # noqa: B010
    return True


def wrap_direct_default(decide: Callable[[Any], Coroutine[Any, Any, bool]]) -> bool:
    """``Client._gather`` / ``Client._scatter`` with ``direct=None`` (and no
    ``direct_to_workers``) go worker-direct when ``await decide(client)`` says so."""
    from distributed import Client

    gather: Any = Client._gather  # distributed is not annotated
    scatter: Any = Client._scatter
    if getattr(gather, CLIENT_MARK, False):
        return False

    async def _gather(self: Any, futures: Any, errors: str = "raise", direct: Any = None,
                      local_worker: Any = None) -> Any:
        if direct is None and self.direct_to_workers is None and not local_worker:
            direct = await decide(self) or None
        return await gather(self, futures, errors=errors, direct=direct, local_worker=local_worker)

    async def _scatter(self: Any, data: Any, workers: Any = None, broadcast: bool = False, direct: Any = None,
                       **kwargs: Any) -> Any:
        if direct is None and self.direct_to_workers is None:
            direct = await decide(self) or None
        return await scatter(self, data, workers=workers, broadcast=broadcast, direct=direct, **kwargs)

    setattr(_gather, CLIENT_MARK, True)
    setattr(_scatter, CLIENT_MARK, True)
    setattr(Client, "_gather", _gather)  # noqa: B010
    setattr(Client, "_scatter", _scatter)  # noqa: B010
    return True


def wrap_pickle_family_loads(make_loads: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace the ``pickle`` serialization family's loader of this process by
    ``make_loads(distributed's pickle_loads)`` (``register_serialization_family`` is public; the
    ``families`` table it fills is read for the original).  False when already replaced."""
    from distributed.protocol.serialize import families, register_serialization_family

    dumps, loads, _ = families["pickle"]
    if getattr(loads, CLIENT_MARK, False):
        return False
    new = make_loads(loads)
    setattr(new, CLIENT_MARK, True)
    register: Any = register_serialization_family  # distributed is not annotated
    register("pickle", dumps, new)
    return True


# -- task names ------------------------------------------------------------------------
# the keys of a P2P rechunk's transfer tasks: f"rechunk-transfer-{token}", made by
# distributed.shuffle._rechunk (no public name says a task belongs to a P2P rechunk)
P2P_RECHUNK_TRANSFER_PREFIX = "rechunk-transfer-"


# -- the comms' offload threshold ------------------------------------------------------------
def offload_threshold() -> Any:
    """``distributed.comm.utils.OFFLOAD_THRESHOLD`` in this process: read once by distributed,
    when the module is imported, from ``distributed.comm.offload`` (None when not imported)."""
    return getattr(sys.modules.get("distributed.comm.utils"), "OFFLOAD_THRESHOLD", None)


def set_offload_threshold(value: Any) -> None:
    """Make ``value`` the threshold the comms read at each message (``to_frames`` /
    ``from_frames``): a worker forked from the fork server read the config before its plan."""
    import distributed.comm.utils as comm_utils

    comm_utils.OFFLOAD_THRESHOLD = value


def add_worker_metric(worker: Any, name: str, metric: Callable[[Any], Any], replace: bool = False) -> bool:
    """Add ``metric`` to ``worker.metrics`` as ``name`` (one of that name already there stays,
    unless ``replace``); False when the server has no metrics (a nanny).  The dict is replaced,
    not changed: a heartbeat iterating over it awaits metrics on the way, and a WorkerPlugin adds
    its metric meanwhile (before: "dictionary changed size during iteration", the worker closed)."""
    metrics = getattr(worker, "metrics", None)
    if not isinstance(metrics, dict):
        return False
    if replace or name not in metrics:
        worker.metrics = {**metrics, name: metric}
    return True

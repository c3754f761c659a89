"""A scheduler that cannot relay GPU data tells the clients at once (part of scheduler-parity;
docs/scheduler-check.md, A scheduler without a GPU).  Failures other than those below keep
distributed's behaviour."""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from time import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from gpudask.pluginapi import unwrap_handler, unwrap_report, wrap_handler, wrap_report

logger = logging.getLogger("distributed.gpudask.check")

NAME = "gpudask-relay"
# a task result of one of these packages lives in GPU memory (ts.type is "module.Class")
GPU_TYPE_ROOTS = ("cupy", "cupyx", "cudf", "dask_cudf", "rmm", "cuml", "cugraph", "cuspatial", "pylibcudf")
GPU_TYPE_PARTS = ("numba.cuda", "devicendarray")


def gpu_type(typename: str | None) -> bool:
    """Does a task's result type (``TaskState.type``) name a GPU object?"""
    if not typename:
        return False
    name = typename.lower()
    return name.split(".", 1)[0] in GPU_TYPE_ROOTS or any(p in name for p in GPU_TYPE_PARTS)


WHAT = ("it relays the GPU results clients gather as host bytes (workers copy them to the host first) and it cannot "
        "receive GPU data scattered through it")
ADVICE = ("Scatter GPU data with client.scatter(data, direct=True), or call gpudask.initialize() before creating the "
          "Client: gathers and scatters then go worker-direct, and large GPU arguments too; or start the scheduler "
          "with a GPU visible")
DOCS = "(docs: scheduler-check, A scheduler without a GPU)"
GRAPHS = ("task graphs are unpickled on the scheduler, and gpudask reads the objects of GPU modules in them without "
          "making them (gpudask.gpu-graph-data); this one's module is not among them: add it to "
          "gpudask.gpu-graph-data.deferred-modules, or start the scheduler with a GPU visible")


def message(cause: str, protocol: str, gpu_workers: list[str], event: str = "", graph: bool = False) -> str:
    """The one line: what failed (``event``, empty for the warning), cause, then what to do."""
    shown = ", ".join(gpu_workers[:3]) + (f" and {len(gpu_workers) - 3} more" if len(gpu_workers) > 3 else "")
    workers = f", the workers have GPUs ({shown})" if gpu_workers else ""
    what = GRAPHS if graph else f"{WHAT}. {ADVICE}"
    return f"gpudask: {event + ': ' if event else ''}{cause}{workers} and the protocol is {protocol}: {what} {DOCS}"


def one_line(e: BaseException | None, limit: int = 200) -> str:
    """``Type: text`` of an exception on one line, cut at ``limit`` characters."""
    if e is None:
        return "cause unknown"
    text = " ".join(str(e).split())
    out = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return out if len(out) <= limit else out[:limit - 3] + "..."


# the serializer families a worker sends host frames with (no "cuda": no GPU memory on the way)
HOST_SERIALIZERS = ["dask", "pickle", "error"]

# distributed's RuntimeError when a graph does not deserialise on the scheduler (update_graph)
GRAPH_ERROR = "Error during deserialization of the task graph"


@dataclass
class _Call:
    """One update-graph call in flight (a context variable: the stream of one client, no other)."""

    client: str
    keys: set[Any]
    seen: dict[int, Any] = field(default_factory=dict)  # id(distributed's Serialize) -> our error_message, or None


_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("gpudask_relay_update_graph", default=None)


class RelayGuard(SchedulerPlugin):
    """Warn clients of a scheduler that cannot relay GPU frames, and stop the gather retry loop.

    Each client is warned once through distributed's ``"warn"`` event, once it subscribes to that
    topic (``add_client`` runs before its stream exists); a failed gather of a GPU result answers
    with a builtin ``RuntimeError`` instead of distributed's endless retry.  ``has_gpus(extra)``:
    does that worker have a GPU.  ``graphs``: also rewrite what ``update-graph`` reports for a graph
    that cannot be deserialised here (within the client's own call, by a context variable)."""

    name = NAME
    idempotent = True

    def __init__(self, cause: str, protocol: str, has_gpus: Callable[[Any], bool], graphs: bool = False):
        self.cause = cause
        self.protocol = protocol
        self.has_gpus = has_gpus
        self.graphs = graphs
        self.scheduler: Any = None
        self._gather: Any = None  # the originals of what start() wraps
        self._subscribe: Any = None
        self._update_graph: Any = None
        self._report: Any = None
        self.gpu_workers: dict[str, None] = {}
        self.listening: set[str] = set()  # clients subscribed to "warn"
        self.warned: set[str] = set()
        self.unreadable: set[str] = set()  # clients that sent a graph this scheduler could not read

    # -- life cycle --------------------------------------------------------------------
    async def start(self, scheduler: Any) -> None:
        if self.scheduler is not None:
            return  # started once (at scheduler start, or by gpudask's SchedulerPlugin on a running one)
        self.scheduler = scheduler
        # distributed has no API to wrap a built-in handler: gpudask.compat.distributed does it
        self._gather = wrap_handler(scheduler, "gather", self._wrap, self)
        self._subscribe = wrap_handler(scheduler, "subscribe-topic", self._wrap_subscribe, self, stream=True)
        if self.graphs:
            self._update_graph = wrap_handler(scheduler, "update-graph", self._wrap_update_graph, self, stream=True)
            if self._update_graph is not None:
                # this instance's only; rewrites only inside update-graph
                self._report = wrap_report(scheduler, self._wrap_report, self)
        # clients already connected (gpudask registered on a running scheduler) listen to "warn"
        self.listening.update(scheduler.clients)
        for address, ws in list(scheduler.workers.items()):
            self._see_worker(address, ws)
        logger.info("gpudask check: %s over %s: clients are warned when GPU workers are connected, and a failed "
                    "gather of GPU results raises at once", self.cause, self.protocol)

    async def close(self) -> None:
        if self.scheduler is None:
            return
        unwrap_handler(self.scheduler, "gather", self._gather, self)
        unwrap_handler(self.scheduler, "subscribe-topic", self._subscribe, self, stream=True)
        unwrap_handler(self.scheduler, "update-graph", self._update_graph, self, stream=True)
        unwrap_report(self.scheduler, self._report, self)

    # -- workers and clients -----------------------------------------------------------
    def _see_worker(self, address: str, ws: Any) -> bool:
        try:
            gpu = bool(self.has_gpus(getattr(ws, "extra", None)))
        except Exception:  # noqa: BLE001 - malformed published data: the check reports it
            gpu = False
        if gpu:
            self.gpu_workers[address] = None
        return gpu

    def add_worker(self, scheduler: Any, worker: str) -> None:
        ws = scheduler.workers.get(worker)
        if ws is None or not self._see_worker(worker, ws):
            return
        for client in list(self.listening):
            self._warn_later(client)

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self.gpu_workers.pop(worker, None)

    def remove_client(self, scheduler: Any, client: str) -> None:
        self.warned.discard(client)
        self.unreadable.discard(client)
        self.listening.discard(client)

    def _wrap_subscribe(self, original: Any) -> Any:

        def subscribe_topic(**kwargs: Any) -> Any:
            result = original(**kwargs)
            # the client's stream is up; "warn" means it shows warnings
            client = kwargs.get("client")
            if kwargs.get("topic") == "warn" and isinstance(client, str):
                self.listening.add(client)
                if self.gpu_workers:
                    self._warn_later(client)
            return result

        return subscribe_topic

    def _warn_later(self, client: str) -> None:
        if client in self.warned or client == "fire-and-forget":
            return
        self.warned.add(client)
        self.scheduler.loop.add_callback(self._warn, client)

    def _warn(self, client: str) -> None:
        from distributed.protocol import pickle

        comm = self.scheduler.client_comms.get(client)
        if comm is None:
            self.warned.discard(client)
            return
        line = message(self.cause, self.protocol, list(self.gpu_workers))
        event = {"message": pickle.dumps(line), "category": pickle.dumps(UserWarning)}  # type: ignore[no-untyped-call]
        # the message distributed's Broker sends for topic "warn"; plain clients warn with it
        comm.send({"op": "event", "topic": "warn", "event": (time(), event)})
        logger.warning("%s (told client %s)", line, client)

    # -- gather ------------------------------------------------------------------------
    def gpu_keys(self, keys: Any) -> list[Any]:
        """Of ``keys``, those whose result is a GPU object held by a GPU worker."""
        tasks = self.scheduler.tasks
        return [key for key in keys if (ts := tasks.get(key)) is not None and gpu_type(getattr(ts, "type", None))
                and any(ws.address in self.gpu_workers for ws in (ts.who_has or ()))]

    def _wrap(self, original: Any) -> Any:

        async def gather(keys: Any, serializers: Any = None) -> Any:
            relayed = self.gpu_keys(keys)  # before: a failure may change who holds them
            # workers send GPU results as host frames (their "dask" serializers): this scheduler
            # cannot receive GPU frames, and only relays the bytes (it never deserialises them)
            result = await original(keys=keys, serializers=HOST_SERIALIZERS if serializers is None else serializers)
            if not (isinstance(result, dict) and result.get("status") == "error" and relayed):
                return result
            failed = [k for k in result.get("keys") or () if k in set(relayed)]
            if not failed:
                return result
            from distributed.core import error_message

            line = message(self.cause, self.protocol, list(self.gpu_workers),
                           "gathering GPU results through this scheduler failed")
            logger.error("%s (gather of %d key(s) failed, e.g. %r)", line, len(failed), failed[0])
            # a builtin exception: a client without gpudask unpickles it and raises it, once
            return error_message(RuntimeError(line), status="uncaught-error")
        return gather

    # -- update-graph ------------------------------------------------------------------
    def _wrap_update_graph(self, original: Any) -> Any:
        """distributed's handler runs as it is; only what it reports while it runs is looked at."""

        async def update_graph(**kwargs: Any) -> Any:
            call = _Call(str(kwargs.get("client", "")), set(kwargs.get("keys") or ()))  # client: a str in distributed
            token = _CALL.set(call)
            try:
                result = original(**kwargs)
                return (await result) if inspect.isawaitable(result) else result
            finally:
                _CALL.reset(token)
        return update_graph

    def _wrap_report(self, original: Any) -> Any:

        def report(msg: Any, ts: Any = None, client: Any = None) -> Any:
            call = _CALL.get()
            if call is not None and isinstance(msg, dict):
                msg = self.rewrite(call, msg)
            return original(msg, ts=ts, client=client)

        return report

    def rewrite(self, call: _Call, msg: dict[str, Any]) -> dict[str, Any]:
        """A message update-graph reports, with gpudask's line where the graph could not be read here."""
        op = msg.get("op")
        if op == "task-erred" and msg.get("key") in call.keys:
            ours = self._graph_error(call, msg.get("exception"))
            return msg if ours is None else {**msg, "exception": ours["exception"], "traceback": ours["traceback"]}
        if (op == "cancelled-keys" and msg.get("reason") == "lost dependencies" and not msg.get("msg")
                and call.client in self.unreadable):
            line = message(self.cause, self.protocol, list(self.gpu_workers),
                           "an earlier graph of this client could not be read on this scheduler, so its futures "
                           "erred and graphs built on them lose their dependencies")
            return {**msg, "msg": line}
        return msg

    def _graph_error(self, call: _Call, exception: Any) -> Any:
        """Our error message for distributed's "Error during deserialization of the task graph", else None
        (decided once per call: every key of the graph carries the same exception)."""
        if id(exception) in call.seen:
            return call.seen[id(exception)]
        call.seen[id(exception)] = None
        if not self.gpu_workers:
            return None
        data = getattr(exception, "data", None)  # distributed's Serialize of the pickled exception
        if not isinstance(data, bytes):
            return None
        from distributed.core import error_message
        from distributed.protocol import pickle

        try:
            error = pickle.loads(data)  # type: ignore[no-untyped-call]  # error_message() checked it loads here
        except Exception:  # noqa: BLE001 - not ours to explain
            return None
        if not (isinstance(error, RuntimeError) and GRAPH_ERROR in str(error)):
            return None  # the graph was read; it failed later: distributed's own error
        cause = error.__cause__ or error.__context__
        line = message(self.cause, self.protocol, list(self.gpu_workers),
                       f"this scheduler could not read a task graph ({one_line(cause)})", graph=True)
        self.unreadable.add(call.client)
        logger.error("%s (graph of client %s, %d key(s))", line, call.client, len(call.keys))
        ours = error_message(RuntimeError(line))  # a builtin exception: any client unpickles it
        call.seen[id(exception)] = ours
        return ours

"""A scheduler that cannot relay GPU data tells the clients at once (part of scheduler-parity).

With distributed's default ``distributed.client.direct-to-workers: null`` every result a
client gathers passes through the scheduler, and over UCX distributed-ucxx receives each
GPU frame into an ``rmm.DeviceBuffer``.  A scheduler that sees no GPU (started with
``CUDA_VISIBLE_DEVICES=""`` or on a CPU host) cannot: the client's gather fails, the
client reschedules and asks again, and a plain client loops on ``Couldn't gather keys``
until its own timeout.  On such a scheduler only (UCX, no GPU visible, workers with GPUs)
:class:`RelayGuard`:

* sends every client one warning through distributed's own ``"warn"`` event (a plain
  client turns it into a Python ``UserWarning``; it needs no gpudask): as it connects
  while GPU workers are there, or when the first GPU worker joins while it is connected.
  "As it connects" is when the client subscribes to the ``warn`` topic, which every
  distributed client does right after its stream starts: ``SchedulerPlugin.add_client``
  runs before the client's stream exists, and the client's first read must be its
  ``stream-start`` message alone;
* wraps the scheduler's ``gather`` handler: a failed gather of a key whose result is a
  GPU object (its task's ``type``: CuPy, cuDF, RMM, Numba CUDA ...) held by a worker with a
  GPU answers with a plain ``RuntimeError`` (builtin: any client unpickles it) carrying the
  one line -- the client raises at once instead of retrying forever.  Other failed
  gathers (a NumPy result whose worker died) keep distributed's behaviour.

Imports only distributed and the plugin API; installed by the scheduler-parity plugin's
``gpudask_preload`` hook.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

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


def message(cause: str, protocol: str, gpu_workers: list[str]) -> str:
    """The one line: cause, then the fix, then what keeps working."""
    shown = ", ".join(gpu_workers[:3]) + (f" and {len(gpu_workers) - 3} more" if len(gpu_workers) > 3 else "")
    return (f"gpudask: {cause}, the workers have GPUs ({shown}) and the protocol is {protocol}: GPU results "
            f"(CuPy, cuDF) cannot pass through this scheduler, so gathering them through it fails. Fix: start "
            f"the scheduler on a GPU host / with a GPU visible, or gather direct from the workers: "
            f"Client(..., direct_to_workers=True) or client.gather(futures, direct=True). NumPy/pandas data "
            f"and results gathered direct keep working (docs: scheduler-check, A scheduler without a GPU)")


class RelayGuard(SchedulerPlugin):
    """Warn clients of a scheduler that cannot relay GPU frames, and stop the gather retry loop.

    :param cause: why this scheduler cannot relay ("this scheduler sees no GPU").
    :param protocol: the scheduler's protocol (ucx).
    :param has_gpus: ``f(WorkerState.extra) -> bool``: does that worker have a GPU (its
        published gpudask facts).
    """

    name = NAME
    idempotent = True

    def __init__(self, cause: str, protocol: str, has_gpus: Callable[[Any], bool]):
        self.cause = cause
        self.protocol = protocol
        self.has_gpus = has_gpus
        self.scheduler: Any = None
        self.gpu_workers: dict[str, None] = {}
        self.listening: set[str] = set()  # clients subscribed to "warn"
        self.warned: set[str] = set()
        self._gather: Any = None
        self._subscribe: Any = None

    # -- life cycle --------------------------------------------------------------------
    async def start(self, scheduler: Any) -> None:
        if self.scheduler is not None:
            return  # started once (at scheduler start, or by gpudask's SchedulerPlugin on a running one)
        self.scheduler = scheduler
        original = scheduler.handlers.get("gather")
        if original is not None and getattr(original, "__gpudask_relay__", None) is not self:
            self._gather = original
            scheduler.handlers["gather"] = self._wrap(original)
        subscribe = scheduler.stream_handlers.get("subscribe-topic")
        if subscribe is not None and getattr(subscribe, "__gpudask_relay__", None) is not self:
            self._subscribe = subscribe
            scheduler.stream_handlers["subscribe-topic"] = self._wrap_subscribe(subscribe)
        # clients already connected (gpudask registered on a running scheduler) listen to "warn"
        self.listening.update(scheduler.clients)
        for address, ws in list(scheduler.workers.items()):
            self._see_worker(address, ws)
        logger.info("gpudask check: %s over %s: clients are warned when GPU workers are connected, and a failed "
                    "gather of GPU results raises at once", self.cause, self.protocol)

    async def close(self) -> None:
        if self.scheduler is not None and self._gather is not None:
            current = self.scheduler.handlers.get("gather")
            if getattr(current, "__gpudask_relay__", None) is self:
                self.scheduler.handlers["gather"] = self._gather
        if self.scheduler is not None and self._subscribe is not None:
            current = self.scheduler.stream_handlers.get("subscribe-topic")
            if getattr(current, "__gpudask_relay__", None) is self:
                self.scheduler.stream_handlers["subscribe-topic"] = self._subscribe

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
        self.listening.discard(client)

    def subscribed(self, topic: Any, client: Any) -> None:
        """A client subscribed to a topic: its stream is up; "warn" means it shows warnings."""
        if topic != "warn" or not isinstance(client, str):
            return
        self.listening.add(client)
        if self.gpu_workers:
            self._warn_later(client)

    def _wrap_subscribe(self, original: Any) -> Any:
        guard = self

        def subscribe_topic(**kwargs: Any) -> Any:
            result = original(**kwargs)
            guard.subscribed(kwargs.get("topic"), kwargs.get("client"))
            return result

        subscribe_topic.__gpudask_relay__ = guard  # type: ignore[attr-defined]
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
        event = {"message": pickle.dumps(line), "category": pickle.dumps(UserWarning)}
        # the message distributed's Broker sends for topic "warn"; plain clients warn with it
        comm.send({"op": "event", "topic": "warn", "event": (time(), event)})
        logger.warning("%s (told client %s)", line, client)

    # -- gather ------------------------------------------------------------------------
    def gpu_keys(self, keys: Any) -> list[Any]:
        """Of ``keys``, those whose result is a GPU object held by a GPU worker."""
        tasks = self.scheduler.tasks
        out = []
        for key in keys:
            ts = tasks.get(key)
            if ts is None or not gpu_type(getattr(ts, "type", None)):
                continue
            if any(ws.address in self.gpu_workers for ws in (ts.who_has or ())):
                out.append(key)
        return out

    def _wrap(self, original: Any) -> Any:
        guard = self

        async def gather(keys: Any, serializers: Any = None) -> Any:
            relayed = guard.gpu_keys(keys)  # before: a failure may change who holds them
            result = await original(keys=keys, serializers=serializers)
            if not (isinstance(result, dict) and result.get("status") == "error" and relayed):
                return result
            failed = [k for k in result.get("keys") or () if k in set(relayed)]
            if not failed:
                return result
            from distributed.core import error_message

            line = message(guard.cause, guard.protocol, list(guard.gpu_workers))
            logger.error("%s (gather of %d key(s) failed, e.g. %r)", line, len(failed), failed[0])
            # a builtin exception: a client without gpudask unpickles it and raises it, once
            return error_message(RuntimeError(line), status="uncaught-error")

        gather.__gpudask_relay__ = guard  # type: ignore[attr-defined]
        gather.__name__ = "gather"
        return gather

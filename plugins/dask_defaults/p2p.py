"""A client that rechunks with P2P while GPU workers are connected is told once (part of gpu-dask-defaults).

P2P rechunk fails on CuPy-backed arrays, and a client without gpudask keeps it: on the scheduler,
:class:`P2PRechunkWarning` warns it through distributed's ``"warn"`` event; the graph runs as it is."""

from __future__ import annotations

import logging
from time import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from gpudask.pluginapi import P2P_RECHUNK_TRANSFER_PREFIX, facts_from_dict

logger = logging.getLogger("distributed.gpudask.dask-defaults")

NAME = "gpudask-p2p-rechunk"
TRANSFER_PREFIX = P2P_RECHUNK_TRANSFER_PREFIX  # the P2P rechunk's transfer tasks


def worker_has_gpus(extra: Any) -> bool:
    """Does the worker's published gpudask facts (``WorkerState.extra["gpudask"]``) show a GPU it can see?"""
    published = extra.get("gpudask") if isinstance(extra, dict) else None
    facts = published.get("facts") if isinstance(published, dict) else None
    if not isinstance(facts, dict):
        return False
    try:
        return bool(facts_from_dict(facts, "probed").visible_gpus())
    except Exception:  # noqa: BLE001 - malformed published facts: the scheduler check reports them
        return False


def p2p_rechunk(tasks: Any) -> bool:
    """Does a graph (its task keys) hold P2P rechunk transfers?"""
    names = (key[0] if isinstance(key, tuple) and key else key for key in tasks or ())
    return any(isinstance(name, str) and name.startswith(TRANSFER_PREFIX) for name in names)


def message(gpu_workers: list[str]) -> str:
    shown = ", ".join(gpu_workers[:3]) + (f" and {len(gpu_workers) - 3} more" if len(gpu_workers) > 3 else "")
    return ("gpudask: this client rechunks with P2P (dask's choice for large rechunks with a distributed client) "
            f"and the workers have GPUs ({shown}): P2P rechunk fails on CuPy-backed arrays (distributed reads "
            "shards through memoryview: \"P2P ... failed during barrier phase\"). Fix, in the client: "
            "dask.config.set({\"array.rechunk.method\": \"tasks\"}) (or DASK_ARRAY__RECHUNK__METHOD=tasks), or "
            "import gpudask / call gpudask.initialize() there. NumPy-backed arrays rechunk fine with P2P")


class P2PRechunkWarning(SchedulerPlugin):
    """Warn a client, once, whose graph rechunks with P2P while GPU workers are connected."""

    name = NAME
    idempotent = True

    def __init__(self) -> None:
        self.scheduler: Any = None
        self.gpu_workers: dict[str, None] = {}
        self.warned: set[str] = set()

    async def start(self, scheduler: Any) -> None:
        if self.scheduler is not None:
            return
        self.scheduler = scheduler
        for address in list(scheduler.workers):
            self.add_worker(scheduler, address)

    def add_worker(self, scheduler: Any, worker: str) -> None:
        ws = scheduler.workers.get(worker)
        if ws is not None and worker_has_gpus(getattr(ws, "extra", None)):
            self.gpu_workers[worker] = None

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self.gpu_workers.pop(worker, None)

    def remove_client(self, scheduler: Any, client: str) -> None:
        self.warned.discard(client)

    def update_graph(self, scheduler: Any, *, client: str, keys: Any, tasks: Any, **kwargs: Any) -> None:
        if not self.gpu_workers or client in self.warned or client == "fire-and-forget" or not p2p_rechunk(tasks):
            return
        comm = scheduler.client_comms.get(client)
        if comm is None:
            return  # a worker_client's graph, or a client gone: nobody to tell
        from distributed.protocol import pickle

        self.warned.add(client)
        line = message(list(self.gpu_workers))
        event = {"message": pickle.dumps(line), "category": pickle.dumps(UserWarning)}  # type: ignore[no-untyped-call]
        # the message distributed's Broker sends for topic "warn"; plain clients warn with it
        comm.send({"op": "event", "topic": "warn", "event": (time(), event)})
        logger.warning("%s (told client %s)", line, client)

"""What a worker publishes, read by the scheduler from the worker itself (:data:`HANDLER`, added
by :class:`~gpudask.apply.server_plugins.WorkerPlugin`): a caller of ``gpudask_publish`` can make
the scheduler read a worker's own state again, never put words into it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger("distributed.gpudask")

HANDLER = "gpudask_published"  # worker handler added by WorkerPlugin: what it publishes
READ_S = 10.0  # seconds the scheduler waits for the workers' own answers


async def one_worker(scheduler: Any, address: str) -> str | None:
    """Put what the worker at ``address`` publishes into its ``WorkerState.extra``; None,
    or why not."""
    ws = scheduler.workers.get(address)
    if ws is None:
        return "unknown worker"
    try:
        published = await asyncio.wait_for(scheduler.rpc(address).gpudask_published(), READ_S)
    except Exception as e:  # noqa: BLE001 - a worker without the handler, gone, or slow
        return f"not read from the worker: {type(e).__name__}: {e}"[:300]
    if scheduler.workers.get(address) is not ws:
        return "unknown worker"
    ws.extra["gpudask"] = published
    return None


async def all_workers(scheduler: Any) -> None:
    """:func:`one_worker` for each connected worker that published nothing yet (together, at
    most READ_S seconds)."""
    pending = [one_worker(scheduler, a) for a, ws in list(scheduler.workers.items()) if "gpudask" not in ws.extra]
    if pending:
        try:
            await asyncio.wait_for(asyncio.gather(*pending), READ_S)
        except asyncio.TimeoutError:
            logger.warning("gpudask: some workers did not say within %g s what they publish", READ_S)

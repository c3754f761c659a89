"""Importing, ahead of time, what a process is about to import (``gpudask_preimport``): a GPU
worker's start is mostly imports (docs/process-start.md).  The ``dask worker`` process waiting
for the scheduler's file imports them in a thread, a fork server once for all its workers.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from collections.abc import Iterable

logger = logging.getLogger("distributed.gpudask")


def import_all(modules: Iterable[str]) -> list[str]:
    """Import each module; the ones that failed (a debug line each): the process that needs
    one imports it later, and gets its error there, as it would have."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001 - a module failing ahead of time must not end this process
            failed.append(name)
            logger.debug("gpudask: importing %s ahead of time failed (%s: %s)", name, type(e).__name__, e)
    return failed


def in_background(modules: list[str]) -> threading.Thread | None:
    """Import ``modules`` in a daemon thread (None when there is nothing to import)."""
    todo = [m for m in modules if m not in sys.modules]
    if not todo:
        return None
    thread = threading.Thread(target=import_all, args=(todo,), name="gpudask-preimport", daemon=True)
    thread.start()
    return thread


def found_imported(modules: Iterable[str]) -> list[str]:
    """Which of ``modules`` this process has imported already (a forked worker: its server's)."""
    return [m for m in modules if m in sys.modules]

"""Serving ``/gpudask/json`` without costing the scheduler's event loop: only a shallow
:func:`~gpudask.dashboard.page.snapshot` is taken on the loop; the build runs in a thread, the
plugins' ``gpudask_report_rows`` waited for at most :data:`ROWS_LIMIT_S` (past it the page names
the plugin still running, and no new call starts until it ends).  Readers share one build, served
again for :data:`CACHE_S`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from gpudask.checks.jobs import plugin_in_thread
from gpudask.plaindata import exception_text

ROWS_LIMIT_S = 2.0  # seconds the plugins' report rows of one build may take
BUILD_LIMIT_S = 20.0  # seconds a reader waits for a build before it gets a one-line error
CACHE_S = 1.0  # a page built this recently is served as it is
MAX_JSON_BYTES = 4 * 1024 * 1024  # the page's JSON; workers past it are counted, not shown
ROWS_HOOK = "gpudask_report_rows"


class _Rows:
    """The thread running the plugins' report rows; at most one at a time."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.since = 0.0
        self.functions: dict[str, Callable[..., Any]] = {}

    def stuck(self) -> str | None:
        thread = self.thread
        if thread is None or not thread.is_alive():
            return None
        return plugin_in_thread(thread.ident, self.functions) or "?"

    def run(self, manager: Any, work: list[tuple[str, dict[str, Any], dict[str, Any]]]
            ) -> tuple[dict[str, Any] | None, str | None]:
        """``({address: (rows, problems)}, None)``, or ``(None, why)`` past the limit."""
        plugin = self.stuck()
        if plugin is not None:
            return None, (f"plugin {plugin}'s report rows left out: still in {ROWS_HOOK} after "
                          f"{time.monotonic() - self.since:.0f} s (a call the scheduler cannot stop)")
        out: dict[str, Any] = {}
        self.functions = manager.hook_functions(ROWS_HOOK)

        def rows() -> None:
            for address, plan, published in work:
                try:
                    out[address] = manager.report_rows(plan, published)
                except BaseException as e:  # noqa: BLE001 -- report_rows isolates each plugin; never the thread's end
                    out[address] = ([], [f"the plugins' report rows could not be made: {exception_text(e)}"])

        self.since = time.monotonic()
        self.thread = threading.Thread(target=rows, name="gpudask-report-rows", daemon=True)
        self.thread.start()
        self.thread.join(ROWS_LIMIT_S)
        plugin = self.stuck()
        if plugin is not None:
            return None, (f"plugin {plugin}'s report rows left out: {ROWS_HOOK} did not finish within "
                          f"{ROWS_LIMIT_S:g} s")
        self.thread = None
        return out, None


ROWS = _Rows()


class Builder:
    """One build at a time per process; readers share it and its result for CACHE_S."""

    def __init__(self) -> None:
        self.future: asyncio.Future[bytes] | None = None
        self.body: bytes | None = None
        self.built_at = 0.0
        self.scheduler: Any = None

    async def get(self, scheduler: Any, snapshot: Callable[[Any], dict[str, Any]],
                  build: Callable[[dict[str, Any]], bytes]) -> bytes:
        """``build(snapshot(scheduler))``: the snapshot on the event loop, the build off it."""
        if self.body is not None and self.scheduler is scheduler and time.monotonic() - self.built_at < CACHE_S:
            return self.body
        if self.future is None or self.scheduler is not scheduler:
            self.scheduler = scheduler
            self.future = asyncio.ensure_future(asyncio.to_thread(_built, build, snapshot(scheduler)))
        future = self.future
        try:
            body = await asyncio.wait_for(asyncio.shield(future), BUILD_LIMIT_S)
        except asyncio.TimeoutError:
            return _problem(f"the page's data was not built within {BUILD_LIMIT_S:g} s")
        if self.future is future:
            self.future, self.body, self.built_at = None, body, time.monotonic()
        return body


def _built(build: Callable[[dict[str, Any]], bytes], snap: dict[str, Any]) -> bytes:
    try:
        return build(snap)
    except BaseException as e:  # noqa: BLE001 -- SystemExit too: the reader gets one line
        # made text here, in the thread: raised on the event loop, a plugin's SystemExit ended the scheduler
        return _problem(f"the page's data could not be built: {exception_text(e)}")


def _problem(text: str) -> bytes:
    return json.dumps({"problem": text, "workers": [], "problems": [text]}).encode()


BUILDER = Builder()

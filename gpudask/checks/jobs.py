"""The scheduler check's jobs: each worker's check runs in one of a few daemon threads
(:data:`POOL`), never on the scheduler's event loop; a slow one is reported."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import queue
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from gpudask.errors import GpudaskError
from gpudask.findings import Finding
from gpudask.plugin.hookcall import plugin_in_call

TIMEOUT_KEY = "gpudask.scheduler-check.timeout"
DEFAULT_TIMEOUT_S = 5.0
THREADS = 4
IDLE_S = 0.05  # seconds an idle check thread waits for the next check before it ends (distributed's
# thread-leak check waits for threads of a closed scheduler: a short idle leaves it nothing to wait for)
HOOK = "gpudask_scheduler_check"


class Threads:
    """Daemon threads: unlike concurrent.futures' pool, a plugin that never returns does not keep
    the scheduler from exiting (no join at exit)."""

    def __init__(self, size: int):
        self.size = size
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.idle = 0
        self.lock = threading.Lock()

    def submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.queue.put((future, fn, args))
        with self.lock:
            if self.idle == 0 and len(self.threads) < self.size:
                thread = threading.Thread(target=self._run, name=f"gpudask-check-{next(_THREAD_IDS)}", daemon=True)
                self.threads.append(thread)
                thread.start()
        return future

    def _run(self) -> None:
        while True:
            with self.lock:
                self.idle += 1
            try:  # an idle thread ends (IDLE_S); the next check starts one again
                future, fn, args = self.queue.get(timeout=IDLE_S)
            except queue.Empty:
                with self.lock:
                    self.idle -= 1
                    if not self.queue.empty():  # a check came in meanwhile: submit saw this thread idle
                        continue
                    self.threads.remove(threading.current_thread())
                return
            with self.lock:
                self.idle -= 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits for it
                future.set_exception(e)


_THREAD_IDS = itertools.count()
POOL = Threads(THREADS)


@dataclasses.dataclass(eq=False)
class Job:
    """One worker's check, running in a thread."""

    address: str
    ws: Any
    submitted: float = dataclasses.field(default_factory=time.monotonic)
    thread: int | None = None  # the thread running it, once started
    future: concurrent.futures.Future[tuple[list[Finding], dict[str, Any] | None]] | None = None
    # set once a first result (or the timeout finding) is recorded
    recorded: threading.Event = dataclasses.field(default_factory=threading.Event)
    slow_plugin: str | None = None  # the plugin a timeout finding named


def read_timeout(ctx: Any) -> float:
    settings: Any = getattr(ctx, "settings", None)
    try:
        return float(settings[TIMEOUT_KEY])
    except (KeyError, TypeError, ValueError, GpudaskError):
        return DEFAULT_TIMEOUT_S


def plugin_in_thread(thread: int | None, functions: Mapping[str, Any]) -> str | None:
    """The plugin (of ``functions``: name -> hook function) whose hook ``thread`` is in."""
    frame = sys._current_frames().get(thread) if thread is not None else None
    codes = {getattr(getattr(f, "__func__", f), "__code__", None): name for name, f in functions.items()}
    top = frame
    while frame is not None:
        if frame.f_code in codes:
            return codes[frame.f_code]
        frame = frame.f_back
    # past the hook's own function: the copy of its result, still in the plugin's isolated call
    return plugin_in_call(top)


def timeout_finding(job: Job, timeout: float, manager: Any) -> Finding:
    plugin = plugin_in_thread(job.thread, manager.hook_functions(HOOK) if manager is not None else {})
    if plugin is not None:
        what = f"plugin {plugin!r}'s {HOOK}"
    elif job.thread is None:
        what = f"the check (queued: all {THREADS} check threads are busy with slow checks)"
    else:
        what = "the check"
    return Finding("warning", "check-timeout",
                   f"{what} did not finish within {timeout:g} s ({TIMEOUT_KEY}): the worker was registered "
                   "without waiting; the check goes on in a thread and its findings replace this one when it ends",
                   plugin=plugin or "gpudask", subject=job.address, reference="scheduler",
                   details={"timeout": timeout, "hook": HOOK})


def slow_finding(job: Job, timeout: float) -> Finding:
    took = time.monotonic() - job.submitted
    plugin = job.slow_plugin
    return Finding("warning", "slow-check",
                   f"the check of this worker took {took:.1f} s, more than {TIMEOUT_KEY} ({timeout:g} s)"
                   + (f", in plugin {plugin!r}'s {HOOK}" if plugin else "")
                   + "; it ran in a thread, so the scheduler did not wait for it",
                   plugin=plugin or "gpudask", subject=job.address, reference="scheduler",
                   details={"seconds": round(took, 3), "timeout": timeout, "hook": HOOK})

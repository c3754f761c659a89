"""Calling one plugin's hook implementation, isolated: the one place that decides what a
plugin's call can do to the process calling it.

:func:`call_isolated` turns whatever the call raises (``SystemExit`` too; ``KeyboardInterrupt``
on the main thread is the user's Ctrl-C) into a :class:`~gpudask.errors.PluginError` naming the
plugin and the hook, so ``sys.exit()`` in a plugin never ends a server or a command.  On the main
thread the call is bounded: ``SIGALRM`` after ``gpudask.plugins.hook-timeout`` seconds, and
``SIGTERM`` / ``SIGINT`` (after the handler that was there, e.g. distributed's), interrupt it, so a
process stuck in a plugin still stops when told to (C code that never returns to the interpreter
aside).  Off the main thread, callers bound the wait (the check's threads, the dashboard's).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpudask.errors import GpudaskError, PluginError
from gpudask.plaindata import exception_text

TIMEOUT_KEY = "gpudask.plugins.hook-timeout"
DEFAULT_TIMEOUT_S = 60.0
_RETRY_S = 0.005  # a stop the interpreter dropped is raised again this soon


class PluginStopped(PluginError):
    """The call was stopped by ``SIGTERM`` / ``SIGINT``: never kept as one plugin's result."""


class _Interrupted(BaseException):
    """Raised inside a plugin's hook by gpudask's own signal handlers."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


_ACTIVE = threading.local()  # .depth: nested calls on the main thread arm the bound once


def hook_timeout() -> float:
    """``gpudask.plugins.hook-timeout`` in seconds (a bad value: the default; Settings reports it)."""
    import dask.config
    from dask.utils import parse_timedelta

    try:
        seconds = float(parse_timedelta(dask.config.get(TIMEOUT_KEY, DEFAULT_TIMEOUT_S), default="seconds"))
    except Exception:  # noqa: BLE001 -- validated, with its one line, by Settings
        return DEFAULT_TIMEOUT_S
    return seconds if 0 < seconds < 1e9 else DEFAULT_TIMEOUT_S  # NaN too: the default


def call_isolated(plugin: str, distribution: str | None, hook: str, function: Callable[..., Any],
                  args: Sequence[Any]) -> Any:
    """``function(*args)``; any failure is a PluginError (``KeyboardInterrupt`` on the main
    thread aside; a thread never receives one, so there it is the plugin's)."""
    main = threading.current_thread() is threading.main_thread()
    bound = _Bound() if main else None
    start = time.monotonic()
    try:
        if bound is not None:
            bound.arm()
        result = function(*args)
        if bound is not None and bound.pending is not None:
            raise _Interrupted(bound.pending)  # it arrived where it could not be raised
        return result
    except KeyboardInterrupt:
        if main:
            raise
        raise PluginError(plugin, distribution, hook, "KeyboardInterrupt: a plugin may not end the process") from None
    except _Interrupted as e:
        kind = PluginStopped if e.why.startswith("stopped") else PluginError
        raise kind(plugin, distribution, hook, f"{e.why} after {time.monotonic() - start:.1f} s; the call "
                          "was interrupted") from None
    except BaseException as e:  # noqa: BLE001 -- SystemExit too: a plugin never ends the process
        # gpudask's own errors keep their chain (callers read __cause__); a plugin's exception
        # travels as its text only: nothing formats it again later, on an event loop
        raise PluginError(plugin, distribution, hook, exception_text(e)) from (e if _ours(e) else None)
    finally:
        if bound is not None:
            bound.disarm()


def _ours(error: BaseException) -> bool:
    """One of gpudask's own errors (a plugin's subclass of one is the plugin's)."""
    try:
        return isinstance(error, GpudaskError) and type(error).__dict__.get("__module__", "").startswith("gpudask.")
    except BaseException:  # noqa: BLE001 -- an odd type is not ours
        return False


def plugin_in_call(frame: Any) -> str | None:
    """The plugin whose isolated call ``frame`` (another thread's, from
    ``sys._current_frames()``) is inside -- its hook or the plain copy of its result -- or None."""
    code = call_isolated.__code__
    while frame is not None:
        if frame.f_code is code:
            plugin = frame.f_locals.get("plugin")
            return plugin if type(plugin) is str else None
        frame = frame.f_back
    return None


class _Bound:
    """The time bound and the stop signals of one call on the main thread."""

    def __init__(self) -> None:
        self.saved: dict[int, Any] = {}  # signal -> the handler that was there
        self.alarm = False
        self.limit = 0.0
        self.pending: str | None = None
        self.saved_unraisablehook: Callable[[Any], Any] | None = None

    def arm(self) -> None:
        depth = getattr(_ACTIVE, "depth", 0)
        _ACTIVE.depth = depth + 1
        if depth:
            return  # a hook calling hooks: the outer call's bound holds
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            if previous in (signal.SIG_IGN, None):
                continue
            self.saved[sig] = previous
            signal.signal(sig, self._stop)
        # an exception raised where the interpreter drops it (a gc callback, a finaliser, a weakref
        # callback) goes to sys.unraisablehook: a stop or the time limit dropped there is kept
        # (pending) and raised again, not printed
        self.saved_unraisablehook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        if hasattr(signal, "setitimer") and signal.getsignal(signal.SIGALRM) == signal.SIG_DFL \
                and signal.getitimer(signal.ITIMER_REAL)[0] == 0:
            self.limit = hook_timeout()
            self.saved[signal.SIGALRM] = signal.SIG_DFL
            signal.signal(signal.SIGALRM, self._alarm)
            signal.setitimer(signal.ITIMER_REAL, self.limit)
            self.alarm = True

    def disarm(self) -> None:
        _ACTIVE.depth = getattr(_ACTIVE, "depth", 1) - 1
        if self.alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if self.saved_unraisablehook is not None:
            sys.unraisablehook = self.saved_unraisablehook
        for sig, previous in self.saved.items():
            signal.signal(sig, previous)

    def _unraisable(self, unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, _Interrupted):
            # raised again later: when the alarm is ours, in a few milliseconds; else when the call returns
            self.pending = unraisable.exc_value.why
            if self.alarm:
                signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
        elif self.saved_unraisablehook is not None:
            self.saved_unraisablehook(unraisable)

    def _alarm(self, signum: int, frame: Any) -> None:
        raise _Interrupted(self.pending or f"did not finish within {self.limit:g} s ({TIMEOUT_KEY})")

    def _stop(self, signum: int, frame: Any) -> None:
        previous = self.saved[signum]
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)  # e.g. distributed's: the process closes once the hook is left
        raise _Interrupted(f"stopped by {signal.Signals(signum).name}")

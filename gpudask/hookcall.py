"""Calling one plugin's hook implementation, isolated: the one place that decides what a
plugin's call can do to the process calling it.

:func:`call_isolated` runs ``function(*args)`` and turns whatever it raises -- ``Exception``
and also ``SystemExit``, ``GeneratorExit`` or any other ``BaseException`` but
``KeyboardInterrupt`` -- into a :class:`~gpudask.errors.PluginError` naming the plugin and
the hook, so that ``sys.exit()`` in a plugin never ends a scheduler, a worker or a command.

On the main thread (where ``dask scheduler`` / ``dask worker`` run their event loop and
every command plans), the call is also bounded in time: after ``gpudask.plugins.hook-timeout``
seconds (default 60) a ``SIGALRM`` interrupts it and it fails with one line; a ``SIGTERM`` or
``SIGINT`` that arrives during the call interrupts it too (after running the handler that
was there, e.g. distributed's), so a process stuck in a plugin still stops when told to.
Python cannot interrupt a call inside C code that does not return to the interpreter; the
bound is what the interpreter can do.  Off the main thread, callers bound the wait instead
(the scheduler check's threads, the dashboard's build thread).

The call mechanism (gpudask calling each implementation itself, or through pluggy's hook
callers) can change; this stays the function every call goes through.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpudask.errors import GpudaskError, PluginError

TIMEOUT_KEY = "gpudask.plugins.hook-timeout"
DEFAULT_TIMEOUT_S = 60.0


class PluginStopped(PluginError):
    """The call was stopped by ``SIGTERM`` / ``SIGINT``: never kept as one plugin's result."""


class _Interrupted(BaseException):
    """Raised inside a plugin's hook by gpudask's own signal handlers."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


_ACTIVE = threading.local()  # .depth: nested calls on the main thread arm the bound once


def hook_timeout() -> float:
    """``gpudask.plugins.hook-timeout`` in seconds (a bad value: the default; the settings
    check reports it in one line)."""
    try:
        import dask.config

        value = dask.config.get(TIMEOUT_KEY, DEFAULT_TIMEOUT_S)
        from dask.utils import parse_timedelta

        seconds = float(parse_timedelta(value, default="seconds"))
    except Exception:  # noqa: BLE001 -- validated, with its one line, by Settings
        return DEFAULT_TIMEOUT_S
    return seconds if 0 < seconds < 1e9 and math.isfinite(seconds) else DEFAULT_TIMEOUT_S


def call_isolated(plugin: str, distribution: str | None, hook: str, function: Callable[..., Any],
                  args: Sequence[Any]) -> Any:
    """``function(*args)``; any failure (``KeyboardInterrupt`` aside) is a PluginError."""
    bound = _Bound(hook) if threading.current_thread() is threading.main_thread() else None
    start = time.monotonic()
    try:
        if bound is not None:
            bound.arm()
        return function(*args)
    except KeyboardInterrupt:
        raise
    except _Interrupted as e:
        kind = PluginStopped if e.why.startswith("stopped") else PluginError
        raise kind(plugin, distribution, hook, f"{e.why} after {time.monotonic() - start:.1f} s; the call "
                          "was interrupted") from None
    except BaseException as e:  # noqa: BLE001 -- SystemExit too: a plugin never ends the process
        # a plugin's own one-line error keeps its text; anything else its type too
        cause: BaseException | str = str(e) if isinstance(e, GpudaskError) else e
        if isinstance(e, SystemExit):
            cause = f"SystemExit({e.code!r}): a plugin may not end the process"
        raise PluginError(plugin, distribution, hook, cause) from e
    finally:
        if bound is not None:
            bound.disarm()


class _Bound:
    """The time bound and the stop signals of one call on the main thread."""

    def __init__(self, hook: str):
        self.hook = hook
        self.saved: dict[int, Any] = {}
        self.alarm = False

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
            signal.signal(sig, _stop_handler(sig, previous))
        if hasattr(signal, "setitimer") and signal.getsignal(signal.SIGALRM) == signal.SIG_DFL \
                and signal.getitimer(signal.ITIMER_REAL)[0] == 0:
            limit = hook_timeout()
            self.saved[signal.SIGALRM] = signal.SIG_DFL
            signal.signal(signal.SIGALRM, _alarm_handler(limit))
            signal.setitimer(signal.ITIMER_REAL, limit)
            self.alarm = True

    def disarm(self) -> None:
        _ACTIVE.depth = getattr(_ACTIVE, "depth", 1) - 1
        if self.alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, previous in self.saved.items():
            signal.signal(sig, previous)


def _alarm_handler(limit: float) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        raise _Interrupted(f"did not finish within {limit:g} s ({TIMEOUT_KEY})")

    return handler


def _stop_handler(sig: int, previous: Any) -> Callable[[int, Any], None]:
    name = signal.Signals(sig).name

    def handler(signum: int, frame: Any) -> None:
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)  # e.g. distributed's: the process closes once the hook is left
        raise _Interrupted(f"stopped by {name}")

    return handler

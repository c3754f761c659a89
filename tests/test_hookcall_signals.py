"""A stop signal or the time limit that arrives while the interpreter runs a garbage-collection
callback (distributed installs one in every server) cannot be raised there -- the interpreter
would print "Exception ignored in" and drop it, and the hook would run on.  These tests send the
signal from inside such a callback, on this (main) thread, and read what the call became."""

from __future__ import annotations

import gc
import signal
import sys
import threading
import time
import weakref

import pytest

from gpudask.plugin.hookcall import PluginStopped, call_isolated

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread()
                                or not hasattr(signal, "setitimer"),
                                reason="signal handlers run on the main thread only")


@pytest.fixture
def dropped(monkeypatch):
    """What the interpreter printed and dropped (``sys.unraisablehook``) during the test."""
    seen: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(f"{u.exc_type.__name__}: {u.exc_value}"))
    return seen


@pytest.fixture
def previous_sigterm():
    """A SIGTERM handler that was there before the hook (distributed's, in a server)."""
    calls: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    yield calls
    signal.signal(signal.SIGTERM, before)


@pytest.fixture
def alarm_free():
    """SIGALRM as a server has it (pytest-timeout's signal method holds it during a test):
    gpudask's time limit arms only where nobody else uses the alarm."""
    handler = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    remaining, _ = signal.setitimer(signal.ITIMER_REAL, 0)
    yield
    signal.signal(signal.SIGALRM, handler)
    if remaining:
        signal.setitimer(signal.ITIMER_REAL, remaining)


def _sigterm_inside_a_gc_callback():
    sent = []

    def callback(phase, info):
        if phase == "start" and not sent:
            sent.append(True)
            signal.raise_signal(signal.SIGTERM)  # its Python handler runs here, in the callback

    gc.callbacks.append(callback)
    return lambda: gc.callbacks.remove(callback)


def test_a_sigterm_inside_a_gc_callback_still_stops_the_hook_and_prints_nothing(dropped, previous_sigterm, alarm_free):
    finished = []

    def hook():
        remove = _sigterm_inside_a_gc_callback()
        try:
            gc.collect()
        finally:
            remove()
        for _ in range(200):  # the stop comes back a few milliseconds later, out of the callback
            time.sleep(0.01)
        finished.append(True)

    with pytest.raises(PluginStopped, match="stopped by SIGTERM"):
        call_isolated("slow", None, "gpudask_server_setup", hook, ())
    assert finished == []
    assert dropped == []
    assert previous_sigterm == [signal.SIGTERM]  # distributed's handler ran, once
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_without_the_alarm_a_stop_kept_from_a_gc_callback_fails_the_call_when_it_returns(dropped, previous_sigterm,
                                                                                         alarm_free):
    # another library owns SIGALRM: gpudask sets no time limit, so it cannot come back early
    signal.signal(signal.SIGALRM, lambda signum, frame: None)

    def hook():
        remove = _sigterm_inside_a_gc_callback()
        try:
            gc.collect()
        finally:
            remove()
        return "configured"

    with pytest.raises(PluginStopped, match="stopped by SIGTERM"):
        call_isolated("slow", None, "gpudask_server_setup", hook, ())
    assert dropped == []
    assert previous_sigterm == [signal.SIGTERM]


class _Referent:
    pass


def test_a_sigterm_inside_a_weakref_callback_is_kept_from_the_interpreter_and_still_stops_the_hook(
        dropped, previous_sigterm, alarm_free):
    """Nothing in the frames tells a weakref callback (or any other place where the interpreter
    drops exceptions) from a plain call: the exception it drops reaches sys.unraisablehook, where
    the call keeps it and raises it again."""
    finished = []

    def hook():
        referent = _Referent()
        ref = weakref.ref(referent, lambda r: signal.raise_signal(signal.SIGTERM))
        del referent  # the callback runs here, and the stop raised in it is dropped by the interpreter
        for _ in range(200):
            time.sleep(0.01)
        finished.append(ref)

    with pytest.raises(PluginStopped, match="stopped by SIGTERM"):
        call_isolated("slow", None, "gpudask_server_setup", hook, ())
    assert finished == [] and dropped == []
    assert previous_sigterm == [signal.SIGTERM]
    assert sys.unraisablehook is not None and signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_a_sigterm_outside_any_callback_stops_the_hook_at_once(dropped, previous_sigterm):
    def hook():
        signal.raise_signal(signal.SIGTERM)
        raise AssertionError("not reached")

    with pytest.raises(PluginStopped, match="stopped by SIGTERM"):
        call_isolated("slow", None, "gpudask_server_setup", hook, ())
    assert dropped == []

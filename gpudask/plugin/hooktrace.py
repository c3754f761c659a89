"""Tracing the plugins' hook calls through pluggy's ``add_hookcall_monitoring``: one line per
plugin and call, ``gpudask trace: <hook> -> <plugin> role=<role> index=<n>: <result> (<ms> ms)``
(docs/troubleshooting.md).  The manager calls each plugin through a hook caller of its own, so
every monitored call is one plugin's.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pluggy

from gpudask.errors import GpudaskError, PluginError
from gpudask.printable import printable

logger = logging.getLogger("distributed.gpudask.trace")

_STARTS = threading.local()  # when each traced call began (calls nest: a stack per thread)


def trace_line(hook: str, plugin: str, plan: Any, result: Any, seconds: float) -> str:
    """One traced call: the hook, the plugin, the process, its result (short) and its duration."""
    where = "" if plan is None else f" role={plan.role}" + ("" if plan.index is None else f" index={plan.index}")
    if isinstance(result, PluginError):
        shown = f"failed: {result}"
    else:
        shown = repr(result).replace("\n", " ")
        shown = shown if len(shown) <= 100 else shown[:99] + "…"
    return f"{hook} -> {plugin}{where}: {shown} ({seconds * 1e3:.1f} ms)"


def before(hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
    """pluggy's ``add_hookcall_monitoring`` before: when the call began."""
    _STARTS.__dict__.setdefault("stack", []).append(time.perf_counter())


def after(outcome: pluggy.Result[Any], hook_name: str, impls: Sequence[pluggy.HookImpl],
          kwargs: Mapping[str, Any]) -> None:
    """pluggy's ``add_hookcall_monitoring`` after: one line per plugin called (one, here)."""
    starts = _STARTS.__dict__.setdefault("stack", [])
    seconds = time.perf_counter() - (starts.pop() if starts else time.perf_counter())
    plan = kwargs.get("plan")
    tracked = plan if plan is not None and not isinstance(plan, Mapping) else None
    error = outcome.exception
    for impl in impls:
        if error is not None:
            cause: BaseException | str = str(error) if isinstance(error, GpudaskError) else error
            result: Any = PluginError(impl.plugin_name, None, hook_name, cause)
        else:
            found = outcome.get_result()
            result = found[0] if found else None
        write(printable(trace_line(hook_name, impl.plugin_name, tracked, result, seconds)))  # one line each


def write(message: str) -> None:
    """Each line of ``message`` to stderr as ``gpudask trace: ...`` (a handler of its own, once)."""
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("gpudask trace: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    for line in message.rstrip("\n").splitlines():
        logger.info(line)

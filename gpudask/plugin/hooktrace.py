"""Tracing the plugins' hook calls through pluggy's ``add_hookcall_monitoring``: one line per
plugin and call, ``gpudask trace: <hook> -> <plugin> role=<role> index=<n>: <result> (<ms> ms)``.
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


def before(hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
    _STARTS.__dict__.setdefault("stack", []).append(time.perf_counter())


def after(outcome: pluggy.Result[Any], hook_name: str, impls: Sequence[pluggy.HookImpl],
          kwargs: Mapping[str, Any]) -> None:
    starts = _STARTS.__dict__.setdefault("stack", [])
    seconds = time.perf_counter() - (starts.pop() if starts else time.perf_counter())
    plan = kwargs.get("plan")  # a ProcessPlan, not a published plan's dict, says which process
    where = "" if plan is None or isinstance(plan, Mapping) else \
        f" role={plan.role}" + ("" if plan.index is None else f" index={plan.index}")
    error = outcome.exception
    for impl in impls:
        if error is not None:
            cause: BaseException | str = str(error) if isinstance(error, GpudaskError) else error
            shown = f"failed: {PluginError(impl.plugin_name, None, hook_name, cause)}"
        else:
            found = outcome.get_result()
            shown = repr(found[0] if found else None).replace("\n", " ")
            shown = shown if len(shown) <= 100 else shown[:99] + "…"
        if not logger.handlers:  # a handler of its own, once: to stderr, whatever logging says
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("gpudask trace: %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
        # printable: a result's text never splits the line
        logger.info(printable(f"{hook_name} -> {impl.plugin_name}{where}: {shown} ({seconds * 1e3:.1f} ms)"))

"""Bounds on what a worker publishes (``WorkerState.extra["gpudask"]``) besides its facts: the
plan, applied state and mismatches are *bounded*, never refused.  Nothing here raises on odd data,
and a bounded value passes through again unchanged: every reader bounds what it reads (a mark
saying "bounded already" could be published by a worker too).
"""

from __future__ import annotations

import math
from typing import Any

from gpudask.findings import _MAX_DEPTH, _MAX_ITEMS, _MAX_STR
from gpudask.plaindata import cut as truncate  # a cut string passes through again unchanged

MAX_STR = _MAX_STR  # characters of one string (the limit facts have)
MAX_DEPTH = _MAX_DEPTH  # nesting (the limit facts have)
MAX_TOTAL = _MAX_ITEMS  # values in one published field (the limit facts have)
MAX_ITEMS = 1000  # items of one list or dict
MAX_MISMATCHES = 50  # mismatches reported one by one; the rest in one finding
MAX_SHOWN = 200  # characters of a value quoted in a log line or a finding's message
BOUNDED_FIELDS = ("plan", "applied", "mismatches", "memory", "plugins")


def bound(value: Any, *, limit_total: int = MAX_TOTAL) -> Any:
    """A JSON-compatible copy of ``value`` within the limits above (never raises)."""
    return _bound(value, 0, [limit_total])


def _bound(value: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return truncate(value, MAX_STR)
    if isinstance(value, (list, tuple, dict)):
        if depth >= MAX_DEPTH:
            return f"<nested deeper than {MAX_DEPTH} levels: left out>"
        if budget[0] < 0:
            return f"<left out: over the {MAX_TOTAL}-value limit>"
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for i, item in enumerate(value):
            if i >= MAX_ITEMS or budget[0] < 0:
                out.append(f"... and {len(value) - i} more items")
                break
            out.append(_bound(item, depth + 1, budget))
        return out
    if isinstance(value, dict):
        result: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i >= MAX_ITEMS or budget[0] < 0:
                result["..."] = f"and {len(value) - i} more keys"
                break
            result[truncate(k if isinstance(k, str) else repr(k), MAX_STR)] = _bound(v, depth + 1, budget)
        return result
    try:
        text = repr(value)
    except Exception as e:  # noqa: BLE001 - a repr that fails is shown as such
        text = f"<{type(value).__name__}: repr failed: {type(e).__name__}>"
    return truncate(text, MAX_STR)


def shown(value: Any) -> str:
    """``repr`` of a published value for a log line or a message, cut to :data:`MAX_SHOWN`."""
    if isinstance(value, str):
        return repr(truncate(value, MAX_SHOWN))
    return truncate(repr(bound(value, limit_total=50)), MAX_SHOWN)


def bound_published(published: Any) -> Any:
    """A worker's ``extra["gpudask"]`` with :data:`BOUNDED_FIELDS` bounded, its facts as they
    are; a non-dict is returned as it is (the check reports it as malformed)."""
    if not isinstance(published, dict):
        return published
    out = dict(published)
    for key in BOUNDED_FIELDS:
        if key in out:
            out[key] = bound(out[key])
    for key in ("version", "role", "protocol", "facts_origin"):
        if key in out and not (out[key] is None or isinstance(out[key], str)):
            out[key] = shown(out[key])
        elif isinstance(out.get(key), str):
            out[key] = truncate(out[key], MAX_SHOWN)
    return out


def mismatches(published: Any) -> tuple[list[dict[str, Any]], int, int]:
    """``(first, more, malformed)``: the first :data:`MAX_MISMATCHES` mismatches (bounded), how many
    more, how many items are not dicts."""
    raw = published.get("mismatches") if isinstance(published, dict) else None
    if not isinstance(raw, (list, tuple)):  # msgpack gives tuples
        return [], 0, 0
    out: list[dict[str, Any]] = []
    more = malformed = 0
    for m in raw:
        if isinstance(m, str) and m.startswith("... and ") and m.endswith(" more items"):
            more += _count(m)  # a list bounded earlier: what it left out
        elif not isinstance(m, dict):
            malformed += 1
        elif len(out) >= MAX_MISMATCHES:
            more += 1
        else:
            out.append({k: bound(m.get(k), limit_total=MAX_ITEMS)
                        for k in ("process", "key", "planned", "actual", "plugin")})
    return out, more, malformed


def _count(marker: str) -> int:
    try:
        return int(marker.split()[2])
    except (IndexError, ValueError):
        return 1

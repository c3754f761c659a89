"""What a plugin may put into a plan or publish, checked in the hook that made it: a value
msgpack cannot carry, JSON has no word for (NaN) or a process cannot take (``=`` in an
environment variable's name) is refused with one line, instead of a worker that never registers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpudask.errors import GpudaskError
from gpudask.plaindata import MAX_DEPTH, MAX_INT

MAX_ENV_BYTES = 128 * 1024  # Linux's limit on one environment string (MAX_ARG_STRLEN)


def value_problem(value: Any, depth: int = 0, finite: bool = True) -> str | None:
    """What makes ``value`` unfit to publish, or None (``finite=False``: NaN and infinities
    pass, for read-back values the page shows as text)."""
    if value is None or isinstance(value, (bool, str)):
        return None
    if isinstance(value, int):
        return None if -MAX_INT - 1 <= value <= MAX_INT else f"an integer out of range ({str(value)[:20]}...)"
    if isinstance(value, float):
        return None if math.isfinite(value) or not finite else f"{value!r}, which is not a JSON number"
    if depth >= MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep"
    if isinstance(value, (list, tuple)):
        for item in value:
            problem = value_problem(item, depth + 1, finite)
            if problem is not None:
                return problem
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"a {type(key).__name__} key {key!r:.40}"
            problem = value_problem(item, depth + 1, finite)
            if problem is not None:
                return f"{problem} under {key!r:.40}"
        return None
    return f"a {type(value).__name__}"


ACCEPTED = ("accepted: None, booleans, strings, integers within +-2**63, finite floats, and lists and dicts "
            "(string keys) of those")


def check_value(value: Any, what: str) -> None:
    """:raises GpudaskError: one line naming ``what`` when ``value`` cannot be published."""
    problem = value_problem(value)
    if problem is not None:
        raise GpudaskError(f"{what}: {problem}; {ACCEPTED}")


def check_env(name: Any, value: Any) -> str:
    """An environment variable a process can take: its value as a string.

    :raises GpudaskError: one line saying what is wrong and what is accepted."""
    if not isinstance(name, str) or not name or "=" in name or "\0" in name:
        raise GpudaskError(f"environment variable name {name!r:.60} refused; accepted: a non-empty string "
                           "without '=' or NUL")
    text = str(value)
    if "\0" in text or len(text.encode("utf-8", "surrogateescape")) + len(name) + 1 > MAX_ENV_BYTES:
        raise GpudaskError(f"value of environment variable {name} refused ({len(text)} characters, NUL "
                           f"{'in' if chr(0) in text else 'not in'} it); accepted: a string without NUL, at most "
                           f"{MAX_ENV_BYTES} bytes")
    return text

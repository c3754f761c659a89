"""What a plugin hands back, as plain data: the one form gpudask touches after the call.

:func:`plain` copies a value into exact ``str``, ``int``, ``float``, ``bool``, ``None``,
``list`` and ``dict`` (string keys), bounded in size and depth, inside the hook call's
isolation (:func:`gpudask.plugin.hookcall.call_isolated`): whatever plugin code the copy runs
(a ``__str__``, a mapping's ``items``) runs there, bounded in time.  A subclass of a plain
type is read through the base type's own methods, so its overrides never run.  ``strict``
refuses what is not plain (:class:`NotPlain`) or over the bounds instead of cutting it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MAX_STR = 64 * 1024  # characters of one string (not strict: cut)
MAX_DEPTH = 32  # nesting
MAX_VALUES = 200_000  # values in one result (not strict: the rest left out, counted)
MAX_STRICT_VALUES = 2_000_000  # values in one result where only plain data is accepted: beyond, refused
MAX_INT = 2**63 - 1  # what msgpack carries; beyond it, without strict, an int is text


class NotPlain(ValueError):
    """A value that is not plain data, where only plain data is accepted (``strict``)."""


def plain(value: Any, *, strict: bool = False) -> Any:
    """An exact-typed, bounded copy of ``value`` (see the module's text).

    :raises NotPlain: with ``strict``, for a value of another type (its type named)."""
    return _plain(value, 0, [MAX_STRICT_VALUES if strict else MAX_VALUES], strict)


def text(value: Any, limit: int = MAX_STR) -> str:
    """``value`` as an exact ``str`` of at most ``limit`` characters (``str(value)`` runs
    plugin code: call it inside the hook's isolation)."""
    return cut(str.__str__(value if isinstance(value, str) else str(value)), limit)


def cut(text: str, limit: int) -> str:
    """``text``, or its start and a marker naming how many characters were cut (at most
    ``limit`` in all: a cut text passes through again unchanged)."""
    if len(text) <= limit:
        return text
    keep = max(limit - 40, 0)
    return f"{text[:keep]}... [{len(text) - keep} more characters]"


def exception_text(error: BaseException) -> str:
    """What a plugin raised, as one exact ``str``: a GpudaskError's own line (the type read
    by name), ``SystemExit(code): ...``, else its type and text.  Whatever reading the text
    raises (plugin code; SystemExit and a time bound's interruption too) leaves the type's name."""
    try:
        if any(getattr(k, "__name__", None) == "GpudaskError" and k.__module__ == "gpudask.errors"
               for k in type(error).__mro__):
            return text(error)
        if isinstance(error, SystemExit):
            return f"SystemExit({text(repr(error.code), 200)}): a plugin may not end the process"
        return f"{type_name(error)}: {text(error)}"
    except BaseException:  # noqa: BLE001 -- a text that raises (even SystemExit) is not read
        try:
            return f"{type_name(error)} (its text could not be read)"
        except BaseException:  # noqa: BLE001
            return "an exception (its text could not be read)"


def type_name(value: Any) -> str:
    """The name of ``value``'s type (a metaclass's own ``__name__`` never runs)."""
    name = type.__dict__["__name__"].__get__(type(value))
    return str.__str__(name) if isinstance(name, str) else "object"


def _plain(value: Any, depth: int, budget: list[int], strict: bool) -> Any:
    budget[0] -= 1
    if value is None or value is True or value is False:
        return value
    if strict and budget[0] < 0:
        raise NotPlain(f"more than {MAX_STRICT_VALUES} values")
    if isinstance(value, str):
        return str.__str__(value) if strict else cut(str.__str__(value), MAX_STR)
    if isinstance(value, int):  # bool is handled above
        number = int.__index__(value)
        if strict or -MAX_INT - 1 <= number <= MAX_INT:
            return number  # strict: the caller's check refuses what msgpack cannot carry
        return f"<an integer of {number.bit_length()} bits>"
    if isinstance(value, float):
        real = float.__float__(value)
        return real if strict or math.isfinite(real) else repr(real)
    container = isinstance(value, (list, tuple, dict)) or isinstance(value, Mapping)
    if not container:
        if strict:
            raise NotPlain(f"a {type_name(value)}")
        return text(value)
    if depth >= MAX_DEPTH:
        if strict:
            raise NotPlain(f"nested more than {MAX_DEPTH} levels deep")
        return f"<nested deeper than {MAX_DEPTH} levels: left out>"
    if isinstance(value, (list, tuple)):
        items = list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value)
        out: list[Any] = []
        for item in items:
            if budget[0] <= 0 and not strict:
                out.append(f"... and more items: over the {MAX_VALUES}-value limit")
                break
            out.append(_plain(item, depth + 1, budget, strict))
        return out
    pairs = dict.items(value) if isinstance(value, dict) else value.items()
    result: dict[str, Any] = {}
    for key, item in pairs:
        if budget[0] <= 0 and not strict:
            result["..."] = f"more keys: over the {MAX_VALUES}-value limit"
            break
        if not isinstance(key, str):
            if strict:
                raise NotPlain(f"a {type_name(key)} key")
            key = text(key, 1000)
        key = str.__str__(key)
        result[key if strict else cut(key, MAX_STR)] = _plain(item, depth + 1, budget, strict)
    return result

"""Findings: what a comparison of two processes (the scheduler check) reports.

A :class:`Finding` travels as JSON (scheduler log, dask events, ``WorkerState.extra``);
:func:`json_safe` reads what another process published: JSON-compatible values only,
bounded, never unpickled.  A base-stage module, so that the plugin manager can turn a
failing check plugin into a finding without importing the checks stage.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from gpudask.printable import printable

SEVERITIES = ("info", "warning", "error")

# Limits on what another process may publish: anything beyond is "malformed", never a crash.
_MAX_DEPTH = 12
_MAX_ITEMS = 20000
_MAX_STR = 4096


class ProcessSide(TypedDict):
    """One side of a scheduler check, as ``gpudask_scheduler_check`` receives it.

    Built by the check runner from what a process published (plain JSON, validated,
    never unpickled): ``facts`` is a valid schema-2 facts dict (``cuda_visible_devices``
    is that process's), the other values are strings or None.
    """

    role: str  # "scheduler", "worker" or "client"
    address: str | None  # the process's address (None for a client)
    facts: dict[str, Any]  # schema 2 (docs/facts.md); read-only: shared by the workers that published the same
    protocol: str | None  # "tcp", "ucx", ... as that process planned
    gpudask: str | None  # the gpudask version there
    facts_origin: str | None  # "probed", or the facts file that described that host
    # UCX_TLS that process runs with (its plan's value; None: unset, UCX may use every transport)
    ucx_tls: str | None
    # what its memory setup reported, by plugin (gpudask_setup_memory results, bounded); None
    # for a process that sets up no memory (scheduler, client) or published none
    memory: dict[str, Any] | None
    # what it left out of UCX because its host is described and this machine lacks it ("no GPU
    # in UCX here", "no InfiniBand in UCX here"); empty for a probed host
    left_out_here: list[str]


@dataclass
class Finding:
    """One result of the scheduler check.

    :param severity: ``"error"`` (this will fail), ``"warning"`` (this may fail, or
        differs where it should not), ``"info"``.
    :param code: a short stable identifier (``"scheduler-no-gpu"``, ``"package-mismatch"``).
    :param message: a plain statement of what differs and its consequence.  Name the
        sides by role ("the scheduler", "the worker", "the client"), not by address:
        the runner records which process was compared in ``subject`` / ``reference``.
    :param plugin: filled by the plugin manager with the plugin's name.
    :param subject: the process compared (a worker address, or ``"client"``).
    :param reference: what it was compared with (``"scheduler"``, or worker addresses).
    :param details: JSON-compatible data (e.g. ``{"package": "cupy", "scheduler": None,
        "worker": "14.2.0"}``).
    """

    severity: str
    code: str
    message: str
    plugin: str | None = None
    subject: str | None = None
    reference: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding severity must be one of {', '.join(SEVERITIES)}, got {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "code": str(self.code), "message": str(self.message),
                "plugin": self.plugin, "subject": self.subject, "reference": self.reference,
                "details": json_copy(self.details)}

    @classmethod
    def from_dict(cls, data: Any) -> Finding:
        if not isinstance(data, dict):
            raise ValueError(f"a finding must be a dict, got {type(data).__name__}")
        severity = data.get("severity")
        details = data.get("details")
        return cls(severity=severity if severity in SEVERITIES else "warning", code=str(data.get("code", "")),
                   message=str(data.get("message", "")), plugin=_opt_str(data.get("plugin")),
                   subject=_opt_str(data.get("subject")), reference=_opt_str(data.get("reference")),
                   details=details if isinstance(details, dict) else {})

    @staticmethod
    def is_finding_dict(data: Mapping[str, Any]) -> bool:
        """Has ``data`` the three keys a finding needs (as a plugin may return it)?"""
        return isinstance(data.get("severity"), str) and isinstance(data.get("code"), str) \
            and isinstance(data.get("message"), str)

    def line(self) -> str:
        """One line for a log or a terminal: what came from another process or a plugin
        escaped (gpudask.printable), so it can neither act on the terminal nor start a line."""
        who = printable(self.subject or "?")
        against = f" vs {printable(self.reference)}" if self.reference else ""
        return f"{printable(self.severity)}: {who}{against}: [{printable(self.plugin or 'gpudask')}] " \
               f"{printable(self.message)}"


def worst(findings: Iterable[Finding | Mapping[str, Any]]) -> str:
    """``"ok"`` or the highest severity among ``findings``."""
    ranks = [SEVERITIES.index(f.severity if isinstance(f, Finding) else f.get("severity", "warning"))
             for f in findings]
    return SEVERITIES[max(ranks)] if ranks else "ok"


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


# ------------------------------------------------------------------- untrusted data
class MalformedData(ValueError):
    pass


def json_safe(value: Any, depth: int = 0, budget: list[int] | None = None) -> Any:
    """A copy of ``value`` made of dict/list/str/int/float/bool/None only, or MalformedData."""
    budget = budget if budget is not None else [_MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0:
        raise MalformedData("too large")
    if depth > _MAX_DEPTH:
        raise MalformedData("nested too deeply")
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MalformedData(f"non-finite number {value!r}")
        return value
    if isinstance(value, str):
        if len(value) > _MAX_STR:
            raise MalformedData(f"a string of {len(value)} characters")
        return value
    if isinstance(value, (list, tuple)):
        return [json_safe(v, depth + 1, budget) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise MalformedData(f"a non-string key {type(k).__name__}")
            out[k] = json_safe(v, depth + 1, budget)
        return out
    raise MalformedData(f"a value of type {type(value).__name__}")


def fingerprint(value: Any) -> bytes | None:
    """A key for plain data, so what was validated once is not validated again: equal keys
    mean equal values of the same types (a str key is not an int key, 1 is not 1.0 nor
    True, str is not bytes), except that a tuple counts as a list (msgpack, which carries
    published data, gives tuples; :func:`json_safe` makes them lists).  None when the value
    is not msgpack data (then validate it).  One pass in C: a check of a 256-worker cluster
    keys 256 identical facts dicts of ~1000 items each (docs/benchmarks.md, scale)."""
    try:
        import msgpack  # distributed's own wire format: installed wherever distributed is

        key: bytes = msgpack.packb(value, use_bin_type=True)
    except (ImportError, TypeError, ValueError, OverflowError):  # no msgpack; other types, too deep, too large an int
        return None
    return key


def json_copy(value: Any) -> Any:
    """JSON-compatible copy for reports; anything else becomes its repr."""
    try:
        return json_safe(value)
    except MalformedData:
        return json.loads(json.dumps(value, default=repr))

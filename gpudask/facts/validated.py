"""Schema checks remembered across this user's gpudask processes on one host: importing
``jsonschema`` costs about 30 ms before the scheduler listens (docs/benchmarks.md), and a
launch validates the same data in several processes.  Data that passed is remembered by a
digest of gpudask's version, :data:`RULES`, the schema and the data in ``validated.json`` of
the private state directory; what fails is never remembered.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from typing import Any

from gpudask import session

logger = logging.getLogger("distributed.gpudask")

RULES = 1  # bumped when what "valid" means changes without a schema change (the strict integer)
MAX_REMEMBERED = 256  # digests kept; the oldest are forgotten first
FILE = "validated.json"
_WRITING = threading.Lock()  # the scheduler's check validates in threads


def digest(schema: Any, data: Any) -> str | None:
    """The key of ``data`` checked against ``schema``, or None when either is not plain data."""
    from gpudask._version import __version__
    from gpudask.findings import fingerprint

    schema_bytes, data_bytes = fingerprint(schema), fingerprint(data)
    if schema_bytes is None or data_bytes is None:
        return None
    h = hashlib.sha256(f"gpudask {__version__} rules {RULES}\0".encode())
    h.update(len(schema_bytes).to_bytes(8, "big"))
    h.update(schema_bytes)
    h.update(data_bytes)
    return h.hexdigest()


def passed_before(key: str | None) -> bool:
    """Did data of this digest pass its schema in a process of this user on this host?"""
    return key is not None and key in _remembered()


def remember(key: str | None) -> None:
    """Remember that the data of ``key`` passed (call only after it did)."""
    if key is None:
        return
    from gpudask.facts.statedir import StateDirError, state_dir, write_atomic

    with _WRITING:
        known = _remembered()
        if key in known:
            return
        known.append(key)
        del known[:-MAX_REMEMBERED]
        try:
            write_atomic(state_dir() / FILE, json.dumps({"rules": RULES, "valid": known}))
        except (OSError, StateDirError) as e:  # an unusable state directory: validate every time
            logger.debug("gpudask: validated data not remembered: %s", e)


def _remembered() -> list[str]:
    """The digests remembered on this host, read once per process."""
    state = session.current()
    if state.validated is None:
        state.validated = _read()
    return state.validated


def _read() -> list[str]:
    from gpudask.facts.statedir import StateDirError, location, read_private

    try:
        text = read_private(location() / FILE, "record of validated data")
    except (OSError, StateDirError):
        return []
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return []
    if not isinstance(data, dict) or data.get("rules") != RULES or not isinstance(data.get("valid"), list):
        return []
    return [k for k in data["valid"][-MAX_REMEMBERED:] if isinstance(k, str) and len(k) == 64]

"""Text from outside a process (what a worker publishes, a plugin returns, a file holds),
safe to print on a terminal or write as one log line: terminal escapes (``ESC [ 2 J`` clears
the screen), newlines that forge a log line, bidirectional overrides and lone surrogates are
escaped as Python writes them in a literal (``\\x1b``, ``\\n``, ``\\u202e``)."""

from __future__ import annotations

import re
from typing import Any

# C0 and C1 controls, DEL, line/paragraph separators, bidirectional controls, lone surrogates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return _NAMED.get(match.group()) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(value: Any) -> str:
    """``value`` (a string, else its ``str``) with every character that could act on a
    terminal or split a log line escaped; printable text, accents and CJK included, as it is."""
    text = value if type(value) is str else str.__str__(value) if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_escape, text)


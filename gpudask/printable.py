"""Text from outside a process, made safe to print on a terminal or write as one log line.

What a worker publishes, what a plugin returns or a file holds may contain terminal escape
sequences (``ESC [ 2 J`` clears the operator's screen, ``ESC ] 0 ;`` retitles the window),
newlines that start a forged log line, bidirectional overrides that show text in another
order, or lone surrogates a terminal cannot encode.  :func:`printable` escapes every such
character the way Python writes it in a string literal (``\\x1b``, ``\\n``, ``\\u202e``),
so the text stays readable and nothing of it acts on the terminal or the log.

The CLI's renderers (``gpudask check``, ``gpudask status``, their tables) and gpudask's log
lines that carry outside strings go through it.
"""

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


__all__ = ["printable"]

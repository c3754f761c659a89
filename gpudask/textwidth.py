"""Text wrapped to the terminal (``COLUMNS`` or its width; none for a pipe or a file) between words."""

from __future__ import annotations

import shutil
import textwrap

from gpudask.printable import printable


def terminal_width() -> int | None:
    """``$COLUMNS`` or the terminal's width; None (no limit) when writing to a pipe or file."""
    columns = shutil.get_terminal_size(fallback=(0, 0)).columns
    return columns if columns > 0 else None


def wrap_text(text: str, width: int | None = -1, indent: str = "  ") -> str:
    """Prose lines wrapped to the terminal (continuations indented); whole without a terminal."""
    if width == -1:
        width = terminal_width()
    # each line's text escaped (a plugin's warning, what a worker published): only the
    # caller's own newlines break lines
    lines = [printable(line) for line in text.split("\n")]
    if width is None:
        return "\n".join(lines)
    return "\n".join(textwrap.fill(line, width, subsequent_indent=indent, break_on_hyphens=False,
                                   break_long_words=True) if len(line) > width else line
                     for line in lines)

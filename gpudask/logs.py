"""gpudask's log lines in dask processes."""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("gpudask")


def ensure_log_handler() -> None:
    """distributed configures only its own loggers; show gpudask's INFO lines the same way."""
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False

"""RMM pools in worker processes."""

from __future__ import annotations

name = "rmm"
priority = 100

"""The scheduler has what the workers need (GPU, driver, CUDA, packages)."""

from __future__ import annotations

name = "scheduler-parity"
priority = 200

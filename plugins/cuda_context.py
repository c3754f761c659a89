"""The CUDA-context-first check: no stray context before UCX, the worker's context on its own GPU."""

from __future__ import annotations

name = "cuda-context"
priority = 40

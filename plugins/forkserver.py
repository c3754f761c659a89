"""The forkserver start method for worker processes when InfiniBand is used."""

from __future__ import annotations

name = "forkserver"
priority = 30

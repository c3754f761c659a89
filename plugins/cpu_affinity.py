"""Bind each worker to the CPUs local to its GPU."""

from __future__ import annotations

name = "cpu-affinity"
priority = 20

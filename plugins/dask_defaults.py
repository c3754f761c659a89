"""Dask defaults that break on GPU data (P2P rechunk on CuPy) changed for GPU workers."""

from __future__ import annotations

name = "gpu-dask-defaults"
priority = 150

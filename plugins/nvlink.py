"""UCX over NVLink / CUDA IPC (cuda_copy, cuda_ipc)."""

from __future__ import annotations

name = "nvlink"
priority = 60

"""One GPU per worker: CUDA_VISIBLE_DEVICES rotated per worker, GPU=1 resource."""

from __future__ import annotations

name = "gpu-pinning"
priority = 10

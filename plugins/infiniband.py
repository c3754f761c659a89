"""UCX over InfiniBand: rc, rdmacm, the port nearest each GPU."""

from __future__ import annotations

name = "infiniband"
priority = 70

"""The base UCX transport (tcp) and the plain-TCP fallback."""

from __future__ import annotations

name = "tcp"
priority = 50

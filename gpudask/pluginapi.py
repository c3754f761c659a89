"""The public plugin API (minimal version for the spill branch; the full module replaces it).

Built-in plugins and ``contrib/`` import only this module from gpudask.
"""

from __future__ import annotations

from typing import Any

from dask.utils import format_bytes, parse_bytes

from gpudask.config import (Option, choice, parse_bool, parse_name_list, parse_optional_bool,
                            parse_optional_float)
from gpudask.context import PlanContext
from gpudask.errors import ConfigError, GpudaskError, PluginError
from gpudask.hookspecs import hookimpl
from gpudask.plan import HostPlan, ProcessPlan

__all__ = ["hookimpl", "Option", "parse_bool", "parse_optional_bool", "parse_optional_float", "parse_name_list",
           "choice", "GpudaskError", "ConfigError", "PluginError", "PlanContext", "ProcessPlan", "HostPlan",
           "workers_sharing_gpu", "format_bytes", "parse_bytes"]


def workers_sharing_gpu(ctx: Any, plan: Any) -> list[int]:
    """Indices of this host's workers that run on ``plan``'s GPU (``plan`` itself included).

    Workers are given the visible GPUs (a MIG instance counts as one) in turn: worker i
    gets unit i mod n, so with more workers than units several share one."""
    units: list[str] = []
    for gpu in ctx.gpus:
        instances = gpu.mig.get("instances") or [] if gpu.mig.get("enabled") else []
        units += [i.get("uuid") for i in instances] or [gpu.uuid]
    if not units or plan.role != "worker":
        return [plan.index] if plan.index is not None else []
    position = units.index(plan.gpu) if plan.gpu in units else (plan.index or 0) % len(units)
    return [i for i in range(ctx.nworkers) if i % len(units) == position]

"""GPUDirect Storage for KvikIO in dask workers: a fact of its own and a decision.

The fact is this plugin's section of the host's facts (``ctx.facts.section("gds")``):
``{"nvidia_fs": "<driver version>" | null, "cufile_json": "<path>" | null}``.  The decision
is each GPU worker's ``KVIKIO_COMPAT_MODE``.  Nothing here is imported from gpudask beyond
``gpudask.pluginapi``, and no gpudask file knows this plugin.
"""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import FactsSection, hookimpl

if TYPE_CHECKING:
    from gpudask.pluginapi import Facts, PlanContext, ProcessPlan

name = "gds"
priority = 130

SECTION = "gds"
NVIDIA_FS = pathlib.Path("/proc/driver/nvidia-fs/version")
CUFILE_DEFAULT = pathlib.Path("/etc/cufile.json")

# the section's JSON Schema fragment: what a described host's facts file may say
SCHEMA: dict[str, Any] = {
    "type": "object",
    "x-accepts": 'an object {"nvidia_fs": driver version or null, "cufile_json": path or null}',
    "required": ["nvidia_fs", "cufile_json"],
    "additionalProperties": False,
    "properties": {
        "nvidia_fs": {"type": ["string", "null"], "x-accepts": "the nvidia-fs driver's version, or null (not loaded)"},
        "cufile_json": {"type": ["string", "null"], "x-accepts": "the path of the cuFile configuration, or null"},
    },
}


def probe(facts: Facts) -> dict[str, Any]:
    """This host's GPUDirect Storage: the nvidia-fs driver (procfs, no CUDA) and cuFile's config."""
    try:
        text = NVIDIA_FS.read_text(errors="replace")
    except OSError:
        version = None
    else:
        # "version: 2.17.5" (first line); the file's presence is what matters
        first = text.strip().splitlines()[0] if text.strip() else ""
        version = first.split(":", 1)[-1].strip() or "unknown"
    config = os.environ.get("CUFILE_ENV_PATH_JSON") or (str(CUFILE_DEFAULT) if CUFILE_DEFAULT.is_file() else None)
    return {"nvidia_fs": version, "cufile_json": config}


@hookimpl
def gpudask_facts_sections() -> list[FactsSection]:
    return [FactsSection(SECTION, SCHEMA, probe)]


@hookimpl
def gpudask_plan_process(ctx: PlanContext, plan: ProcessPlan) -> None:
    if plan.role != "worker" or not ctx.gpus:
        return
    gds = ctx.facts.section(SECTION)
    if gds is None:
        plan.note("KVIKIO_COMPAT_MODE not set", f"{ctx.facts.where()} does not say whether GPUDirect Storage is there")
    elif gds["nvidia_fs"]:
        plan.set_env("KVIKIO_COMPAT_MODE", "OFF", f"the nvidia-fs driver {gds['nvidia_fs']} is loaded: KvikIO reads "
                     "and writes GPU memory through GPUDirect Storage")
    else:
        plan.set_env("KVIKIO_COMPAT_MODE", "ON", "no nvidia-fs driver: KvikIO's POSIX I/O through host memory, "
                     "without trying cuFile first")

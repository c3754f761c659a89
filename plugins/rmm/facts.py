"""The rmm plugin's facts: device memory free on each GPU when the facts were read.

Its section of the host's facts (``ctx.facts.section("rmm")``)::

    {"memory_free": {"0": 150000000000, "1": 120000000000}}

GPU index (as a string: a JSON key) -> bytes free (NVML: other processes' contexts and
pools, a second command's workers, taken); a GPU not listed: unknown.  A default pool is
sized from it (:mod:`.target`).  Probed through NVML (never a CUDA context; pynvml is
imported by the probe only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import FactsSection, nvml_session

if TYPE_CHECKING:
    from gpudask.pluginapi import Facts

SECTION = "rmm"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "x-accepts": 'an object {"memory_free": {GPU index: bytes free}}',
    "required": ["memory_free"],
    "properties": {
        "memory_free": {
            "type": "object",
            "x-accepts": 'an object {GPU index ("0"): bytes free when the facts were read}',
            "propertyNames": {"pattern": "^(0|[1-9][0-9]*)$", "x-accepts": 'a GPU index ("0", "1", ...)'},
            "additionalProperties": {"type": "integer", "minimum": 0, "x-accepts": "an integer >= 0 (bytes)"},
        },
    },
}


def memory_free(facts: Facts, index: int) -> int | None:
    """Bytes free on GPU ``index`` when the facts were read; None when unknown."""
    section = facts.section(SECTION)
    if section is None:
        return None
    free = section["memory_free"].get(str(index))
    return None if free is None else int(free)


def probe(facts: Facts) -> dict[str, Any]:
    """Free memory of each GPU, through NVML (by UUID: facts handed in for another host's GPUs
    find none here, and say unknown)."""
    free: dict[str, int] = {}
    if not facts.gpus:
        return {"memory_free": free}
    with nvml_session() as nvml:
        if nvml is None:  # no driver, no libnvidia-ml: unknown
            return {"memory_free": free}
        for gpu in facts.gpus:
            handle = nvml.call("nvmlDeviceGetHandleByUUID", gpu.uuid)
            info = nvml.call("nvmlDeviceGetMemoryInfo", handle) if handle is not None else None
            value = getattr(info, "free", None)
            if value is not None:  # else a lost GPU, an old binding: unknown
                free[str(gpu.index)] = int(value)
    return {"memory_free": free}


def check(value: Any, facts: Facts) -> tuple[list[str | int], str, Any] | None:
    """Every GPU named is one of the host's, and its free memory at most its memory_total."""
    by_index = {g.index: g for g in facts.gpus}
    for key, free in value["memory_free"].items():
        gpu = by_index.get(int(key))
        if gpu is None:
            known = ", ".join(map(str, sorted(by_index))) or "none"
            return ["memory_free", key], f"keyed by the index of a GPU of the host ({known})", key
        if free > gpu.memory_total:
            return ["memory_free", key], f"at most memory_total ({gpu.memory_total})", free
    return None


SECTIONS = [FactsSection(SECTION, SCHEMA, probe, check=check)]

"""The rmm plugin's facts section (``ctx.facts.section("rmm")``), probed through NVML (never a CUDA context).

``memory_free``: GPU index -> bytes free when the facts were read (a GPU not listed: unknown);
``other_workers`` (optional): GPU index -> {pid of another gpudask command of this user: its
workers planned on that GPU} (:mod:`.shares`); ``processes`` (optional): GPU index -> the
processes NVML lists on it, with the bytes each holds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import FactsSection, hookimpl, nvml_session

from . import shares

if TYPE_CHECKING:
    from gpudask.pluginapi import Facts

SECTION = "rmm"

_INDEX = {"pattern": "^(0|[1-9][0-9]*)$", "x-accepts": 'a GPU index ("0", "1", ...)'}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "x-accepts": 'an object {"memory_free": {GPU index: bytes free}}',
    "required": ["memory_free"],
    "properties": {
        "memory_free": {
            "type": "object",
            "x-accepts": 'an object {GPU index ("0"): bytes free when the facts were read}',
            "propertyNames": _INDEX,
            "additionalProperties": {"type": "integer", "minimum": 0, "x-accepts": "an integer >= 0 (bytes)"},
        },
        "other_workers": {
            "type": "object",
            "x-accepts": 'an object {GPU index ("0"): {pid of another gpudask command: its workers on that GPU}}',
            "propertyNames": _INDEX,
            "maxProperties": 1024,
            "additionalProperties": {
                "type": "object", "maxProperties": 1024,
                "x-accepts": 'an object {pid ("4711"): workers of that command on the GPU (an integer >= 1)}',
                "propertyNames": {"pattern": "^[1-9][0-9]{0,9}$", "x-accepts": 'a process id ("4711")'},
                "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 4096,
                                         "x-accepts": "an integer from 1 to 4096"},
            },
        },
        "processes": {
            "type": "object",
            "x-accepts": 'an object {GPU index ("0"): [{"pid": ..., "used": bytes or null}]}',
            "propertyNames": _INDEX,
            "maxProperties": 1024,
            "additionalProperties": {
                "type": "array", "maxItems": 4096,
                "x-accepts": 'a list of {"pid": process id, "used": bytes or null}',
                "items": {
                    "type": "object", "required": ["pid"], "additionalProperties": False,
                    "x-accepts": 'an object {"pid": process id, "used": bytes or null}',
                    "properties": {
                        "pid": {"type": "integer", "minimum": 0, "maximum": 2**31,
                                "x-accepts": "a process id (an integer >= 0)"},
                        "used": {"type": ["integer", "null"], "minimum": 0,
                                 "x-accepts": "an integer >= 0 (bytes) or null"},
                    },
                },
            },
        },
    },
}


def of_gpu(facts: Facts, index: int) -> tuple[int | None, dict[int, int], list[tuple[int, int | None]] | None]:
    """GPU ``index``'s (bytes free, {pid of another gpudask command: its workers on it}, (pid, bytes) of the
    processes NVML listed on it); None: not known."""
    section = facts.section(SECTION) or {}
    free = section.get("memory_free", {}).get(str(index))
    others = (section.get("other_workers") or {}).get(str(index)) or {}
    found = (section.get("processes") or {}).get(str(index))
    return (None if free is None else int(free), {int(pid): int(n) for pid, n in others.items()},
            None if found is None else [(int(p["pid"]), None if p.get("used") is None else int(p["used"]))
                                        for p in found])


def probe(facts: Facts) -> dict[str, Any]:
    """Free memory of each GPU, by UUID (another host's GPUs find none here, and say unknown)."""
    free: dict[str, int] = {}
    out: dict[str, Any] = {"memory_free": free}
    if not facts.gpus:
        return out
    others = shares.other_commands(str(facts.hostname))
    by_uuid = {g.uuid: g.index for g in facts.gpus}
    counted = {str(by_uuid[u]): {str(pid): n for pid, n in per.items()} for u, per in others.items() if u in by_uuid}
    if counted:
        out["other_workers"] = counted
    with nvml_session() as nvml:
        if nvml is None:  # no driver, no libnvidia-ml: unknown
            return out
        for gpu in facts.gpus:
            handle = nvml.call("nvmlDeviceGetHandleByUUID", gpu.uuid)
            info = nvml.call("nvmlDeviceGetMemoryInfo", handle) if handle is not None else None
            value = getattr(info, "free", None)
            if value is not None:  # else a lost GPU, an old binding: unknown
                free[str(gpu.index)] = int(value)
    listed = {str(g.index): [{"pid": pid, "used": used} for pid, used in found]
              for g in facts.gpus if (found := shares.gpu_processes(g.uuid)) is not None}
    if listed:
        out["processes"] = listed
    return out


def check(value: Any, facts: Facts) -> tuple[list[str | int], str, Any] | None:
    """Every GPU named is one of the host's, and its free memory at most its memory_total."""
    by_index = {g.index: g for g in facts.gpus}
    known = ", ".join(map(str, sorted(by_index))) or "none"
    for part in ("other_workers", "processes"):
        for key in value.get(part) or {}:
            if int(key) not in by_index:
                return [part, key], f"keyed by the index of a GPU of the host ({known})", key
    for key, free in value["memory_free"].items():
        gpu = by_index.get(int(key))
        if gpu is None:
            return ["memory_free", key], f"keyed by the index of a GPU of the host ({known})", key
        if free > gpu.memory_total:
            return ["memory_free", key], f"at most memory_total ({gpu.memory_total})", free
    return None


@hookimpl
def gpudask_facts_sections() -> list[FactsSection]:
    """Device memory free on each GPU when the facts were read."""
    return [FactsSection(SECTION, SCHEMA, probe, check=check)]

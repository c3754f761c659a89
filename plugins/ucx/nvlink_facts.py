"""The nvlink plugin's facts (``ctx.facts.section("nvlink")``): GPU index -> the GPUs it reaches over
NVLink, directly or through an NVSwitch (not listed: no peer).  Probed through NVML, never a CUDA context."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import FactsSection, norm_bus_id, nvml_session

if TYPE_CHECKING:
    from gpudask.pluginapi import Facts

SECTION = "nvlink"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "x-accepts": 'an object {"peers": {GPU index: [indices of its NVLink peers]}}',
    "required": ["peers"],
    "properties": {
        "peers": {
            "type": "object",
            "x-accepts": 'an object {GPU index ("0"): [indices of the GPUs it reaches over NVLink]}',
            "propertyNames": {"pattern": "^(0|[1-9][0-9]*)$", "x-accepts": 'a GPU index ("0", "1", ...)'},
            "additionalProperties": {
                "type": "array",
                "x-accepts": "a list of GPU indices",
                "items": {"type": "integer", "minimum": 0, "x-accepts": "an integer >= 0 (a GPU index)"},
            },
        },
    },
}


def peers(facts: Facts, index: int) -> list[int] | None:
    section = facts.section(SECTION)
    if section is None:
        return None
    return sorted(section["peers"].get(str(index), []))


def probe(facts: Facts) -> dict[str, Any]:
    """NVLink peers through NVML, GPUs found by UUID (another host's GPUs find none here)."""
    if not facts.gpus:
        return {"peers": {}}
    with nvml_session() as nvml:
        if nvml is None:  # no driver, no libnvidia-ml: nothing known to link
            return {"peers": {}}
        handles = [(gpu.index, gpu.pci_bus_id, nvml.call("nvmlDeviceGetHandleByUUID", gpu.uuid)) for gpu in facts.gpus]
        found = _peers(nvml.module, nvml.call, [(i, b, h) for i, b, h in handles if h is not None])
        return {"peers": {str(i): p for i, p in found.items() if p}}


def _peers(pynvml: Any, nv: Any, devices: Sequence[tuple[int, str | None, Any]]) -> dict[int, list[int]]:
    by_bus: dict[str | None, int] = {bus: index for index, bus, _ in devices if bus}
    gpu_t = getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)
    switch_t = getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
    npu_t = getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_IBMNPU", 1)
    enabled = getattr(pynvml, "NVML_FEATURE_ENABLED", 1)
    on_switch: set[int] = set()
    direct: dict[int, set[int]] = {}
    for index, _, h in devices:
        found = direct.setdefault(index, set())
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            if nv("nvmlDeviceGetNvLinkState", h, link) != enabled:
                continue
            kind = nv("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            if kind == switch_t:
                on_switch.add(index)
                continue
            if kind == npu_t:
                continue  # NVLink to a POWER CPU, not to a GPU
            pci = nv("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            remote = by_bus.get(norm_bus_id(pci.busId) if pci is not None else None)
            if remote is not None:
                found.add(remote)
            elif kind != gpu_t:
                on_switch.add(index)  # type unknown and not one of our GPUs: a switch
    return {index: sorted((direct[index] | (on_switch if index in on_switch else set())) - {index})
            for index, _, _ in devices}


def check(value: Any, facts: Facts) -> tuple[list[str | int], str, Any] | None:
    indices = [g.index for g in facts.gpus]
    known = ", ".join(map(str, sorted(indices))) or "none"
    for key, found in value["peers"].items():
        if int(key) not in indices:
            return ["peers", key], f"keyed by the index of a GPU of the host ({known})", key
        for j, peer in enumerate(found):
            if peer not in indices or peer == int(key):
                return ["peers", key, j], f"the index of another GPU ({known})", peer
    return None


# no plan decision depends on the peers (CUDA IPC is allowed wherever UCX can use it): they are
# read for the text of the nvlink plugin's reason only, so probed where that text is made
SECTIONS = [FactsSection(SECTION, SCHEMA, probe, check=check, decides=False)]

"""The facts model: plain dataclasses, read-only by convention (:func:`gpudask.facts.get_facts`
hands out cached instances); standard library only (loaded in every ``dask worker`` CLI process).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpudask.errors import FactsError

SCHEMA_VERSION = 2


@dataclass
class GPU:
    index: int
    uuid: str
    name: str
    memory_total: int
    compute_capability: tuple[int, int] | None
    pci_bus_id: str | None
    pci_path: str | None
    numa_node: int | None
    cpu_affinity: list[int]
    mig: dict[str, Any]  # {"enabled": bool, "instances": [{"uuid": "MIG-...", "memory_total": int, ...}]}

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)  # a deep copy, in the fields' order
        out["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        return out


@dataclass
class Facts:
    hostname: str
    cpu_count: int
    driver_version: str | None
    cuda_driver_version: int | None
    gpus: list[GPU]
    net_interfaces: dict[str, list[str]]
    cuda_visible_devices: str | None
    packages: dict[str, str | None]
    origin: str  # "probed", or the path of the facts file
    schema: int = SCHEMA_VERSION
    # the plugins' own facts, by section name (gpudask.facts.sections): read with section()
    sections: dict[str, Any] = field(default_factory=dict)
    # sections that decide nothing (FactsSection.decides false), probed when first read
    deferred: dict[str, Callable[[], Any]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def described(self) -> bool:
        return self.origin != "probed"

    def section(self, name: str) -> Any:
        """The facts section ``name`` a plugin declared (``gpudask_facts_sections``); None when
        a described host does not say."""
        if name not in self.sections and name in self.deferred:
            self.sections[name] = self.deferred.pop(name)()
        return self.sections.get(name)

    @property
    def cuda_major(self) -> int | None:
        return None if self.cuda_driver_version is None else self.cuda_driver_version // 1000

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "hostname": self.hostname,
            "cpu_count": self.cpu_count,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "gpus": [g.to_dict() for g in self.gpus],
            "net_interfaces": {k: list(v) for k, v in self.net_interfaces.items()},
            "cuda_visible_devices": self.cuda_visible_devices,
            "packages": dict(self.packages),
            **({"sections": copy.deepcopy(self.sections)} if self.sections else {}),
        }

    def gpu_by_index(self, index: int) -> GPU:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise FactsError(f"{self.where()}: no GPU with index {index} (GPUs: {self.known_indices()})")

    def visible_gpus(self) -> list[GPU]:
        """The GPUs CUDA would show this process, in CUDA's order."""
        return resolve_visible(self, self.cuda_visible_devices, self.cvd_key())

    @property
    def cvd_ignored(self) -> bool:
        """A probed host where NVML sees no GPU: CUDA shows nothing whatever CUDA_VISIBLE_DEVICES says."""
        return not self.described and not self.gpus and bool((self.cuda_visible_devices or "").strip())

    def where(self) -> str:
        return self.origin if self.described else "probed host"

    def cvd_key(self) -> str:
        return "key 'cuda_visible_devices'" if self.described else "CUDA_VISIBLE_DEVICES"

    def known_indices(self) -> str:
        return ", ".join(str(g.index) for g in sorted(self.gpus, key=lambda g: g.index)) or "none"


def resolve_visible(facts: Facts, value: str | None, key: str) -> list[GPU]:
    """The GPUs a CUDA_VISIBLE_DEVICES ``value`` selects, in its order (``key`` names it in errors)."""
    by_index = sorted(facts.gpus, key=lambda g: g.index)
    if value is None:
        return by_index
    if not value.strip():
        return []
    if not facts.gpus and not facts.described:
        # A probed host without a GPU (no driver): CUDA shows nothing whatever the variable says.
        return []
    chosen: list[GPU] = []
    for raw in value.split(","):
        entry = raw.strip()
        if re.fullmatch(r"-\d+", entry):
            break  # CUDA stops at a negative index ("-1" hides all GPUs)
        gpu = _match_entry(facts, entry, key)
        if gpu not in chosen:  # two MIG instances of one GPU select it once
            chosen.append(gpu)
    return chosen


def _match_entry(facts: Facts, entry: str, key: str) -> GPU:
    found: list[GPU] = []
    if entry.isdigit():
        found = [g for g in facts.gpus if g.index == int(entry)]
    elif entry.startswith("GPU-"):
        # CUDA accepts any unique prefix of the uuid.
        found = [g for g in facts.gpus if g.uuid.lower().startswith(entry.lower())]
    elif entry.startswith("MIG-GPU-"):
        # Old (driver < 470) form: MIG-GPU-<parent uuid>/<gi>/<ci>
        parent = entry[len("MIG-"):].split("/")[0].lower()
        found = [g for g in facts.gpus if g.uuid.lower() == parent]
    elif entry.startswith("MIG-"):
        found = [g for g in facts.gpus
                 if any(str(i.get("uuid", "")).lower().startswith(entry.lower()) for i in g.mig.get("instances", []))]
    if len(found) == 1:
        return found[0]
    what = "is ambiguous" if found else "names no GPU"
    raise FactsError(f"{facts.where()}: {key} entry {entry!r} {what} (accepted: an index among "
                     f"{facts.known_indices()}, a 'GPU-<uuid>' or a 'MIG-<uuid>' of this host, or '' for none)")

"""What gpudask decided, per process, and why.

A :class:`ProcessPlan` is filled by the plan hooks through its ``set_*`` / ``add_*``
methods, each of which records a :class:`Reason` naming the plugin that decided.  The
plan is plain data: it is printed by ``gpudask info``, applied by the apply stage
(see docs/architecture.md), and published by workers in their startup information.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = ("scheduler", "nanny", "client", "worker")


@dataclass
class Reason:
    plugin: str
    decision: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class MemoryPlan(Mapping[str, Any]):
    """The device-memory decision for one process (written by a ``gpudask_plan_memory`` hook).

    The typed part is what any allocator has: its kind, the pool's initial and maximum
    sizes in bytes, the GPU (UUID) it lives on.  ``details`` holds the deciding plugin's
    own keys, published as they are.  It reads like the published dict
    (``plan.memory["initial_pool_size"]``), which is what ``gpudask info --json`` prints.
    """

    allocator: str | None = None  # None: no allocator decided (only other plugins' keys)
    initial_pool_size: int | None = None
    maximum_pool_size: int | None = None
    gpu: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryPlan:
        core = ("allocator", "initial_pool_size", "maximum_pool_size", "gpu")
        allocator = data.get("allocator")
        return cls(None if allocator is None else str(allocator), data.get("initial_pool_size"),
                   data.get("maximum_pool_size"), data.get("gpu"), {k: v for k, v in data.items() if k not in core})

    def to_dict(self) -> dict[str, Any]:
        if self.allocator is None:
            return {**self.details, **({"gpu": self.gpu} if self.gpu is not None else {})}
        return {"allocator": self.allocator, "initial_pool_size": self.initial_pool_size,
                "maximum_pool_size": self.maximum_pool_size, **self.details, "gpu": self.gpu}

    def summary(self) -> str:
        return (f"allocator={self.allocator}, initial_pool_size={self.initial_pool_size}, "
                f"maximum_pool_size={self.maximum_pool_size}")

    # -- read like the published dict ------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


@dataclass
class ProcessPlan:
    role: str
    index: int | None = None
    gpu: str | None = None  # UUID of the worker's own GPU (MIG UUID for MIG instances)
    gpu_index: int | None = None  # NVML index of that GPU
    cuda_visible_devices: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    interface: str | None = None
    cpu_affinity: list[int] | None = None
    memory: MemoryPlan | None = None
    multiprocessing_method: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    ucx_transports: list[str] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)
    # set by the plugin manager around each hook call, so reasons name the plugin
    acting_plugin: str = field(default="gpudask", repr=False, compare=False)

    def __str__(self) -> str:  # short, for traces and messages
        return self.role + (f" {self.index}" if self.index is not None else "") + " plan"

    # -- recording decisions -------------------------------------------------------
    def note(self, decision: str, why: str) -> None:
        """Record a decision (or a skip: ``note("skipped", "no GPU")``) with its reason."""
        self.reasons.append(Reason(self.acting_plugin, decision, why))

    def set_env(self, name: str, value: str, why: str) -> None:
        self.env[name] = str(value)
        self.note(f"{name}={value}", why)

    def unset_env(self, name: str, why: str) -> None:
        if self.env.pop(name, None) is not None:
            self.note(f"{name} unset", why)

    def set_config(self, key: str, value: Any, why: str) -> None:
        self.config[key] = value
        self.note(f"{key}={value!r}", why)

    def set_gpu(self, uuid: str, index: int, cuda_visible_devices: str, why: str) -> None:
        self.gpu, self.gpu_index = uuid, index
        self.cuda_visible_devices = cuda_visible_devices
        self.env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        self.note(f"CUDA_VISIBLE_DEVICES={cuda_visible_devices}", why)

    def set_interface(self, interface: str, why: str) -> None:
        self.interface = interface
        self.note(f"interface={interface}", why)

    def set_cpu_affinity(self, cpus: list[int], why: str) -> None:
        self.cpu_affinity = sorted(cpus)
        self.note(f"cpu_affinity={cpu_ranges(self.cpu_affinity)}", why)

    def set_multiprocessing_method(self, method: str, why: str) -> None:
        self.multiprocessing_method = method
        self.note(f"multiprocessing_method={method}", why)

    def set_memory(self, memory: MemoryPlan | Mapping[str, Any] | None, why: str) -> None:
        """The memory decision (a :class:`MemoryPlan`; a dict with its keys is converted).
        Several plugins add to one plan (rmm's pool, spill's device limit, worker-memory's
        host share): the decision line names what this call changed."""
        if memory is not None and not isinstance(memory, MemoryPlan):
            memory = MemoryPlan.from_dict(memory)
        previous = self.memory.to_dict() if self.memory is not None else {}
        self.memory = memory
        now = memory.to_dict() if memory is not None else {}
        changed = {k: v for k, v in now.items() if k not in previous or previous[k] != v}
        keys = ("allocator", "initial_pool_size", "maximum_pool_size", "device_memory_limit")
        shown = "none" if memory is None else ", ".join(f"{k}={changed[k]}" for k in keys if k in changed) or \
            ", ".join(f"{k}={v}" for k, v in changed.items()) or "unchanged"
        self.note(f"memory: {shown}", why)

    def set_resource(self, name: str, amount: float, why: str) -> None:
        self.resources[name] = amount
        self.note(f"resource {name}={amount:g}", why)

    def add_ucx_transport(self, name: str, why: str) -> None:
        if name not in self.ucx_transports:
            self.ucx_transports.append(name)
            self.note(f"UCX transport {name}", why)

    def remove_ucx_transport(self, name: str, why: str) -> None:
        if name in self.ucx_transports:
            self.ucx_transports.remove(name)
            self.note(f"no UCX transport {name}", why)

    # -- reading -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {
            "role": self.role,
            "index": self.index,
            "gpu": self.gpu,
            "gpu_index": self.gpu_index,
            "cuda_visible_devices": self.cuda_visible_devices,
            "env": dict(self.env),
            "config": dict(self.config),
            "interface": self.interface,
            "cpu_affinity": self.cpu_affinity,
            "memory": None if self.memory is None else self.memory.to_dict(),
            "multiprocessing_method": self.multiprocessing_method,
            "resources": dict(self.resources),
            "ucx_transports": list(self.ucx_transports),
            "reasons": [r.to_dict() for r in self.reasons],
        }
        return data


    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessPlan:
        """The inverse of :meth:`to_dict` (a worker process reads its plan from its parent's)."""
        fields = {k: v for k, v in data.items() if k not in ("reasons", "memory")}
        memory = data.get("memory")
        return cls(**fields, memory=None if memory is None else MemoryPlan.from_dict(memory),
                   reasons=[Reason(**r) for r in data.get("reasons", [])])


def cpu_ranges(cpus: Iterable[int]) -> str:
    """[0,1,2,3,8] -> '0-3,8' (short enough for a reason line)."""
    out: list[str] = []
    for cpu in cpus:
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == cpu - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{cpu}"
        elif out and "-" not in out[-1] and int(out[-1]) == cpu - 1:
            out[-1] = f"{out[-1]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)

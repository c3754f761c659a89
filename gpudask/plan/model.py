"""What gpudask decided, per process, and why: the plan hooks fill a :class:`ProcessPlan`
through its ``set_*`` / ``add_*`` methods, each recording a :class:`Reason` naming the plugin.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpudask.errors import GpudaskError
from gpudask.plaindata import plain, text
from gpudask.plan.context import snapshot
from gpudask.plan.values import check_env, check_value

ROLES = ("scheduler", "nanny", "client", "worker")


@dataclass
class Reason:
    plugin: str
    decision: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


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
    # each plugin's own decisions, by plugin name (written with set_section)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    # what a plugin asks another to take into account: {owner: {requester: values}} (request())
    requests: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    multiprocessing_method: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    ucx_transports: list[str] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)
    # set by the plugin manager around each hook call, so reasons name the plugin
    acting_plugin: str = field(default="gpudask", repr=False, compare=False)
    # the sections as the previous plan steps left them: what section() reads
    _settled: dict[str, dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    # the sections the acting plugin declared it reads (its ``reads_sections``)
    acting_reads: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def __str__(self) -> str:  # short, for traces and messages
        return self.role + (f" {self.index}" if self.index is not None else "") + " plan"

    def note(self, decision: str, why: str) -> None:
        """Record a decision (or a skip: ``note("skipped", "no GPU")``) with its reason."""
        # a plugin's words, as exact strings (gpudask.plaindata): published and printed as they are
        self.reasons.append(Reason(self.acting_plugin, text(decision), text(why)))

    def set_env(self, name: str, value: str, why: str) -> None:
        self.env[name] = str.__str__(check_env(name, value))
        self.note(f"{name}={self.env[name]}", why)

    def unset_env(self, name: str, why: str) -> None:
        if self.env.pop(name, None) is not None:
            self.note(f"{name} unset", why)

    def set_config(self, key: str, value: Any, why: str) -> None:
        if not isinstance(key, str) or not key:
            raise GpudaskError(f"dask config key {key!r:.60} refused; accepted: a non-empty dotted string")
        check_value(value, f"dask config {key}")
        key, value = str.__str__(key), plain(value, strict=True)  # exact types: what the plan holds is data
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

    def set_section(self, values: Mapping[str, Any], why: str, decision: str | None = None) -> None:
        """Merge ``values`` into the acting plugin's own section (``plan.sections[plugin]``,
        published as it is); the reason line is ``decision`` or ``<plugin>: key=value, ...``
        of what changed."""
        owner = self.acting_plugin
        check_value(dict(values), f"plan section {owner!r}")
        values = plain(dict(values), strict=True)  # exact types: what the plan publishes is data
        section = self.sections.setdefault(owner, {})
        changed = {k: v for k, v in values.items() if k not in section or section[k] != v}
        section.update(values)
        shown = ", ".join(f"{k}={v}" for k, v in changed.items()) or "unchanged"
        self.note(decision if decision is not None else f"{owner}: {shown}", why)

    def section(self, owner: str) -> Mapping[str, Any]:
        """Plugin ``owner``'s section as the *previous* plan steps left it (read-only): another
        plugin's only when declared in ``reads_sections``, so the order is the plan's steps',
        never the priorities.  A plugin reads its own section as it is now."""
        if owner == self.acting_plugin:
            return MappingProxyType(self.sections.get(owner, {}))
        if self.acting_plugin != "gpudask" and owner not in self.acting_reads:
            raise GpudaskError(f"plugin {self.acting_plugin!r} reads the plan section of {owner!r} without "
                               f"declaring it; accepted: name it in the plugin's reads_sections "
                               f"(now {list(self.acting_reads)})")
        settled = self.sections if self._settled is None else self._settled
        return MappingProxyType(settled.get(owner, {}))

    def request(self, owner: str, values: Mapping[str, Any], why: str) -> None:
        """Ask plugin ``owner`` to take ``values`` into account (merged into what this plugin
        asked before); the owner reads them with :meth:`requests_for` in a later step."""
        asked = self.requests.setdefault(owner, {}).setdefault(self.acting_plugin, {})
        asked.update(values)
        self.note(f"asks {owner}: " + ", ".join(f"{k}={v}" for k, v in values.items()), why)

    def requests_for(self, owner: str) -> Mapping[str, Mapping[str, Any]]:
        """``{requester: values}`` addressed to ``owner`` by the earlier plan steps (read-only)."""
        settled = self.requests if self._settled is None else self._settled.get("\0requests", {})
        return MappingProxyType({k: MappingProxyType(v) for k, v in settled.get(owner, {}).items()})

    def settle_sections(self) -> None:
        """Freeze what :meth:`section` shows other plugins: called at the start of each plan step."""
        self._settled = {**copy.deepcopy(self.sections), "\0requests": copy.deepcopy(self.requests)}

    def set_resource(self, name: str, amount: float, why: str) -> None:
        if not isinstance(name, str) or not name or isinstance(amount, bool) or \
                not isinstance(amount, (int, float)) or not 0 <= amount < 2**53:
            raise GpudaskError(f"resource {name!r:.60}={amount!r:.40} refused; accepted: a name and a finite "
                               "number from 0 to 2**53")
        name, amount = str.__str__(name), plain(amount, strict=True)
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

    def to_dict(self) -> dict[str, Any]:
        """A copy of the published fields (:class:`~gpudask.plan.published.PublishedPlan`)."""
        published = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr and f.name != "reasons"}
        return {**snapshot(published), "reasons": [r.to_dict() for r in self.reasons]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessPlan:
        """The inverse of :meth:`to_dict` (a worker process reads its plan from its parent's)."""
        fields = {k: v for k, v in data.items() if k not in ("reasons", "sections", "requests")}
        sections = {str(k): dict(v) for k, v in (data.get("sections") or {}).items()}
        requests = {str(o): {str(k): dict(v) for k, v in a.items()} for o, a in (data.get("requests") or {}).items()}
        return cls(**fields, sections=sections, requests=requests,
                   reasons=[Reason(**r) for r in data.get("reasons", [])])


def cpu_ranges(cpus: Iterable[int]) -> str:
    """[0,1,2,3,8] -> '0-3,8' (short enough for a reason line)."""
    out: list[list[int]] = []  # [first] or [first, last]
    for cpu in cpus:
        if out and out[-1][-1] == cpu - 1:
            out[-1][1:] = [cpu]
        else:
            out.append([cpu])
    return ",".join("-".join(map(str, r)) for r in out)

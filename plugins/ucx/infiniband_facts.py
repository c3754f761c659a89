"""The infiniband plugin's facts: the host's InfiniBand and RoCE ports, probed from
``/sys/class/infiniband`` (no verbs library; a test points ``$GPUDASK_SYSFS_ROOT`` at a fake tree)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import FactsSection, read_sysfs, sysfs_numa_node, sysfs_realpath, sysfs_root

if TYPE_CHECKING:
    from gpudask.pluginapi import Facts

SECTION = "infiniband"

_STR_OR_NULL = {"type": ["string", "null"], "x-accepts": "a string or null"}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "x-accepts": 'an object {"ports": [InfiniBand/RoCE ports]}',
    "required": ["ports"],
    "properties": {
        "ports": {
            "type": "array",
            "x-accepts": "a list of ports (from /sys/class/infiniband)",
            "items": {
                "type": "object",
                "x-accepts": "an object",
                "required": ["name", "port", "state", "link_layer", "pci_path", "numa_node", "netdev"],
                "properties": {
                    "name": {"type": "string", "x-accepts": "a string", "description": "mlx5_0"},
                    "port": {"type": "integer", "x-accepts": "an integer", "description": "Port number (1-based)."},
                    "state": {"type": "string", "x-accepts": "a string", "description": "ACTIVE, DOWN, ..."},
                    "link_layer": {"type": "string", "x-accepts": "a string",
                                   "description": "InfiniBand or Ethernet (RoCE)."},
                    "pci_path": _STR_OR_NULL,
                    "numa_node": {"type": ["integer", "null"], "x-accepts": "an integer or null"},
                    "netdev": dict(_STR_OR_NULL, description="The port's IP interface (ib0)."),
                },
            },
        },
    },
}


@dataclass(frozen=True)
class Port:

    name: str
    port: int
    state: str
    link_layer: str
    pci_path: str | None
    numa_node: int | None
    netdev: str | None

    @property
    def is_infiniband(self) -> bool:
        # DOWN ports and RoCE (link layer Ethernet) are not InfiniBand for UCX's rc.
        return self.state == "ACTIVE" and self.link_layer == "InfiniBand"


def _port(data: Mapping[str, Any]) -> Port:
    return Port(**{f.name: data[f.name] for f in fields(Port)})


def ports(facts: Facts) -> list[Port]:
    section = facts.section(SECTION)
    return [_port(p) for p in (section or {}).get("ports", [])]


def active_ports(facts: Facts) -> list[Port]:
    """The ports UCX's rc can use (ACTIVE, link layer InfiniBand), by name and port."""
    return sorted((p for p in ports(facts) if p.is_infiniband), key=lambda p: (p.name, p.port))


# -- the probe: sysfs ----------------------------------------------------------------------
def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def probe_ports() -> list[Port]:
    base = os.path.join(sysfs_root(), "class", "infiniband")
    result = []
    for name in _listdir(base):
        dev = os.path.join(base, name)
        device = os.path.join(dev, "device")
        nets = _listdir(os.path.join(device, "net"))
        for number in sorted((p for p in _listdir(os.path.join(dev, "ports")) if p.isdigit()), key=int):
            pdir = os.path.join(dev, "ports", number)
            state = (read_sysfs(os.path.join(pdir, "state")) or "").split(":")[-1].strip()  # "4: ACTIVE"
            # A two-port card has one netdev per port; dev_port tells them apart.
            netdev = next((n for n in nets if read_sysfs(os.path.join(device, "net", n, "dev_port")) == str(int(number) - 1)),
                          None)
            result.append(Port(
                name=name,
                port=int(number),
                state=state or "UNKNOWN",
                link_layer=read_sysfs(os.path.join(pdir, "link_layer")) or "UNKNOWN",
                pci_path=sysfs_realpath(device),
                numa_node=sysfs_numa_node(os.path.join(device, "numa_node")),
                netdev=netdev or (nets[0] if nets else None),
            ))
    return result


def probe(facts: Facts) -> dict[str, Any]:
    return {"ports": [asdict(p) for p in probe_ports()]}


def summary(value: Any) -> str | None:
    if value is None:
        return None
    active = sum(_port(p).is_infiniband for p in value["ports"])
    return f"{active} active InfiniBand port(s)"


SECTIONS = [FactsSection(SECTION, SCHEMA, probe, summary=summary)]

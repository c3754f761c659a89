"""UCX over InfiniBand: rc, rdmacm, and for each GPU process the port nearest its GPU (docs/transports.md).

*Nearest*: the longest common leading run of sysfs PCI path components (same PCIe switch beats
same root port beats same root complex), then the same NUMA node.  Among equally near ports the
GPUs are spread, so that no port serves two GPUs while an equally near port serves none."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import (FactsSection, Option, hookimpl, parse_optional_bool, parse_ucx_tls, process_gpu,
                               tls_enables)

from . import infiniband_facts
from .infiniband_facts import Port, active_ports
from .infiniband_facts import ports as all_ports
from .rules import (EXPLICIT, INTERFACE, UCX_AUTO, decide, leave_out_on_described_host, mode, mode_why,
                    parse_name_or_list, pick, set_flag, set_tls_flag, user_tls)
from .ucx_info import supports as ucx_supports

if TYPE_CHECKING:
    from gpudask.pluginapi import GPU, Facts, PlanContext, ProcessPlan

name = "infiniband"
priority = 70

INFINIBAND = "gpudask.transport.infiniband"
RDMACM = "gpudask.transport.rdmacm"
NET_DEVICES = "gpudask.transport.net-devices"


# UCX_TLS names of InfiniBand transports (and rdmacm, its connection manager), and what goes with them
IB_TLS = frozenset({"ib", "rc", "rc_v", "rc_x", "rc_verbs", "rc_mlx5", "ud", "ud_v", "ud_x", "ud_verbs", "ud_mlx5",
                    "dc", "dc_x", "dc_mlx5", "rdmacm"})
IB_ENV = ("UCX_NET_DEVICES", "UCX_SOCKADDR_TLS_PRIORITY", "UCX_MAX_RNDV_RAILS", "UCX_MEMTYPE_REG_WHOLE_ALLOC_TYPES")


@hookimpl
def gpudask_context_init(ctx: PlanContext, plan: ProcessPlan) -> None:
    """A described InfiniBand host over UCX starts on a CPU: no InfiniBand transport, ports or rdmacm here."""
    leave_out_on_described_host(ctx, plan, "InfiniBand", IB_TLS, "ib", IB_ENV, ("infiniband", "rdmacm"))


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [
        Option(INFINIBAND, None, "rc in UCX_TLS (InfiniBand): null = auto (with an active InfiniBand port), true, "
               "false.", parse_optional_bool, "true, false or null (auto)",
               legacy=("distributed.comm.ucx.infiniband", "distributed-ucxx.infiniband"),
               dask_cuda_kwarg="enable_infiniband",
               dask_cuda_option="--enable-infiniband/--disable-infiniband", ucx_only=True),
        Option(RDMACM, None, "Connections over InfiniBand set up by the RDMA connection manager "
               "(UCX_SOCKADDR_TLS_PRIORITY): null = auto (with InfiniBand), true, false.", parse_optional_bool,
               "true, false or null (auto)", legacy=("distributed.comm.ucx.rdmacm", "distributed-ucxx.rdmacm"),
               dask_cuda_kwarg="enable_rdmacm",
               dask_cuda_option="--enable-rdmacm/--disable-rdmacm", ucx_only=True),
        Option(NET_DEVICES, None, "UCX_NET_DEVICES: null = auto (the InfiniBand port nearest each worker's GPU), a "
               "value for every process (mlx5_0:1), or a list (worker i takes item i mod length).",
               parse_name_or_list, "null, a UCX_NET_DEVICES value or a list of them",
               legacy=("distributed.comm.ucx.net-devices",)),
    ]


def _pci_components(path: str | None) -> list[str]:
    if not path:
        return []
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        if part.startswith("pci"):
            return parts[i:]
    return parts


def nearness(gpu: GPU, port: Port) -> tuple[int, int]:
    """(shared PCI path components, same NUMA node): larger is nearer, compared in that order."""
    shared = len(os.path.commonprefix([_pci_components(gpu.pci_path), _pci_components(port.pci_path)]))
    same_numa = int(gpu.numa_node is not None and gpu.numa_node == port.numa_node)
    return shared, same_numa


def _describe(gpu: GPU, port: Port) -> str:
    shared, same_numa = nearness(gpu, port)
    parts = _pci_components(gpu.pci_path)
    if shared:
        kind = ("PCI root complex", "PCIe root port", "PCIe switch")[min(shared, 3) - 1]
        return f"{port.name} shares the {kind} {parts[shared - 1]} with GPU {gpu.index}"
    known = gpu.pci_path and port.pci_path
    if same_numa:
        return f"{port.name} shares NUMA node {gpu.numa_node} with GPU {gpu.index}" + \
            ("" if known else " (PCI path unknown)")
    if known:
        return f"{port.name} is under another PCI root complex than GPU {gpu.index} (no active port is nearer)"
    return f"{port.name}: no PCIe or NUMA locality with GPU {gpu.index} is known (no active port is nearer)"


def port_label(port: Port) -> str:
    return f"{port.name}:{port.port}"


def nearest_ports(gpus: list[GPU], ports: list[Port]) -> dict[int, tuple[Port, str]]:
    load: dict[str, int] = {port_label(p): 0 for p in ports}
    out: dict[int, tuple[Port, str]] = {}
    for gpu in sorted(gpus, key=lambda g: g.index):
        best = max(nearness(gpu, p) for p in ports)
        tied = [p for p in ports if nearness(gpu, p) == best]  # in name order
        port = min(tied, key=lambda p: load[port_label(p)])
        why = _describe(gpu, port)
        if len(tied) > 1:
            why += (f"; equally near: {', '.join(port_label(p) for p in tied)}, spread so that no port serves two "
                    f"GPUs while an equally near one serves none (GPUs by index, ports by name)")
        load[port_label(port)] += 1
        out[gpu.index] = (port, why)
    return out


def _ignored(facts: Facts) -> str:
    out = []
    for d in sorted(all_ports(facts), key=lambda d: (d.name, d.port)):
        if d.state != "ACTIVE":
            out.append(f"{port_label(d)} is {d.state}")
        elif not d.is_infiniband:
            roce = " (RoCE)" if d.link_layer == "Ethernet" else ""
            out.append(f"{port_label(d)} has link layer {d.link_layer}{roce}")
    return "; ".join(out)


@hookimpl
def gpudask_facts_sections() -> list[FactsSection]:
    """The host's InfiniBand/RoCE ports (:mod:`.infiniband_facts`)."""
    return list(infiniband_facts.SECTIONS)


@hookimpl
def gpudask_select_transport(ctx: PlanContext, plan: ProcessPlan) -> None:
    facts = ctx.facts
    ports = active_ports(facts)
    net_devices = ctx.require(NET_DEVICES)
    explicit_devices = net_devices.value is not None
    if explicit_devices and ctx.uses_ucx and (plan.role == "worker" or not isinstance(net_devices.value, list)):
        plan.set_env("UCX_NET_DEVICES", pick(net_devices.value, plan.index),
                     f"{NET_DEVICES}={net_devices.value!r} (from {net_devices.source}): explicit settings win")
    if not ctx.uses_ucx:
        if ports and plan.role == "worker":
            plan.note("no UCX", f"protocol {ctx.protocol}: the InfiniBand port(s) "
                                f"{', '.join(map(port_label, ports))} are not used; --protocol ucx uses them")
        return
    ignored = _ignored(facts)
    if ignored:
        plan.note("not InfiniBand", f"{ignored}: only ACTIVE ports with link layer InfiniBand are used")
    if mode(ctx) == UCX_AUTO:
        if ports:
            plan.note("UCX chooses", f"{mode_why(ctx)}: UCX picks among the InfiniBand ports itself")
        return

    rc_ok = ucx_supports(facts, "rc") is not False
    if not ports:
        detect_why = "no active InfiniBand port"
    elif not rc_ok:
        detect_why = f"this host's UCX has no rc transport for {', '.join(map(port_label, ports))}"
    else:
        detect_why = f"active InfiniBand port(s) {', '.join(map(port_label, ports))}"
    ib_on, ib_why, ib_explicit = decide(ctx, INFINIBAND, "rc", bool(ports) and rc_ok, detect_why)
    if not ib_on:
        if ports or ib_explicit:
            plan.note("no UCX transport rc", ib_why)
        elif plan.role in ("worker", "client", "nanny"):
            plan.note("skipped", ib_why)
        set_tls_flag(plan, "infiniband", "rc", False)
        set_flag(plan, "rdmacm", False, "no InfiniBand: connections are set up over TCP")
        return
    if not ports:
        # rc allowed (UCX_TLS=all, ib, or gpudask.transport.infiniband=true) on a host without an
        # active port: UCX finds no InfiniBand device and uses the rest; rdmacm would leave it no
        # component to listen with ("cannot create listener", the nanny fails to start)
        if _names_infiniband(ctx):
            ctx.warn(f"{ib_why}; but this host has no active InfiniBand port: UCX uses its other transports")
        plan.note("no InfiniBand port", f"{ib_why}; no active InfiniBand port on this host, so UCX has no rc "
                                        "device and connections are set up over TCP (no rdmacm)")
        set_flag(plan, "infiniband", False, "no active InfiniBand port")
        _rdmacm(ctx, plan, has_port=False)
        return
    plan.add_ucx_transport("rc", ib_why)
    # rc first, as distributed-ucxx and dask-cuda write UCX_TLS (the order is cosmetic for UCX)
    plan.ucx_transports.insert(0, plan.ucx_transports.pop(plan.ucx_transports.index("rc")))
    set_tls_flag(plan, "infiniband", "rc", True)
    _rdmacm(ctx, plan, has_port=True)

    gpu, _ = process_gpu(ctx, plan)
    if gpu is None:
        if plan.role in ("nanny", "scheduler"):
            plan.note("all InfiniBand ports", f"the {plan.role} process moves no GPU data: UCX may use every "
                                              f"active port ({', '.join(map(port_label, ports))})")
        return
    if plan.role == "scheduler":
        plan.set_env("UCX_MEMTYPE_REG_WHOLE_ALLOC_TYPES", "cuda", "CUDA allocations the scheduler receives "
                                                                 "relayed frames into are registered whole, once")
        plan.note("all InfiniBand ports", "the scheduler talks to every worker and client: UCX may use every "
                                          f"active port ({', '.join(map(port_label, ports))})")
        return
    plan.set_env("UCX_MAX_RNDV_RAILS", "1", "a large GPU transfer uses one rail, the port chosen for this GPU, "
                                           "not every port of the host")
    plan.set_env("UCX_MEMTYPE_REG_WHOLE_ALLOC_TYPES", "cuda", "CUDA allocations (an RMM pool) are registered with "
                                                             "the InfiniBand card whole, once")
    if explicit_devices:
        if plan.role != "worker":
            return
        named = pick(net_devices.value, plan.index)
        port = next((p for p in ports if named in (port_label(p), p.name)), None)
        if port is None:
            plan.note("interface not set", f"{NET_DEVICES}={named!r} names no active InfiniBand port of this host")
            return
    else:
        port, near_why = nearest_ports(ctx.gpus, ports).get(gpu.index) or (None, "")
        if port is None:  # the GPU is not visible (cannot happen with gpu-pinning); leave UCX to choose
            return
        plan.set_env("UCX_NET_DEVICES", port_label(port), near_why)
    if plan.role != "worker":
        return
    interface = ctx.setting(INTERFACE)
    if interface is not None and interface.value is not None:
        return  # explicit settings win: the user's gpudask.transport.interface, no detection (applied by tcp)
    if not port.netdev:
        plan.note("interface not set", f"{port.name} has no network interface (netdev) in the facts")
    elif not facts.net_interfaces.get(port.netdev):
        plan.note("interface not set", f"{port.netdev}, the interface of {port.name}, has no IPv4 address")
    else:
        plan.set_interface(port.netdev, f"{port.netdev} is the IP interface of {port_label(port)}, the port "
                                        f"chosen for GPU {gpu.index}: listen there so rdmacm connects over it")


def _names_infiniband(ctx: PlanContext) -> bool:
    """Did the user ask for InfiniBand by name (UCX_TLS=rc/ib/dc..., the option), not allow everything (all, ^cuda)?"""
    tls = user_tls(ctx)
    if tls is not None:
        names = [n.lstrip("^") for n in parse_ucx_tls(tls)]
        return not tls.strip().startswith("^") and any(tls_enables(n, "rc") and n != "all" for n in names)
    s = ctx.setting(INFINIBAND)
    return s is not None and s.value is True


def _rdmacm(ctx: PlanContext, plan: ProcessPlan, has_port: bool) -> None:
    user = ctx.user_env.get("UCX_SOCKADDR_TLS_PRIORITY")
    s = ctx.setting(RDMACM)
    if not has_port:
        if user and "rdmacm" in user:
            ctx.warn(f"UCX_SOCKADDR_TLS_PRIORITY={user} set in the environment names rdmacm, but this host has no "
                     "active InfiniBand port: UCX may fail to listen ('cannot create listener'); unset it")
        elif s is not None and s.value is True:
            ctx.warn(f"{RDMACM}=True (from {s.source}) ignored: this host has no active InfiniBand port, and "
                     "rdmacm needs one (UCX could not listen)")
        set_flag(plan, "rdmacm", False, "no active InfiniBand port: connections are set up over TCP")
        return
    if user:
        on = "rdmacm" in user
        why = f"UCX_SOCKADDR_TLS_PRIORITY={user} set in the environment (explicit settings win)"
    elif s is not None and s.value is not None:
        on, why = s.value, f"{RDMACM}={s.value} (from {s.source}): explicit settings win"
    elif mode(ctx) == EXPLICIT:
        on, why = False, f"{mode_why(ctx)} and {RDMACM} not set"
    else:
        on, why = True, "InfiniBand: the RDMA connection manager sets up connections"
    if user:
        plan.set_env("UCX_SOCKADDR_TLS_PRIORITY", user, why)
    elif on:
        # rdmacm alone, as distributed-ucxx's own rdmacm flag and dask-cuda set it;
        # a user who needs UCX's tcp fallback for Ethernet-only peers exports the variable
        plan.set_env("UCX_SOCKADDR_TLS_PRIORITY", "rdmacm", why)
    else:
        plan.set_env("UCX_SOCKADDR_TLS_PRIORITY", "tcp", why + ": rdmacm turned off")
    set_flag(plan, "rdmacm", on, "rdmacm sets up connections" if on else "rdmacm turned off")

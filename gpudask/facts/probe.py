"""Probing this host: NVML, sysfs, ``importlib.metadata`` and ``ucx_info``
(:mod:`gpudask.facts.ucx_info`).

Never through a CUDA context, so probing is safe in the ``dask worker`` CLI process.
Only the standard library is imported at module level; pynvml and psutil are imported
inside the probe functions, and nothing that can create a CUDA context (cupy, numba,
rmm, ucxx, torch) is imported at all.
"""

from __future__ import annotations

import os
from typing import Any

from gpudask.facts.model import GPU, Facts, IBDevice
from gpudask.facts.ucx_info import probe_ucx_transports
from gpudask.facts.ucx_info import ucx_unused_variables as ucx_unused_variables

# Where sysfs lives; tests point $GPUDASK_SYSFS_ROOT at a fake tree instead.
SYSFS_ROOT = "/sys"

# packages[key] = version of the first of these distributions that is installed.
_PACKAGE_DISTS: dict[str, tuple[str, ...]] = {
    "dask": ("dask",),
    "distributed": ("distributed",),
    "cupy": ("cupy", "cupy-cuda12x", "cupy-cuda13x"),
    "rmm": ("rmm", "rmm-cu12", "rmm-cu13"),
    "cudf": ("cudf", "cudf-cu12", "cudf-cu13"),
    "dask-cudf": ("dask-cudf", "dask-cudf-cu12", "dask-cudf-cu13"),
    "ucxx": ("ucxx", "ucxx-cu12", "ucxx-cu13"),
    "distributed-ucxx": ("distributed-ucxx", "distributed-ucxx-cu12", "distributed-ucxx-cu13"),
    "numba": ("numba",),
    "nvidia-ml-py": ("nvidia-ml-py",),
    "dask-cuda": ("dask-cuda",),
    "torch": ("torch",),
    "gpudask": ("gpudask",),
}



def _sysfs_root() -> str:
    return os.environ.get("GPUDASK_SYSFS_ROOT") or SYSFS_ROOT


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _realpath(path: str) -> str | None:
    """Resolved sysfs path, written as under /sys even when the root is a fake tree."""
    if not os.path.exists(path):
        return None
    real = os.path.realpath(path)
    root = os.path.realpath(_sysfs_root())
    if root != "/sys" and real.startswith(root + os.sep):
        real = "/sys" + real[len(root):]
    return real


def _numa(path: str) -> int | None:
    text = _read(path)
    try:
        node = int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if node < 0 else node  # -1: the kernel does not know


def _parse_cpulist(text: str | None) -> list[int]:
    cpus: list[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            return []
    return cpus


def _norm_bus_id(bus_id: Any) -> str | None:
    """NVML's '00000000:19:00.0' -> sysfs's '0000:19:00.0'."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode(errors="replace")
    if not bus_id:
        return None
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return None
    try:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    except ValueError:
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _probe_ib_devices() -> list[IBDevice]:
    """InfiniBand/RoCE ports from /sys/class/infiniband (no verbs library needed)."""
    base = os.path.join(_sysfs_root(), "class", "infiniband")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    result = []
    for name in names:
        dev = os.path.join(base, name)
        device = os.path.join(dev, "device")
        try:
            nets = sorted(os.listdir(os.path.join(device, "net")))
        except OSError:
            nets = []
        try:
            ports = sorted((p for p in os.listdir(os.path.join(dev, "ports")) if p.isdigit()), key=int)
        except OSError:
            ports = []
        for port in ports:
            pdir = os.path.join(dev, "ports", port)
            state = (_read(os.path.join(pdir, "state")) or "").split(":")[-1].strip()  # "4: ACTIVE"
            # A two-port card has one netdev per port; dev_port tells them apart.
            netdev = next((n for n in nets if _read(os.path.join(device, "net", n, "dev_port")) == str(int(port) - 1)), None)
            result.append(
                IBDevice(
                    name=name,
                    port=int(port),
                    state=state or "UNKNOWN",
                    link_layer=_read(os.path.join(pdir, "link_layer")) or "UNKNOWN",
                    pci_path=_realpath(device),
                    numa_node=_numa(os.path.join(device, "numa_node")),
                    netdev=netdev or (nets[0] if nets else None),
                )
            )
    return result


def _probe_net_interfaces() -> dict[str, list[str]]:
    import socket

    import psutil  # a dependency of distributed; imported here to keep module import light

    return {
        name: [a.address for a in addrs if a.family == socket.AF_INET]
        for name, addrs in sorted(psutil.net_if_addrs().items())
    }


def _probe_packages() -> dict[str, str | None]:
    import importlib.metadata as md
    import platform

    def version(dists: tuple[str, ...]) -> str | None:
        for dist in dists:
            try:
                return md.version(dist)
            except md.PackageNotFoundError:
                pass
        return None

    packages: dict[str, str | None] = {"python": platform.python_version()}
    packages.update({key: version(dists) for key, dists in _PACKAGE_DISTS.items()})
    return packages




def _probe_nvml() -> tuple[str | None, int | None, list[GPU]]:
    """Driver, CUDA driver version and GPUs through NVML (never a CUDA context)."""
    try:
        import pynvml
    except ImportError:
        return None, None, []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no libnvidia-ml, driver/library mismatch: no GPU
        return None, None, []

    def nv(fn_name: str, *args: Any, default: Any = None) -> Any:
        # Unsupported calls (old GPU, VM, MIG, old binding) give the empty value.
        fn = getattr(pynvml, fn_name, None)
        if fn is None:
            return default
        try:
            return fn(*args)
        except pynvml.NVMLError:
            return default

    try:
        driver = nv("nvmlSystemGetDriverVersion")
        cuda = nv("nvmlSystemGetCudaDriverVersion")
        ncpu = os.cpu_count() or 1
        root = _sysfs_root()
        devices = []  # (GPU, handle)
        for i in range(nv("nvmlDeviceGetCount", default=0)):
            h = nv("nvmlDeviceGetHandleByIndex", i)
            if h is None:
                continue  # a lost or inaccessible GPU
            pci = nv("nvmlDeviceGetPciInfo", h)
            bus = _norm_bus_id(pci.busId) if pci is not None else None
            sysdev = os.path.join(root, "bus", "pci", "devices", bus) if bus else None
            mem = nv("nvmlDeviceGetMemoryInfo", h)
            cc = nv("nvmlDeviceGetCudaComputeCapability", h)

            numa = _numa(os.path.join(sysdev, "numa_node")) if sysdev else None
            if numa is None:
                numa = nv("nvmlDeviceGetNumaNodeId", h)
                numa = numa if isinstance(numa, int) and numa >= 0 else None

            mask = nv("nvmlDeviceGetCpuAffinity", h, (ncpu + 63) // 64)
            cpus = [w * 64 + b for w, word in enumerate(mask or []) for b in range(64) if int(word) >> b & 1]
            if not cpus and sysdev:
                cpus = _parse_cpulist(_read(os.path.join(sysdev, "local_cpulist")))

            devices.append(
                (
                    GPU(
                        index=i,
                        uuid=_text(nv("nvmlDeviceGetUUID", h, default="")),
                        name=_text(nv("nvmlDeviceGetName", h, default="")),
                        memory_total=int(mem.total) if mem is not None else 0,
                        compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
                        pci_bus_id=bus,
                        pci_path=_realpath(sysdev) if sysdev else None,
                        numa_node=numa,
                        cpu_affinity=cpus,
                        nvlink_peers=[],
                        mig=_probe_mig(pynvml, nv, h),
                        memory_free=int(mem.free) if getattr(mem, "free", None) is not None else None,
                    ),
                    h,
                )
            )
        _probe_nvlink(pynvml, nv, devices)
        return (_text(driver) if driver is not None else None), cuda, [g for g, _ in devices]
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _probe_mig(pynvml: Any, nv: Any, h: Any) -> dict[str, Any]:
    mode = nv("nvmlDeviceGetMigMode", h)
    enabled = bool(mode) and mode[0] == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1)
    instances = []
    if enabled:
        for j in range(nv("nvmlDeviceGetMaxMigDeviceCount", h, default=0)):
            mh = nv("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
            if mh is None:
                continue  # an empty slot
            mem = nv("nvmlDeviceGetMemoryInfo", mh)
            instances.append(
                {
                    "uuid": _text(nv("nvmlDeviceGetUUID", mh, default="")),
                    "memory_total": int(mem.total) if mem is not None else 0,
                    "gpu_instance_id": nv("nvmlDeviceGetGpuInstanceId", mh),
                    "compute_instance_id": nv("nvmlDeviceGetComputeInstanceId", mh),
                }
            )
    return {"enabled": enabled, "instances": instances}


def _probe_nvlink(pynvml: Any, nv: Any, devices: list[tuple[GPU, Any]]) -> None:
    """Fill nvlink_peers: direct GPU links, plus everyone on the same NVSwitch fabric."""
    by_bus: dict[str | None, int] = {g.pci_bus_id: g.index for g, _ in devices if g.pci_bus_id}
    gpu_t = getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)
    switch_t = getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
    npu_t = getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_IBMNPU", 1)
    enabled = getattr(pynvml, "NVML_FEATURE_ENABLED", 1)
    on_switch: set[int] = set()
    direct: dict[int, set[int]] = {}
    for gpu, h in devices:
        peers = direct.setdefault(gpu.index, set())
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            if nv("nvmlDeviceGetNvLinkState", h, link) != enabled:
                continue
            kind = nv("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            if kind == switch_t:
                on_switch.add(gpu.index)
                continue
            if kind == npu_t:
                continue  # NVLink to a POWER CPU, not to a GPU
            pci = nv("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            remote = by_bus.get(_norm_bus_id(pci.busId) if pci is not None else None)
            if remote is not None:
                peers.add(remote)
            elif kind != gpu_t:
                on_switch.add(gpu.index)  # type unknown and not one of our GPUs: a switch
    for gpu, _ in devices:
        peers = direct[gpu.index] | (on_switch if gpu.index in on_switch else set())
        gpu.nvlink_peers = sorted(peers - {gpu.index})


def probe_facts() -> Facts:
    """Probe this host.  Never creates a CUDA context."""
    import socket

    driver, cuda, gpus = _probe_nvml()
    return Facts(
        hostname=socket.gethostname(),
        cpu_count=os.cpu_count() or 1,
        driver_version=driver,
        cuda_driver_version=cuda,
        gpus=gpus,
        ib_devices=_probe_ib_devices(),
        net_interfaces=_probe_net_interfaces(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        ucx_transports=probe_ucx_transports(),
        packages=_probe_packages(),
        origin="probed",
    )

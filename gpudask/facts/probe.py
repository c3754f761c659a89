"""Probing this host's core facts through NVML, sysfs and ``importlib.metadata``, never a CUDA
context (safe in the ``dask worker`` CLI process); pynvml and psutil are imported inside.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpudask.facts.model import GPU, Facts

# packages[key] = version of the first of these distributions installed; the plugins add theirs
CORE_PACKAGES: dict[str, tuple[str, ...]] = {name: (name,) for name in ("dask", "distributed", "nvidia-ml-py",
                                                                          "gpudask")}


def sysfs_root() -> str:
    """Where sysfs lives: /sys, or the fake tree $GPUDASK_SYSFS_ROOT names (tests)."""
    return os.environ.get("GPUDASK_SYSFS_ROOT") or "/sys"


def read_sysfs(path: str) -> str | None:
    """A sysfs file's text, stripped; None when it cannot be read (a probe says "unknown")."""
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def sysfs_realpath(path: str) -> str | None:
    """Resolved sysfs path, written as under /sys even when the root is a fake tree."""
    if not os.path.exists(path):
        return None
    real = os.path.realpath(path)
    root = os.path.realpath(sysfs_root())
    if root != "/sys" and real.startswith(root + os.sep):
        real = "/sys" + real[len(root):]
    return real


def sysfs_numa_node(path: str) -> int | None:
    """A device's ``numa_node`` file: the node, or None (unreadable, or -1: the kernel does not know)."""
    text = read_sysfs(path)
    try:
        node = int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if node < 0 else node


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


def norm_bus_id(bus_id: Any) -> str | None:
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


def _probe_net_interfaces() -> dict[str, list[str]]:
    import socket

    import psutil  # a dependency of distributed; imported here to keep module import light

    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in sorted(psutil.net_if_addrs().items())}


def _dist_info_versions() -> tuple[dict[str, str], bool]:
    """Installed versions by normalized name, from the ``NAME-VERSION.dist-info`` directories on
    ``sys.path`` (the first wins, as for importlib.metadata), and whether that is complete (no
    ``.egg-info``, zip or egg: else importlib.metadata is asked for the rest).  Not
    ``importlib.metadata.version``: 0.4-0.8 ms a package, a dozen in every planning process."""
    import sys

    found: dict[str, str] = {}
    complete = True
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except FileNotFoundError:
            continue  # a path hook's name, a zip that is not there
        except OSError:
            complete = False  # a zip or an egg on the path
            continue
        for name in names:
            stem = name[:-len(".dist-info")] if name.endswith(".dist-info") else ""
            if stem.count("-") == 1:
                dist, version = stem.split("-")
                found.setdefault(_normalized(dist), version)
            elif name.endswith(".egg-info"):
                complete = False
    return found, complete


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def _probe_packages(declared: Mapping[str, Sequence[str]] | None = None) -> dict[str, str | None]:
    import importlib.metadata as md
    import platform

    listed, complete = _dist_info_versions()

    def version(dists: Sequence[str]) -> str | None:
        for dist in dists:
            if _normalized(dist) in listed:
                return listed[_normalized(dist)]
            if complete:
                continue
            try:
                return md.version(dist)
            except md.PackageNotFoundError:
                pass
        return None

    wanted = {**CORE_PACKAGES, **{k: tuple(d) for k, d in (declared or {}).items() if k not in CORE_PACKAGES}}
    return {"python": platform.python_version(), **{key: version(dists) for key, dists in wanted.items()}}


class NVMLSession:
    """NVML, open for one probe.  ``call(name, *args, default=None)``: an NVML call, or
    ``default`` where the GPU, driver or binding does not support it.  ``module``: pynvml."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def call(self, fn_name: str, *args: Any, default: Any = None) -> Any:
        fn = getattr(self.module, fn_name, None)
        if fn is None:
            return default
        try:
            return fn(*args)
        except self.module.NVMLError:
            return default


@contextlib.contextmanager
def nvml_session() -> Iterator[NVMLSession | None]:
    """NVML opened for a probe and shut down after it (never a CUDA context); None where
    there is no NVML: no nvidia-ml-py, no driver, no libnvidia-ml, a driver/library mismatch."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - whatever the binding raises, there is no NVML here
        yield None
        return
    try:
        yield NVMLSession(pynvml)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - nothing to do about a failed shutdown
            pass


def _probe_nvml() -> tuple[str | None, int | None, list[GPU]]:
    """Driver, CUDA driver version and GPUs through NVML (never a CUDA context)."""
    with nvml_session() as session:
        if session is None:
            return None, None, []
        nv = session.call
        driver, cuda = nv("nvmlSystemGetDriverVersion"), nv("nvmlSystemGetCudaDriverVersion")
        ncpu = os.cpu_count() or 1
        gpus = []
        for i in range(nv("nvmlDeviceGetCount", default=0)):
            h = nv("nvmlDeviceGetHandleByIndex", i)
            if h is None:
                continue  # a lost or inaccessible GPU
            pci = nv("nvmlDeviceGetPciInfo", h)
            bus = norm_bus_id(pci.busId) if pci is not None else None
            sysdev = os.path.join(sysfs_root(), "bus", "pci", "devices", bus) if bus else None
            mem = nv("nvmlDeviceGetMemoryInfo", h)
            cc = nv("nvmlDeviceGetCudaComputeCapability", h)

            numa = sysfs_numa_node(os.path.join(sysdev, "numa_node")) if sysdev else None
            if numa is None:
                numa = nv("nvmlDeviceGetNumaNodeId", h)
                numa = numa if isinstance(numa, int) and numa >= 0 else None

            mask = nv("nvmlDeviceGetCpuAffinity", h, (ncpu + 63) // 64)
            cpus = [w * 64 + b for w, word in enumerate(mask or []) for b in range(64) if int(word) >> b & 1]
            if not cpus and sysdev:
                cpus = _parse_cpulist(read_sysfs(os.path.join(sysdev, "local_cpulist")))

            gpus.append(GPU(
                index=i,
                uuid=_text(nv("nvmlDeviceGetUUID", h, default="")),
                name=_text(nv("nvmlDeviceGetName", h, default="")),
                memory_total=int(mem.total) if mem is not None else 0,
                compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
                pci_bus_id=bus,
                pci_path=sysfs_realpath(sysdev) if sysdev else None,
                numa_node=numa,
                cpu_affinity=cpus,
                mig=_probe_mig(session, h),
            ))
        return (_text(driver) if driver is not None else None), cuda, gpus


def _probe_mig(session: NVMLSession, h: Any) -> dict[str, Any]:
    nv = session.call
    mode = nv("nvmlDeviceGetMigMode", h)
    enabled = bool(mode) and mode[0] == getattr(session.module, "NVML_DEVICE_MIG_ENABLE", 1)
    instances = []
    if enabled:
        for j in range(nv("nvmlDeviceGetMaxMigDeviceCount", h, default=0)):
            mh = nv("nvmlDeviceGetMigDeviceHandleByIndex", h, j)
            if mh is None:
                continue  # an empty slot
            mem = nv("nvmlDeviceGetMemoryInfo", mh)
            instances.append({"uuid": _text(nv("nvmlDeviceGetUUID", mh, default="")),
                              "memory_total": int(mem.total) if mem is not None else 0,
                              "gpu_instance_id": nv("nvmlDeviceGetGpuInstanceId", mh),
                              "compute_instance_id": nv("nvmlDeviceGetComputeInstanceId", mh)})
    return {"enabled": enabled, "instances": instances}


def probe_facts(packages: Mapping[str, Sequence[str]] | None = None) -> Facts:
    """Probe this host (never a CUDA context).  ``packages``: the plugins' ``{key: distribution
    names}`` (the first installed one's version), beside :data:`CORE_PACKAGES`."""
    import socket

    driver, cuda, gpus = _probe_nvml()
    return Facts(
        hostname=socket.gethostname(),
        cpu_count=os.cpu_count() or 1,
        driver_version=driver,
        cuda_driver_version=cuda,
        gpus=gpus,
        net_interfaces=_probe_net_interfaces(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        packages=_probe_packages(packages),
        origin="probed",
    )

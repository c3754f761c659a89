"""Facts: what this host is (DESIGN.md §2-3).

Facts come from one of three places, chosen by :func:`get_facts`:

* a facts file (``--facts`` / ``$GPUDASK_FACTS``): a *described* host, schema 1;
* ``$GPUDASK_PROBED_FACTS``: the JSON of a probe a parent process already made, so
  nannies and workers do not probe again;
* :func:`probe_facts`: NVML, sysfs, ``importlib.metadata`` and ``ucx_info``.

Importing this module must stay cheap and must never touch CUDA: it runs in every
``dask worker --preload gpudask`` CLI process before UCX is set up (DESIGN.md §1).
So only the standard library is imported here; pynvml and psutil are imported inside
the probe functions, and nothing that can create a CUDA context (cupy, numba, rmm,
ucxx, torch) is imported at all.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import pathlib
import re
from dataclasses import dataclass, replace
from typing import Any

from gpudask.errors import FactsError

SCHEMA_VERSION = 1

# Where sysfs lives; tests point $GPUDASK_SYSFS_ROOT at a fake tree instead.
SYSFS_ROOT = "/sys"

# How long `ucx_info -d` may take before we give up on listing UCX transports.
UCX_INFO_TIMEOUT_S = 10

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
# Any of these installed means UCX is available to distributed-ucxx.
_UCX_DISTS = ("libucx", "libucx-cu12", "libucx-cu13", "ucxx", "ucxx-cu12", "ucxx-cu13")


# --------------------------------------------------------------------------- model


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
    nvlink_peers: list[int]
    mig: dict  # {"enabled": bool, "instances": [{"uuid": "MIG-...", "memory_total": int, ...}]}


def _gpu_dict(gpu: GPU) -> dict:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "memory_total": gpu.memory_total,
        "compute_capability": list(gpu.compute_capability) if gpu.compute_capability else None,
        "pci_bus_id": gpu.pci_bus_id,
        "pci_path": gpu.pci_path,
        "numa_node": gpu.numa_node,
        "cpu_affinity": list(gpu.cpu_affinity),
        "nvlink_peers": list(gpu.nvlink_peers),
        "mig": copy.deepcopy(gpu.mig),
    }


@dataclass
class IBDevice:
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


def _ib_dict(dev: IBDevice) -> dict:
    return {
        "name": dev.name,
        "port": dev.port,
        "state": dev.state,
        "link_layer": dev.link_layer,
        "pci_path": dev.pci_path,
        "numa_node": dev.numa_node,
        "netdev": dev.netdev,
    }


@dataclass
class Facts:
    """One host.  Treat as read-only: :func:`get_facts` hands out cached instances."""

    hostname: str
    cpu_count: int
    driver_version: str | None
    cuda_driver_version: int | None
    gpus: list[GPU]
    ib_devices: list[IBDevice]
    net_interfaces: dict[str, list[str]]
    cuda_visible_devices: str | None
    ucx_transports: list[str] | None
    packages: dict[str, str | None]
    origin: str  # "probed", or the path of the facts file
    schema: int = SCHEMA_VERSION

    @property
    def described(self) -> bool:
        return self.origin != "probed"

    @property
    def cuda_major(self) -> int | None:
        return None if self.cuda_driver_version is None else self.cuda_driver_version // 1000

    def to_dict(self) -> dict:
        return {
            "schema": self.schema,
            "hostname": self.hostname,
            "cpu_count": self.cpu_count,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "gpus": [_gpu_dict(g) for g in self.gpus],
            "ib_devices": [_ib_dict(d) for d in self.ib_devices],
            "net_interfaces": {k: list(v) for k, v in self.net_interfaces.items()},
            "cuda_visible_devices": self.cuda_visible_devices,
            "ucx_transports": None if self.ucx_transports is None else list(self.ucx_transports),
            "packages": dict(self.packages),
        }

    def gpu_by_index(self, index: int) -> GPU:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise FactsError(f"{self._where()}: no GPU with index {index} (GPUs: {self._known()})")

    def visible_gpus(self) -> list[GPU]:
        """The GPUs CUDA would show this process, in CUDA's order."""
        return _resolve_visible(self, self.cuda_visible_devices, self._cvd_key())

    # Error messages name the file, or say the host was probed.
    def _where(self) -> str:
        return self.origin if self.described else "probed host"

    def _cvd_key(self) -> str:
        return "key 'cuda_visible_devices'" if self.described else "CUDA_VISIBLE_DEVICES"

    def _known(self) -> str:
        return ", ".join(str(g.index) for g in sorted(self.gpus, key=lambda g: g.index)) or "none"


def _resolve_visible(facts: Facts, value: str | None, key: str) -> list[GPU]:
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
    where = facts._where()
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
        found = [
            g
            for g in facts.gpus
            if any(str(i.get("uuid", "")).lower().startswith(entry.lower()) for i in g.mig.get("instances", []))
        ]
    if len(found) == 1:
        return found[0]
    what = "is ambiguous" if found else "names no GPU"
    raise FactsError(
        f"{where}: {key} entry {entry!r} {what} "
        f"(accepted: an index among {facts._known()}, a 'GPU-<uuid>' or a 'MIG-<uuid>' of this host, "
        f"or '' for none)"
    )


# --------------------------------------------------------------------- validation


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


class _Reader:
    """Reads typed values out of parsed JSON, raising one-line FactsErrors."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, key: str, expected: str, value: Any) -> FactsError:
        return FactsError(f"{self.where}: key {key!r} must be {expected}, got {_show(value)}")

    def get(self, obj: dict, key: str, path: str, expected: str) -> Any:
        if key not in obj:
            raise FactsError(f"{self.where}: key {path!r} is missing (expected {expected})")
        return obj[key]

    def integer(self, obj, key, path, nullable=False):
        v = self.get(obj, key, path, "an integer" + (" or null" if nullable else ""))
        if v is None and nullable:
            return None
        if isinstance(v, bool) or not isinstance(v, int):  # bool is an int in Python, not in JSON
            raise self.fail(path, "an integer" + (" or null" if nullable else ""), v)
        return v

    def string(self, obj, key, path, nullable=False):
        v = self.get(obj, key, path, "a string" + (" or null" if nullable else ""))
        if v is None and nullable:
            return None
        if not isinstance(v, str):
            raise self.fail(path, "a string" + (" or null" if nullable else ""), v)
        return v

    def obj(self, value, path) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path, "an object", value)
        return value

    def array(self, obj, key, path, nullable=False) -> list | None:
        v = self.get(obj, key, path, "a list" + (" or null" if nullable else ""))
        if v is None and nullable:
            return None
        if not isinstance(v, list):
            raise self.fail(path, "a list" + (" or null" if nullable else ""), v)
        return v

    def int_list(self, obj, key, path) -> list[int]:
        items = self.array(obj, key, path)
        for i, x in enumerate(items):
            if isinstance(x, bool) or not isinstance(x, int):
                raise self.fail(f"{path}[{i}]", "an integer", x)
        return list(items)

    def str_list(self, obj, key, path, nullable=False) -> list[str] | None:
        items = self.array(obj, key, path, nullable)
        if items is None:
            return None
        for i, x in enumerate(items):
            if not isinstance(x, str):
                raise self.fail(f"{path}[{i}]", "a string", x)
        return list(items)


def _read_gpu(r: _Reader, data: Any, p: str) -> GPU:
    d = r.obj(data, p)
    cc = r.get(d, "compute_capability", f"{p}.compute_capability", "[major, minor] or null")
    if cc is not None:
        if not (isinstance(cc, list) and len(cc) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in cc)):
            raise r.fail(f"{p}.compute_capability", "[major, minor] (two integers) or null", cc)
        cc = (cc[0], cc[1])
    mig = r.obj(r.get(d, "mig", f"{p}.mig", 'an object {"enabled": bool, "instances": [...]}'), f"{p}.mig")
    enabled = r.get(mig, "enabled", f"{p}.mig.enabled", "true or false")
    if not isinstance(enabled, bool):
        raise r.fail(f"{p}.mig.enabled", "true or false", enabled)
    instances = []
    for i, inst in enumerate(r.array(mig, "instances", f"{p}.mig.instances")):
        ip = f"{p}.mig.instances[{i}]"
        inst = r.obj(inst, ip)
        r.string(inst, "uuid", f"{ip}.uuid")
        r.integer(inst, "memory_total", f"{ip}.memory_total")
        instances.append(copy.deepcopy(inst))  # extra instance keys (ids) are kept
    return GPU(
        index=r.integer(d, "index", f"{p}.index"),
        uuid=r.string(d, "uuid", f"{p}.uuid"),
        name=r.string(d, "name", f"{p}.name"),
        memory_total=r.integer(d, "memory_total", f"{p}.memory_total"),
        compute_capability=cc,
        pci_bus_id=r.string(d, "pci_bus_id", f"{p}.pci_bus_id", nullable=True),
        pci_path=r.string(d, "pci_path", f"{p}.pci_path", nullable=True),
        numa_node=r.integer(d, "numa_node", f"{p}.numa_node", nullable=True),
        cpu_affinity=r.int_list(d, "cpu_affinity", f"{p}.cpu_affinity"),
        nvlink_peers=r.int_list(d, "nvlink_peers", f"{p}.nvlink_peers"),
        mig={"enabled": enabled, "instances": instances},
    )


def _read_ib(r: _Reader, data: Any, p: str) -> IBDevice:
    d = r.obj(data, p)
    return IBDevice(
        name=r.string(d, "name", f"{p}.name"),
        port=r.integer(d, "port", f"{p}.port"),
        state=r.string(d, "state", f"{p}.state"),
        link_layer=r.string(d, "link_layer", f"{p}.link_layer"),
        pci_path=r.string(d, "pci_path", f"{p}.pci_path", nullable=True),
        numa_node=r.integer(d, "numa_node", f"{p}.numa_node", nullable=True),
        netdev=r.string(d, "netdev", f"{p}.netdev", nullable=True),
    )


def _from_dict(data: Any, origin: str, where: str, check_visible: bool) -> Facts:
    r = _Reader(where)
    if not isinstance(data, dict):
        raise FactsError(f"{where}: must hold a JSON object (schema {SCHEMA_VERSION}), got {_show(data)}")
    schema = r.get(data, "schema", "schema", f"the integer {SCHEMA_VERSION}")
    if schema != SCHEMA_VERSION or isinstance(schema, bool):
        raise r.fail("schema", f"{SCHEMA_VERSION} (the only facts schema this gpudask reads)", schema)

    gpus = [_read_gpu(r, g, f"gpus[{i}]") for i, g in enumerate(r.array(data, "gpus", "gpus"))]
    indices = [g.index for g in gpus]
    for i, g in enumerate(gpus):
        if g.index in indices[:i]:
            raise r.fail(f"gpus[{i}].index", "unique among the GPUs", g.index)
    for i, g in enumerate(gpus):
        for j, peer in enumerate(g.nvlink_peers):
            if peer not in indices or peer == g.index:
                raise r.fail(f"gpus[{i}].nvlink_peers[{j}]", f"the index of another GPU ({', '.join(map(str, indices))})", peer)

    ibs = [_read_ib(r, d, f"ib_devices[{i}]") for i, d in enumerate(r.array(data, "ib_devices", "ib_devices"))]

    nets = r.obj(r.get(data, "net_interfaces", "net_interfaces", "an object {interface: [IPv4 addresses]}"), "net_interfaces")
    net_interfaces = {name: r.str_list(nets, name, f"net_interfaces.{name}") for name in nets}

    packages = r.obj(r.get(data, "packages", "packages", "an object {package: version or null}"), "packages")
    for name in packages:
        r.string(packages, name, f"packages.{name}", nullable=True)

    facts = Facts(
        hostname=r.string(data, "hostname", "hostname"),
        cpu_count=r.integer(data, "cpu_count", "cpu_count"),
        driver_version=r.string(data, "driver_version", "driver_version", nullable=True),
        cuda_driver_version=r.integer(data, "cuda_driver_version", "cuda_driver_version", nullable=True),
        gpus=gpus,
        ib_devices=ibs,
        net_interfaces=net_interfaces,
        # The one key that may be left out: unset is its natural state.
        cuda_visible_devices=r.string({"cuda_visible_devices": None, **data}, "cuda_visible_devices", "cuda_visible_devices", nullable=True),
        ucx_transports=r.str_list(data, "ucx_transports", "ucx_transports", nullable=True),
        packages=dict(packages),
        origin=origin,
    )
    if check_visible:
        # A described host with a wrong CUDA_VISIBLE_DEVICES is a broken file: say so now.
        _resolve_visible(facts, facts.cuda_visible_devices, "key 'cuda_visible_devices'")
    return facts


def facts_from_dict(data: dict, origin: str) -> Facts:
    """Validate parsed schema-1 JSON; errors name ``origin`` and the key."""
    return _from_dict(data, origin, where=origin, check_visible=origin != "probed")


def load_facts(path) -> Facts:
    """Read a facts file (a described host)."""
    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise FactsError(f"{where}: cannot read facts file: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FactsError(f"{where}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    return _from_dict(data, where, where, check_visible=True)


# ------------------------------------------------------------------------- probing


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

    def version(dists):
        for dist in dists:
            try:
                return md.version(dist)
            except md.PackageNotFoundError:
                pass
        return None

    packages: dict[str, str | None] = {"python": platform.python_version()}
    packages.update({key: version(dists) for key, dists in _PACKAGE_DISTS.items()})
    return packages


def _ucx_info_commands() -> list[tuple[str, dict]]:
    """Where `ucx_info` may be: the libucx wheel first (what ucxx loads), then PATH."""
    import importlib.util
    import shutil

    found = []
    try:
        # find_spec on a top-level name locates the package without importing it.
        spec = importlib.util.find_spec("libucx")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        pkg = os.path.dirname(spec.origin)
        exe = os.path.join(pkg, "bin", "ucx_info")
        if os.access(exe, os.X_OK):
            # The wheel's binaries carry a build-tree RUNPATH; point them at the wheel's libs.
            lib = os.path.join(pkg, "lib")
            ld = os.environ.get("LD_LIBRARY_PATH")
            found.append((exe, {"LD_LIBRARY_PATH": lib + (os.pathsep + ld if ld else "")}))
    system = shutil.which("ucx_info")
    if system:
        found.append((system, {}))
    if os.environ.get("RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY", "false").lower() != "false":
        found.reverse()  # ucxx then loads the system UCX too
    return found


def _probe_ucx_transports() -> list[str] | None:
    """UCX transports `ucx_info -d` lists, or None when UCX is missing or fails."""
    import importlib.metadata as md

    def installed(dist):
        try:
            md.version(dist)
            return True
        except md.PackageNotFoundError:
            return False

    if not any(installed(d) for d in _UCX_DISTS):
        return None
    cache = _ucx_cache_path()
    if cache is not None:
        try:
            return json.loads(cache.read_text())
        except (OSError, ValueError):
            pass
    transports = _run_ucx_info()
    if cache is not None and transports is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(transports))
        except OSError:
            pass
    return transports


def _ucx_cache_path() -> pathlib.Path | None:
    """Where this boot's `ucx_info -d` answer is kept.

    `ucx_info` costs ~0.4 s, paid by every `dask worker` start otherwise.  Its answer
    changes only with the UCX build or the hardware, so the key is the boot id (new
    devices mean a reboot or a driver reload) and the UCX library's identity.
    """
    import hashlib
    import tempfile

    try:
        boot_id = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    ident = [boot_id]
    for exe, _env in _ucx_info_commands():
        try:
            st = os.stat(exe)
        except OSError:
            continue
        ident.append(f"{os.path.realpath(exe)}:{st.st_mtime_ns}:{st.st_size}")
    key = hashlib.sha1("|".join(ident).encode()).hexdigest()[:16]
    return pathlib.Path(tempfile.gettempdir()) / f"gpudask-{os.getuid()}" / f"ucx-transports-{key}.json"


def _run_ucx_info() -> list[str] | None:
    import subprocess

    for exe, extra_env in _ucx_info_commands():
        env = dict(os.environ, **extra_env)
        # We want what the host can do, not what this process selected or sees.
        for var in ("UCX_TLS", "UCX_NET_DEVICES", "CUDA_VISIBLE_DEVICES"):
            env.pop(var, None)
        try:
            out = subprocess.run(
                [exe, "-d"], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=UCX_INFO_TIMEOUT_S
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode != 0:
            continue
        transports = sorted(set(re.findall(r"^#\s*Transport:\s*(\S+)", out.stdout, re.MULTILINE)))
        if transports:
            return transports
    return None


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

    def nv(fn_name: str, *args, default=None):
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


def _probe_mig(pynvml, nv, h) -> dict:
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


def _probe_nvlink(pynvml, nv, devices) -> None:
    """Fill nvlink_peers: direct GPU links, plus everyone on the same NVSwitch fabric."""
    by_bus = {g.pci_bus_id: g.index for g, _ in devices if g.pci_bus_id}
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
        ucx_transports=_probe_ucx_transports(),
        packages=_probe_packages(),
        origin="probed",
    )


# ----------------------------------------------------------------------- selection


@functools.lru_cache(maxsize=None)
def _cached_file(path: str) -> Facts:
    return load_facts(path)


@functools.lru_cache(maxsize=None)
def _cached_env(text: str) -> Facts:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FactsError(f"$GPUDASK_PROBED_FACTS: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    return _from_dict(data, "probed", "$GPUDASK_PROBED_FACTS", check_visible=False)


@functools.lru_cache(maxsize=None)
def _cached_probe() -> Facts:
    return probe_facts()


def get_facts(path: str | None = None) -> Facts:
    """Facts for this process: ``path`` > $GPUDASK_FACTS > $GPUDASK_PROBED_FACTS > a probe.

    Cached per process.  A described file is taken as it is, its
    ``cuda_visible_devices`` included.  Probed facts (fresh or from the parent's
    $GPUDASK_PROBED_FACTS) take ``cuda_visible_devices`` from this process's
    environment, since a nanny gives each worker its own.
    """
    path = path or os.environ.get("GPUDASK_FACTS") or None
    if path:
        return _cached_file(os.fspath(path))
    text = os.environ.get("GPUDASK_PROBED_FACTS")
    facts = _cached_env(text) if text else _cached_probe()
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if facts.cuda_visible_devices != cvd:
        facts = replace(facts, cuda_visible_devices=cvd)
    return facts


def clear_cache() -> None:
    _cached_file.cache_clear()
    _cached_env.cache_clear()
    _cached_probe.cache_clear()

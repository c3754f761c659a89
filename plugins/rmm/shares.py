"""Who shares a GPU and who holds its memory, and the rmm facts section (``ctx.facts.section("rmm")``,
docs/facts.md), from the private state directory and NVML only (never a CUDA context): this runs
in the ``dask worker`` CLI and at every worker's start.

A default pool is a share of the GPU's *total* memory between every worker planned on it -- this
command's and those of this user's other live gpudask commands, counted from their host plans
(``plan-<pid>.json``) and slot files (``pid-<pid>/slot-<i>.lock``), which stay through a restart."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import FactsSection, hookimpl, nvml_session, read_private, state_dir, write_atomic

if TYPE_CHECKING:
    from gpudask.pluginapi import Facts

# the environment a planning process gives its worker processes (gpudask/apply/hostfile.py)
PLAN_ENV = "GPUDASK_HOST_PLAN"
GROUP_ENV = "GPUDASK_GROUP"
# at most this many other host plans are read (a state directory is this user's own; bounded anyway)
MAX_PLANS = 256
POLL = 0.2  # seconds between two readings of the GPU's free memory while waiting
# a wait ends early when for this long nothing on the GPU is going away and free memory stopped growing
SETTLE = 3.0
SECTION = "rmm"


# --------------------------------------------------------------------------- processes
def _start_time(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def state_of(pid: int) -> bytes | None:
    """The state letter of process ``pid`` in /proc (``b"Z"``: a zombie); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def going(pid: int) -> bool:
    """Is ``pid`` gone, a zombie or being torn down (its GPU memory on the way back)?"""
    return state_of(pid) in (None, b"Z", b"X", b"x")


def alive_since(pid: int, written: float) -> bool:
    """Is ``pid`` alive and the process that wrote a file at ``written`` (not a reused pid)?"""
    if pid <= 0 or going(pid):
        return False
    started = _start_time(pid)
    return started is None or started <= written + 1.0


def own_planner() -> int | None:
    """The pid of the process whose host plan this worker took (``$GPUDASK_HOST_PLAN``)."""
    name = os.path.basename(os.environ.get(PLAN_ENV) or "")
    pid = name[len("plan-"):-len(".json")] if name.startswith("plan-") and name.endswith(".json") else ""
    return int(pid) if pid.isdigit() else None


def other_commands(hostname: str, exclude: set[int] | None = None) -> dict[str, dict[int, int]]:
    """GPU UUID -> {pid of another live gpudask planning process: its workers planned on that GPU and
    started} ({} when the state directory cannot be read); ``exclude``: the process this one's plan is from."""
    skip = {os.getpid(), *(exclude or ())}
    out: dict[str, dict[int, int]] = {}
    try:
        paths = sorted(state_dir().glob("plan-*.json"))[:MAX_PLANS]
    except Exception:  # noqa: BLE001 - no usable state directory: nothing known of other commands
        return out
    for path in paths:
        pid_text = path.stem[len("plan-"):]
        if not pid_text.isdigit() or int(pid_text) in skip:
            continue
        pid = int(pid_text)
        try:
            written = path.stat().st_mtime
        except OSError:
            continue
        if not alive_since(pid, written):
            continue
        started = _started_workers(path.parent / f"pid-{pid}")
        if not started:
            continue  # a client that planned but started no worker (gpudask.initialize()), or not yet
        text = read_private(path, "host plan")
        if text is None:
            continue
        for uuid, count in _workers_per_gpu(text, hostname, started).items():
            out.setdefault(uuid, {})[pid] = count
    return out


def _started_workers(group: Any) -> set[int]:
    """The worker numbers ever claimed in a command's slot folder (a slot's file stays through a restart)."""
    try:
        names = [p.name for p in group.glob("slot-*.lock")][:4096]
    except OSError:
        return set()
    return {int(n[len("slot-"):-len(".lock")]) for n in names if n[len("slot-"):-len(".lock")].isdigit()}


def _workers_per_gpu(text: str, hostname: str, started: set[int]) -> dict[str, int]:
    """{GPU UUID: workers planned on it and started} of one host plan file ({} if not understood)."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("facts", {}).get("hostname") != hostname:
            return {}
        gpus = [g for g in data["facts"].get("gpus") or [] if isinstance(g, dict)]
        device0 = gpus[0].get("uuid") if gpus else None
        counts: dict[str, int] = {}
        for i, w in enumerate(data.get("workers") or []):
            if not isinstance(w, dict) or i not in started:
                continue
            uuid = w.get("gpu") or device0  # a worker without a GPU of its own computes on device 0
            if isinstance(uuid, str) and uuid:
                counts[uuid] = counts.get(uuid, 0) + 1
        return counts
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
        return {}


# --------------------------------------------------------------------------- who holds memory
def gpu_processes(uuid: str) -> list[tuple[int, int | None]] | None:
    """(pid, bytes used) of every process with a context on the GPU, from NVML; None when NVML cannot tell."""
    with nvml_session() as nvml:
        handle = nvml.call("nvmlDeviceGetHandleByUUID", uuid) if nvml else None
        if nvml is None or handle is None:
            return None
        found: dict[int, int | None] = {}
        answered = False
        for call in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            listed = nvml.call(call, handle)  # None: this list unsupported, the other still says
            if listed is None:
                continue
            answered = True
            for p in list(listed)[:4096]:
                used = getattr(p, "usedGpuMemory", None)
                pid = int(p.pid)
                found[pid] = int(used) if isinstance(used, int) and not isinstance(used, bool) else found.get(pid)
        return sorted(found.items()) if answered else None


def _what(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read(4096).split(b"\0")
    except OSError:
        return "not a process of this host's namespace" if not os.path.exists(f"/proc/{pid}") else "unknown"
    words = [os.path.basename(a.decode("utf-8", "replace")) for a in argv[:4] if a]
    text = " ".join(words)
    return "".join(c if c.isprintable() else "?" for c in text)[:60]


def holders_text(processes: list[tuple[int, int | None]] | None, workers: Mapping[int, str] | None = None,
                 limit: int = 8) -> str:
    """``pid 123 (gpudask worker 0 of pid-99) 35840 MiB, pid 456 (python) 512 MiB``: the processes holding
    memory on a GPU (``gpu_processes``), largest first, named (``workers``: pid -> gpudask worker); or why none is."""
    if processes is None:
        return "NVML cannot list the processes on this GPU"
    if not processes:
        return "NVML lists no process on this GPU (processes of other containers are not listed)"
    found = sorted(processes, key=lambda p: -(p[1] or 0))
    parts = [f"pid {pid} ({(workers or {}).get(pid) or _what(pid)}) "
             + (f"{used // 2**20} MiB" if used is not None else "? MiB") for pid, used in found[:limit]]
    more = f", and {len(found) - limit} more" if len(found) > limit else ""
    return ", ".join(parts) + more


# --------------------------------------------------------------------------- this worker's record
def _record_path(index: int | None) -> Any:
    group = os.environ.get(GROUP_ENV) or f"ppid-{os.getppid()}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in group)[:120]
    base = state_dir() / safe
    base.mkdir(mode=0o700, exist_ok=True)
    return base / f"rmm-worker-{index if index is not None else 'x'}.json"


def predecessor(index: int | None) -> int | None:
    """The pid of the process that was this worker before a restart or kill, when it recorded itself."""
    try:
        text = read_private(_record_path(index), "worker record")
        pid = json.loads(text).get("pid") if text else None
    except Exception:  # noqa: BLE001 - no record: no predecessor known
        return None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) and pid != os.getpid() else None


def known_workers() -> dict[int, str]:
    """pid -> "gpudask worker N of pid P" for this user's workers that recorded themselves."""
    out: dict[int, str] = {}
    try:
        paths = sorted(state_dir().glob("*/rmm-worker-*.json"))[:4 * MAX_PLANS]
    except Exception:  # noqa: BLE001
        return out
    for path in paths:
        text = read_private(path, "worker record")
        try:
            pid = json.loads(text).get("pid") if text else None
        except ValueError:
            continue
        if isinstance(pid, int) and not isinstance(pid, bool):
            number = path.stem[len("rmm-worker-"):]
            out[pid] = f"gpudask worker {number} of {path.parent.name}"
    return out


def record(index: int | None, gpu: str | None, pool: int | None) -> None:
    """Note this process as worker ``index`` of its command (for the one that replaces it)."""
    try:
        write_atomic(_record_path(index), json.dumps({"pid": os.getpid(), "gpu": gpu, "pool": pool}))
    except Exception:  # noqa: BLE001 - only an aid to the next start
        pass


# --------------------------------------------------------------------------- waiting for release
@dataclass
class Waited:
    free: int
    total: int
    seconds: float
    why_stopped: str  # "enough free", "nothing being released", "time limit"


def wait_for_memory(read: Callable[[], tuple[int, int] | None], needed: int, timeout: float,
                    leaving: Callable[[], bool], clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> Waited | None:
    """Wait, at most ``timeout`` seconds, until ``read()`` (free, total) shows ``needed`` free; earlier when
    nothing is being released (``leaving()`` false and no growth for :data:`SETTLE` s).  None: unreadable."""
    start = clock()
    first = read()
    if first is None:
        return None
    free, total = first
    last_growth = start
    while free < needed:
        now = clock()
        if now - start >= timeout:
            return Waited(free, total, now - start, "time limit")
        if now - last_growth >= SETTLE and not leaving():
            return Waited(free, total, now - start, "nothing being released")
        sleep(POLL)
        found = read()
        if found is None:
            break
        if found[0] > free:
            last_growth = clock()
        free, total = found
    return Waited(free, total, clock() - start, "enough free" if free >= needed else "unreadable")


# --------------------------------------------------------------------------- the facts section
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
    others = other_commands(str(facts.hostname))
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
              for g in facts.gpus if (found := gpu_processes(g.uuid)) is not None}
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

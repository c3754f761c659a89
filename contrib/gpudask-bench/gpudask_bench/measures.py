"""Figures read from outside the workers: GPU memory per process (NVML), the transports
UCX reported (UCX_PROTO_INFO), and where a launch's ready time goes (--profile)."""

from __future__ import annotations

import datetime
import os
import re
import statistics
import time
from typing import Any

from gpudask_bench.cluster import Cluster, read_lines
from gpudask_bench.configs import MiB, Host

# gpudask logs under distributed's logger (gpudask.apply.preload), so `dask worker`'s
# logging setup applies to its lines; the startup line marks the "gpudask" stage
GPUDASK_LOGGER = "distributed.gpudask"
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - (?:(\d+) - )?([\w.]+) - (\w+) - (.*)$")


def nvml_processes(nvml: Any) -> list[dict[str, Any]] | None:
    """Compute processes on every GPU, from an open NVML session (or None): pid, GPU index,
    used MiB.  None when NVML cannot say."""
    count = nvml.call("nvmlDeviceGetCount") if nvml else None
    if count is None:
        return None
    out = []
    for i in range(count):
        h = nvml.call("nvmlDeviceGetHandleByIndex", i)
        listed = None if h is None else nvml.call("nvmlDeviceGetComputeRunningProcesses", h)
        if listed is None:
            return None
        out += [{"pid": int(p.pid), "gpu": i, "MiB": None if p.usedGpuMemory is None else p.usedGpuMemory / MiB}
                for p in listed]
    return out


def _nvml_processes() -> list[dict[str, Any]] | None:
    from gpudask.pluginapi import nvml_session

    with nvml_session() as nvml:
        return nvml_processes(nvml)


def _proc_start_epoch(pid: int) -> float | None:
    """When process ``pid`` started, in time.time() seconds (10 ms resolution; psutil's
    create_time is off by up to a second because /proc/stat's btime is whole seconds)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        hz = os.sysconf("SC_CLK_TCK")
        offset = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        return offset + ticks / hz
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _unattributed(rows: list[dict[str, Any]], note: str) -> dict[str, Any]:
    return {"outside_workers_MiB": None, "scheduler_MiB": None, "nanny_MiB": None, "processes": rows, "note": note}


def gpu_memory(cluster: Cluster, host: Host) -> dict[str, Any] | None:
    if not host.gpus:
        return None
    procs = _nvml_processes()
    if procs is None:
        return _unattributed([], "NVML process query failed")
    roles, me = cluster.roles(), os.getpid()
    rows = [{**p, "role": roles.get(p["pid"]) or ("bench client" if p["pid"] == me else "not ours")} for p in procs]
    if procs and all(r["role"] in ("not ours", "bench client") for r in rows):
        # NVML reports pids of another PID namespace (containers): attribution impossible
        return _unattributed(rows, "NVML pids are not this PID namespace's: no attribution")
    by_role = {"scheduler": 0.0, "nanny": 0.0}  # the nanny row: the dask worker process(es) and their helpers
    for r in rows:
        if r["role"] not in ("worker", "bench client", "not ours") and r["MiB"] is not None:
            by_role["scheduler" if r["role"] == "scheduler" else "nanny"] += r["MiB"]
    notes = []
    if any(r["role"] == "bench client" for r in rows):
        notes.append("the bench client holds a CUDA context (not counted)")
    foreign = sum(r["role"] == "not ours" for r in rows)
    if foreign:
        notes.append(f"{foreign} other process(es) on the GPUs (not counted)")
    return {"outside_workers_MiB": round(sum(by_role.values()), 1), "scheduler_MiB": round(by_role["scheduler"], 1),
            "nanny_MiB": round(by_role["nanny"], 1), "processes": rows, "note": "; ".join(notes) or None}


_TL = re.compile(r"\b(tcp|cuda_ipc|cuda_copy|gdr_copy|rc_mlx5|rc_verbs|dc_mlx5|ud_mlx5|ud_verbs|rc|dc|ud|posix|"
                 r"sysv|cma|knem|xpmem|self)/([\w:.\-]+)")
# UCX pads the pid to a fixed width: "[host:5827 :0]" as well as "[host:200123:0]"
_UCX_PREFIX = re.compile(r"\[\d+\.\d+\]\s+\[[^:\]]+:(\d+)\s*:")


def proto_info(logs: list[str], pids: dict[str, int]) -> dict[str, Any]:
    """Transports UCX reported choosing (UCX_PROTO_INFO=y) in ``logs``, per process of
    ``pids`` (a cluster's workers by address, or the raw column's peers)."""
    by_pid: dict[int, set[str]] = {}
    for path in logs:
        for line in read_lines(path) or []:  # "[time] [host:pid:thread]   | 0..inf | zero-copy | cuda_ipc/cuda |"
            m = _UCX_PREFIX.search(line)
            if m and "|" in line:
                for tl, dev in _TL.findall(line):
                    by_pid.setdefault(int(m.group(1)), set()).add(f"{tl}/{dev}")
    out = {addr: sorted(by_pid.get(pid, set())) for addr, pid in pids.items()}
    if not any(out.values()):
        return {"note": "no UCX_PROTO_INFO lines found in the logs", "workers": out}
    return {"workers": out}


_STAGES = {"scheduler": ("start", "gpudask", "listen"),
           "nanny": ("start", "gpudask", "listen"),
           "worker": ("start", "gpudask", "listen", "registered")}


def profile_launch(cluster: Cluster) -> dict[str, Any]:
    """Per-process timestamps of one launch, in seconds after the launch: process start
    -> gpudask imported (its startup line) -> listening -> registered with the scheduler."""
    t0 = cluster.t_launch
    roles = cluster.roles()
    events: dict[int, dict[str, float]] = {}
    for path in cluster.logs():
        for line in read_lines(path) or []:
            m = _LOG_LINE.match(line)
            if not m or not m.group(2):
                continue
            try:
                t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            pid, logger, msg = int(m.group(2)), m.group(3), m.group(5)
            stage = None
            if logger == GPUDASK_LOGGER and re.match(r"gpudask \S+ \(", msg):
                stage = "gpudask"
            elif "Scheduler at:" in msg or "Start Nanny at:" in msg or "Start worker at:" in msg:
                stage = "listen"
            elif "Registered to:" in msg:
                stage = "registered"
            if stage:
                ev = events.setdefault(pid, {})
                ev[stage] = max(ev.get(stage, 0.0), t - t0)  # several nannies in one process: the last
    per_process = []
    for pid, role in sorted(roles.items()):
        if role not in _STAGES:
            continue
        start = _proc_start_epoch(pid)
        row = {"pid": pid, "role": role, "start": None if start is None else round(start - t0, 3)}
        for stage in _STAGES[role][1:]:
            v = events.get(pid, {}).get(stage)
            row[stage] = None if v is None else round(v, 3)
        per_process.append(row)
    return {"ready": round(cluster.ready_s or 0.0, 3), "processes": per_process}


def summarize_profiles(profiles: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over launches of each role's stage, the slowest process of a role counting."""
    table: dict[str, list[float]] = {}
    for prof in profiles:
        worst: dict[str, float] = {}
        for row in prof["processes"]:
            for stage in _STAGES[row["role"]]:
                v = row.get(stage)
                if v is not None:
                    k = f"{row['role']}.{stage}"
                    worst[k] = max(worst.get(k, -1e9), v)
        worst["ready"] = prof["ready"]
        for k, v in worst.items():
            table.setdefault(k, []).append(v)
    order = [f"{r}.{s}" for r, stages in _STAGES.items() for s in stages] + ["ready"]
    median = {k: round(statistics.median(table[k]), 3) for k in order if k in table}
    return {"median_s_after_launch": median, "launches": profiles}

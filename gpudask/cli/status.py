"""``gpudask status``: the running cluster, one row per worker, planned against actual.

Every worker with gpudask publishes its plan and its *applied state* -- read from the live
process after setup (:mod:`gpudask.apply.state`) -- in its startup information, which the
scheduler keeps in ``WorkerState.extra``.  This reads it through a client and puts the two
side by side; a difference is a *mismatch* (the plan did not take effect).
"""

from __future__ import annotations

from typing import Any


def _ranges(cpus: list[int] | None) -> str:
    if not cpus:
        return "-"
    out: list[list[int]] = []
    for c in sorted(cpus):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in out)


def _gib(n: Any) -> str:
    return f"{n / 2**30:.1f} GiB" if isinstance(n, (int, float)) else "-"


def worker_row(address: str, info: dict[str, Any]) -> dict[str, Any]:
    """One worker: planned and actual, from what it published (``{}`` when it runs no gpudask)."""
    published = info.get("gpudask") or {}
    plan = published.get("plan") or {}
    applied = published.get("applied") or {}
    memory = plan.get("memory") or {}
    live_memory = (applied.get("plugins") or {})
    ucx = applied.get("ucx") or {}
    context = applied.get("cuda_context") or {}
    return {
        "worker": address,
        "index": plan.get("index"),
        "gpudask": bool(published),
        "gpu": {"planned": plan.get("gpu"), "actual": context.get("uuid") if context.get("exists") else None},
        "cuda_visible_devices": {"planned": plan.get("cuda_visible_devices"),
                                 "actual": (applied.get("env") or {}).get("CUDA_VISIBLE_DEVICES")},
        "transports": {"planned": (plan.get("env") or {}).get("UCX_TLS"), "actual": ucx.get("TLS")},
        "pool": {"planned": memory.get("initial_pool_size"),
                 "actual": (published.get("memory") or {}).get("pool_size")},
        "plugins_state": live_memory,
        "cpu_affinity": {"planned": plan.get("cpu_affinity"), "actual": applied.get("cpu_affinity")},
        "start_method": {"planned": plan.get("multiprocessing_method"),
                         "actual": applied.get("multiprocessing_method")},
        "mismatches": published.get("mismatches") or [],
    }


def cluster_status(client: Any) -> dict[str, Any]:
    """Every worker's row, and the scheduler's own mismatches when it runs gpudask."""
    info = client.scheduler_info(n_workers=-1)
    rows = [worker_row(a, w) for a, w in sorted(info["workers"].items())]
    return {"scheduler": info.get("address"), "workers": rows,
            "mismatches": sum(len(r["mismatches"]) for r in rows)}


def _pair(d: dict[str, Any], show: Any = str) -> str:
    planned, actual = d.get("planned"), d.get("actual")
    if planned is None and actual is None:
        return "-"
    if actual is None or planned == actual:
        return show(planned)
    return f"{show(planned)} -> {show(actual)}!"


def format_status(status: dict[str, Any], table: Any) -> str:
    headers = ["worker", "#", "gpu (planned -> actual)", "CUDA_VISIBLE_DEVICES", "UCX_TLS", "pool", "cpus",
               "start", "ok"]
    rows = []
    for r in status["workers"]:
        if not r["gpudask"]:
            rows.append([r["worker"], "-", "no gpudask in this worker", "", "", "", "", "", "?"])
            continue
        gpu = r["gpu"]
        shown_gpu = (gpu["planned"] or "-")[:12] + ("" if gpu["actual"] in (None, gpu["planned"])
                                                     else f" -> {gpu['actual'][:12]}!")
        rows.append([r["worker"], r["index"], shown_gpu, _pair(r["cuda_visible_devices"]), _pair(r["transports"]),
                     _pair(r["pool"], _gib), _pair(r["cpu_affinity"], _ranges), _pair(r["start_method"]),
                     "yes" if not r["mismatches"] else f"{len(r['mismatches'])} mismatch(es)"])
    lines = [f"scheduler {status['scheduler']}: {len(status['workers'])} worker(s)", table(headers, rows)]
    for r in status["workers"]:
        for m in r["mismatches"]:
            lines.append(f"error: {r['worker']} ({m['process']}): {m['key']} is {m['actual']!r}, planned "
                         f"{m['planned']!r} (plugin {m['plugin'] or 'gpudask'})")
    return "\n".join(lines)

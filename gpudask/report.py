"""Readable tables of plans and plugins (the non-JSON output of the CLI)."""

from __future__ import annotations

from typing import Any

from gpudask.plan import HostPlan, ProcessPlan, cpu_ranges as _cpu_ranges


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(c) for c in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _memory(plan: ProcessPlan) -> str:
    if not plan.memory:
        return "-"
    m = plan.memory
    size = m.get("initial_pool_size")
    return f"{m.get('allocator', '?')}" + (f" {size / 2**30:.1f} GiB" if isinstance(size, int) else "")


def plan_table(host: HostPlan) -> str:
    facts = host.facts
    gpus = facts.visible_gpus()
    head = [f"host {facts.hostname} ({'described by ' + facts.origin if facts.described else 'probed'}): "
            f"{len(gpus)} visible GPU(s), driver {facts.driver_version or 'none'}, "
            f"{sum(d.is_infiniband for d in facts.ib_devices)} active InfiniBand port(s)",
            f"protocol {host.protocol}, {host.nworkers} worker(s); plugins: "
            + ", ".join(f"{p['name']}({p['priority']})" for p in host.plugins)]
    if not gpus:
        head.append("no GPU visible: GPU plugins skip (see reasons)")
    rows = []
    for w in host.workers:
        rows.append([w.index, w.gpu_index if w.gpu_index is not None else "-", w.cuda_visible_devices or "-",
                     w.env.get("UCX_TLS", "-"), w.env.get("UCX_NET_DEVICES", "-"), w.interface or "-",
                     _cpu_ranges(w.cpu_affinity) if w.cpu_affinity else "-", _memory(w),
                     w.multiprocessing_method or "-"])
    out = ["\n".join(head), "",
           table(["worker", "gpu", "CUDA_VISIBLE_DEVICES", "UCX_TLS", "UCX_NET_DEVICES", "interface", "cpus",
                  "memory", "start"], rows)]
    for plan in [host.scheduler, host.nanny, host.client, *host.workers]:
        title = plan.role + (f" {plan.index}" if plan.index is not None else "")
        extra = {**plan.env, **{k: repr(v) for k, v in plan.config.items()}}
        out.append(f"\n{title}:" + ("  " + " ".join(f"{k}={v}" for k, v in extra.items()) if extra else ""))
        for r in plan.reasons:
            out.append(f"  [{r.plugin}] {r.decision} -- {r.why}")
        if not plan.reasons:
            out.append("  (no decisions)")
    for w in host.warnings:
        out.append(f"\nwarning: {w}")
    return "\n".join(out)

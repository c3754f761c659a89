"""gpudask plugin ``prometheus``: each worker's GPU, plan and check status as Prometheus metrics.

Added to distributed's own ``/metrics`` from what each worker's gpudask publishes: on each worker
``<ns>_gpudask_worker_*``; on the scheduler ``<ns>_gpudask_cluster_*`` for every worker (labelled
``worker="<address>"``) and the scheduler check's findings -- one scrape target shows the whole
cluster.  ``<ns>`` is ``distributed.dashboard.prometheus.namespace``.  Nothing is imported at
module level beyond gpudask.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import Option, hookimpl, parse_bool

if TYPE_CHECKING:
    from distributed import Nanny, Scheduler, Worker

    from gpudask.pluginapi import PlanContext, ProcessPlan

name = "prometheus"
priority = 900  # acts last: the others' decisions are all made and published

ENABLED = "gpudask.prometheus.enabled"
PUBLISHED = "gpudask"  # the worker's startup information key (WorkerState.extra on the scheduler)
CHECK = "gpudask-check"  # what gpudask's scheduler check adds to WorkerState.extra

logger = logging.getLogger("distributed.gpudask.prometheus")


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [Option(ENABLED, True, "Export each worker's GPU, plan and check status as Prometheus metrics on the "
                                  "workers' and the scheduler's /metrics (plugin prometheus).",
                   parse_bool, "true or false")]


@hookimpl
def gpudask_server_setup(ctx: PlanContext, plan: ProcessPlan, server: Scheduler | Worker | Nanny) -> None:
    if not ctx.value(ENABLED):
        return
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        logger.warning("gpudask prometheus: prometheus_client is not installed: no gpudask metrics "
                       "(pip install prometheus-client)")
        return
    from distributed import Scheduler, Worker

    if isinstance(server, (Worker, Scheduler)):
        _collector("worker" if isinstance(server, Worker) else "scheduler").server = weakref.ref(server)


# --------------------------------------------------------------------------- metrics
def _namespace() -> str:
    import dask.config

    ns = dask.config.get("distributed.dashboard.prometheus.namespace", default="dask")
    return f"{ns}_gpudask" if ns else "gpudask"


# the families, one sample per worker: attribute -> (name after the prefix, help, labels after the base ones)
_FAMILIES = {
    "info": ("info", "gpudask on this worker (value 1): its GPU, CUDA_VISIBLE_DEVICES, protocol, UCX_TLS, interface, "
                     "facts origin and gpudask version",
             ["index", "gpu", "gpu_name", "cuda_visible_devices", "protocol", "ucx_tls", "interface", "facts",
              "version"]),
    "gpu_memory": ("gpu_memory_total_bytes", "Memory of the worker's GPU", ["gpu"]),
    "visible": ("visible_gpus", "GPUs visible on the worker's host", []),
    "pool": ("memory_pool_bytes", "The planned RMM pool sizes of the worker", ["allocator", "size"]),
    "cpus": ("cpu_affinity_cpus", "CPUs the worker is bound to (planned)", []),
    "plugin": ("plugin_info", "gpudask plugins loaded (value: priority)", ["plugin", "source"]),
    "decisions": ("decisions", "Decisions in the worker's plan, per plugin", ["plugin", "skipped"]),
    "restart": ("needs_restart", "Planned settings a running worker could not apply (gpudask registered late); 0 "
                                 "when preloaded", []),
}


class _Families:
    def __init__(self, prefix: str, extra_labels: list[str]):
        from prometheus_client.core import GaugeMetricFamily

        self.by_name = {attr: GaugeMetricFamily(f"{prefix}_{suffix}", doc, labels=[*extra_labels, *labels])
                        for attr, (suffix, doc, labels) in _FAMILIES.items()}

    def add(self, published: dict[str, Any], base: dict[str, str]) -> None:
        values, f = list(base.values()), self.by_name
        plan = published.get("plan") or {}
        facts = published.get("facts") or {}
        gpus = {g.get("uuid"): g for g in facts.get("gpus") or [] if isinstance(g, dict)}
        gpu = gpus.get(plan.get("gpu")) or {}
        env = plan.get("env") or {}
        info = (plan.get("index"), plan.get("gpu"), gpu.get("name"), plan.get("cuda_visible_devices"),
                published.get("protocol"), env.get("UCX_TLS"), plan.get("interface"), published.get("facts_origin"),
                published.get("version"))
        f["info"].add_metric([*values, *("" if v is None else str(v) for v in info)], 1)
        if gpu.get("memory_total") is not None:
            f["gpu_memory"].add_metric([*values, str(plan.get("gpu"))], float(gpu["memory_total"]))
        f["visible"].add_metric(values, float(len(facts.get("gpus") or [])))
        sections = plan.get("sections")
        memory = sections.get("rmm") if isinstance(sections, dict) else None  # the rmm plugin's section
        for size in ("initial_pool_size", "maximum_pool_size"):
            if isinstance(memory, dict) and isinstance(memory.get(size), (int, float)):
                f["pool"].add_metric([*values, str(memory.get("allocator")), size.split("_")[0]],
                                     float(memory[size]))
        if plan.get("cpu_affinity"):
            f["cpus"].add_metric(values, float(len(plan["cpu_affinity"])))
        for p in published.get("plugins") or []:
            f["plugin"].add_metric([*values, str(p.get("name")), str(p.get("source"))], float(p.get("priority", 0)))
        counts = Counter((str(r.get("plugin")), "true" if r.get("decision") == "skipped" else "false")
                         for r in plan.get("reasons") or [])
        for (plugin, skipped), n in sorted(counts.items()):
            f["decisions"].add_metric([*values, plugin, skipped], float(n))
        late = published.get("late") or {}
        f["restart"].add_metric(values, float(len(late.get("needs_restart") or [])))


def worker_metrics(published: dict[str, Any], namespace: str | None = None) -> list[Any]:
    """The metric families a worker exports, from what its gpudask published."""
    fam = _Families(f"{namespace or _namespace()}_worker", [])
    fam.add(published, {})
    return list(fam.by_name.values())


def cluster_metrics(workers: dict[str, Any], namespace: str | None = None) -> list[Any]:
    """The metric families the scheduler exports: ``workers`` maps addresses to their
    ``WorkerState.extra`` (what each worker published, and the check's result)."""
    from prometheus_client.core import GaugeMetricFamily

    prefix = f"{namespace or _namespace()}_cluster"
    fam = _Families(prefix, ["worker"])
    running = GaugeMetricFamily(f"{prefix}_workers", "Workers, by whether they run gpudask", labels=["gpudask"])
    findings = GaugeMetricFamily(f"{prefix}_check_findings", "Findings of gpudask's scheduler check per worker",
                                 labels=["worker", "severity"])
    status = GaugeMetricFamily(f"{prefix}_check_status",
                               "Worst finding of the scheduler check per worker: 0 ok, 1 info, 2 warning, 3 error",
                               labels=["worker"])
    counts = {"yes": 0, "no": 0}
    for address, extra in sorted(workers.items()):
        extra = extra if isinstance(extra, dict) else {}
        published = extra.get(PUBLISHED)
        counts["yes" if isinstance(published, dict) else "no"] += 1
        if isinstance(published, dict):
            fam.add(published, {"worker": address})
        check = extra.get(CHECK)
        if isinstance(check, dict):
            by_severity: dict[str, int] = {"info": 0, "warning": 0, "error": 0}
            for f in check.get("findings") or []:
                if isinstance(f, dict) and f.get("severity") in by_severity:
                    by_severity[f["severity"]] += 1
            for severity, n in by_severity.items():
                findings.add_metric([address, severity], float(n))
            levels, state = ["ok", "info", "warning", "error"], check.get("status")
            status.add_metric([address], float(levels.index(state) if state in levels else 0))
    for key, n in counts.items():
        running.add_metric([key], float(n))
    return [*fam.by_name.values(), running, findings, status]


class _Collector:
    """A prometheus_client collector bound (weakly) to this process's server."""

    def __init__(self, kind: str):
        self.kind = kind
        self.server: Any = None  # weakref to the Worker or Scheduler

    def describe(self) -> list[Any]:
        return []  # no names up front: prometheus_client does not call collect() at registration

    def collect(self) -> Iterator[Any]:
        server = self.server() if self.server is not None else None
        if server is None:
            return
        try:
            if self.kind == "worker":
                info = server.startup_information.get(PUBLISHED)
                published = info(server) if callable(info) else info
                if isinstance(published, dict):
                    yield from worker_metrics(published)
            else:
                yield from cluster_metrics({addr: ws.extra for addr, ws in list(server.workers.items())})
        except Exception:  # noqa: BLE001 - a scrape must never break the server
            logger.exception("gpudask prometheus: could not collect the %s metrics", self.kind)


_COLLECTORS: dict[str, _Collector] = {}


def _collector(kind: str) -> _Collector:
    """One collector per kind and process, registered once in prometheus_client's REGISTRY
    (the one distributed's /metrics handlers serve)."""
    if kind not in _COLLECTORS:
        import prometheus_client

        prometheus_client.REGISTRY.register(_COLLECTORS.setdefault(kind, _Collector(kind)))
    return _COLLECTORS[kind]

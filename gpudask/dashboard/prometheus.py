"""gpudask's worker metrics on distributed's Prometheus ``/metrics`` (names: docs/dashboard.md).

Plugins report live numbers as worker metrics (``Worker.metrics``) named ``gpudask-*``; a
collector in prometheus_client's default registry (which ``/metrics`` serves) turns their
dicts into gauges at each scrape, knowing no plugin; the scheduler's does it for every worker.
"""

from __future__ import annotations

import inspect
import logging
import math
import re
import weakref
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger("distributed.gpudask.prometheus")

METRIC_PREFIX = "gpudask-"
# one collector of each kind per process, pointed at the latest server (as distributed's own)
_COLLECTORS: dict[type, Any] = {}


def _point(kind: type, server: Any) -> bool:
    try:
        import prometheus_client
    except ImportError:
        return False
    if kind not in _COLLECTORS:
        _COLLECTORS[kind] = kind()
        prometheus_client.REGISTRY.register(_COLLECTORS[kind])
    _COLLECTORS[kind].server = weakref.ref(server)
    return True


def register_worker_collector(worker: Any) -> bool:
    """Export ``worker``'s ``gpudask-*`` metrics on ``/metrics``; a later call points the one
    collector at the later worker.  False without prometheus_client."""
    return _point(WorkerMetricsCollector, worker)


class _Collector:
    def __init__(self) -> None:
        self.server: Any = None  # weakref to the Worker (or the Scheduler)

    def describe(self) -> list[Any]:
        return []  # names depend on what plugins report: nothing to declare up front


class WorkerMetricsCollector(_Collector):
    """A prometheus_client collector of one worker's ``gpudask-*`` metrics."""

    def collect(self) -> Iterator[Any]:
        worker = self.server() if self.server is not None else None
        if worker is None:
            return
        prefix = f"{_namespace()}_worker".lstrip("_")
        for name, function in sorted(getattr(worker, "metrics", {}).items()):
            if not name.startswith(METRIC_PREFIX):
                continue
            value = _call(function, worker, name)
            if isinstance(value, dict):
                yield from families(f"{prefix}_{_sanitize(name)}", name, value)


def register_scheduler_collector(scheduler: Any) -> bool:
    """Every worker's ``gpudask-*`` metrics of its last heartbeat on the scheduler's ``/metrics``,
    with a ``worker`` label: one scrape target for the cluster.  False without prometheus_client."""
    return _point(ClusterMetricsCollector, scheduler)


class ClusterMetricsCollector(_Collector):
    """A prometheus_client collector of every worker's ``gpudask-*`` metrics, on the scheduler."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        scheduler = self.server() if self.server is not None else None
        if scheduler is None:
            return
        prefix = f"{_namespace()}_scheduler".lstrip("_")
        gauges: dict[str, Any] = {}
        infos: dict[str, list[tuple[str, dict[str, str]]]] = {}
        for address, ws in sorted(list(scheduler.workers.items())):
            for name, value in sorted(ws.metrics.items()):
                if not name.startswith(METRIC_PREFIX) or not isinstance(value, dict):
                    continue
                base = f"{prefix}_{_sanitize(name)}"
                numbers, labels = _split(value)
                for key, number in numbers:
                    if f"{base}_{key}" not in gauges:
                        gauges[f"{base}_{key}"] = GaugeMetricFamily(
                            f"{base}_{key}", f"gpudask worker metric {name}: {key}, per worker", labels=["worker"])
                    gauges[f"{base}_{key}"].add_metric([address], number)
                if labels:
                    infos.setdefault(base, []).append((address, dict(labels)))
        yield from gauges.values()
        for base, rows in infos.items():
            keys = sorted({k for _, labels in rows for k in labels})
            info = GaugeMetricFamily(f"{base}_info", "gpudask worker metric: its text values, per worker",
                                     labels=["worker", *keys])
            for address, labels in rows:
                info.add_metric([address, *(labels.get(k, "") for k in keys)], 1.0)
            yield info


def _namespace() -> str:
    import dask.config

    return dask.config.get("distributed.dashboard.prometheus.namespace", default="dask") or ""


def families(base: str, metric: str, values: dict[str, Any]) -> list[Any]:
    """Gauge families for one metric's dict (see the module's docstring)."""
    from prometheus_client.core import GaugeMetricFamily

    numbers, labels = _split(values)
    out = []
    for key, number in numbers:
        family = GaugeMetricFamily(f"{base}_{key}", f"gpudask worker metric {metric}: {key}")
        family.add_metric([], number)
        out.append(family)
    if labels:
        info = GaugeMetricFamily(f"{base}_info", f"gpudask worker metric {metric}: its text values",
                                 labels=[k for k, _ in labels])
        info.add_metric([v for _, v in labels], 1.0)
        out.append(info)
    return out


def _split(values: dict[str, Any], prefix: str = "") -> tuple[list[tuple[str, float]], list[tuple[str, str]]]:
    numbers: list[tuple[str, float]] = []
    labels: list[tuple[str, str]] = []
    for key, value in values.items():
        name = _sanitize(f"{prefix}{key}")
        if isinstance(value, dict):
            more_numbers, more_labels = _split(value, f"{name}_")
            numbers += more_numbers
            labels += more_labels
        elif isinstance(value, (bool, int, float)) and not (isinstance(value, float) and math.isnan(value)):
            numbers.append((name, float(value)))
        elif isinstance(value, str):
            labels.append((name, value))
        # None, lists and other values have no gauge
    return numbers, labels


def _call(function: Any, worker: Any, name: str) -> Any:
    try:
        value = function(worker)
    except Exception:  # noqa: BLE001 - one plugin's metric must not break the scrape
        logger.exception("gpudask prometheus: the worker metric %s failed", name)
        return None
    if inspect.isawaitable(value):
        # a coroutine metric runs only in the heartbeat; a scrape cannot wait for it
        getattr(value, "close", lambda: None)()
        return None
    return value


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)

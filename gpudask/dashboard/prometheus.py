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
# one collector of each kind (worker, scheduler) per process, pointed at the latest server
_COLLECTORS: dict[str, Any] = {}


def _point(kind: str, server: Any) -> bool:
    try:
        import prometheus_client
    except ImportError:
        return False
    if kind not in _COLLECTORS:
        _COLLECTORS[kind] = _Collector(kind)
        prometheus_client.REGISTRY.register(_COLLECTORS[kind])
    _COLLECTORS[kind].server = weakref.ref(server)
    return True


def register_worker_collector(worker: Any) -> bool:
    """Export ``worker``'s ``gpudask-*`` metrics on ``/metrics``; a later call points the one
    collector at the later worker.  False without prometheus_client."""
    return _point("worker", worker)


def register_scheduler_collector(scheduler: Any) -> bool:
    """Every worker's ``gpudask-*`` metrics of its last heartbeat on the scheduler's ``/metrics``,
    with a ``worker`` label: one scrape target for the cluster.  False without prometheus_client."""
    return _point("scheduler", scheduler)


class _Collector:
    """A prometheus_client collector of a worker's ``gpudask-*`` metrics, or on the scheduler of
    every worker's."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.server: Any = None  # weakref to the Worker (or the Scheduler)

    def describe(self) -> list[Any]:
        return []  # names depend on what plugins report: nothing to declare up front

    def collect(self) -> Iterator[Any]:
        server = self.server() if self.server is not None else None
        if server is None:
            return
        if self.kind == "worker":
            samples = [(None, name, _call(function, server, name))
                       for name, function in sorted(getattr(server, "metrics", {}).items())
                       if name.startswith(METRIC_PREFIX)]
        else:
            samples = [(address, name, value) for address, ws in sorted(list(server.workers.items()))
                       for name, value in sorted(ws.metrics.items()) if name.startswith(METRIC_PREFIX)]
        yield from _gauges(f"{_namespace()}_{self.kind}".lstrip("_"), samples)


def _namespace() -> str:
    import dask.config

    return dask.config.get("distributed.dashboard.prometheus.namespace", default="dask") or ""


def _gauges(prefix: str, samples: list[tuple[str | None, str, Any]]) -> Iterator[Any]:
    """Gauge families of ``samples``, ``(worker address, metric, value)``: a number of a dict
    value is a gauge, its text values are the labels of ``<metric>_info``; with an address
    (on the scheduler) every family has a ``worker`` label."""
    from prometheus_client.core import GaugeMetricFamily

    gauges: dict[str, Any] = {}
    infos: dict[str, tuple[str, list[tuple[list[str], dict[str, str]]]]] = {}
    for address, name, value in samples:
        if not isinstance(value, dict):
            continue
        worker = [] if address is None else [address]
        base = f"{prefix}_{_sanitize(name)}"
        numbers, labels = _split(value)
        for key, number in numbers:
            if f"{base}_{key}" not in gauges:
                gauges[f"{base}_{key}"] = GaugeMetricFamily(
                    f"{base}_{key}", f"gpudask worker metric {name}: {key}" + (", per worker" if worker else ""),
                    labels=["worker"] if worker else None)
            gauges[f"{base}_{key}"].add_metric(worker, number)
        if labels:
            infos.setdefault(base, (name, []))[1].append((worker, dict(labels)))
    yield from gauges.values()
    for base, (name, rows) in infos.items():
        if rows[0][0]:
            keys = sorted({k for _, labels in rows for k in labels})
            info = GaugeMetricFamily(f"{base}_info", "gpudask worker metric: its text values, per worker",
                                     labels=["worker", *keys])
        else:
            keys = list(rows[0][1])
            info = GaugeMetricFamily(f"{base}_info", f"gpudask worker metric {name}: its text values", labels=keys)
        for worker, labels in rows:
            info.add_metric([*worker, *(labels.get(k, "") for k in keys)], 1.0)
        yield info


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

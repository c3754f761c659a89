"""``/gpudask`` (HTML) and ``/gpudask/json``, plain tornado handlers on the scheduler's HTTP
server: mounted from ``distributed.scheduler.http.routes`` (:data:`MODULE`, listed by a plan), or
by :func:`install` on a running scheduler.  The plugins add their parts through ``gpudask_report_rows``.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
import types
from typing import Any

from distributed.http.utils import RequestHandler

from gpudask import bootstrap
from gpudask.checks import EXTRA_KEY, PLUGIN_NAME, PUBLISHED_KEY, scheme
from gpudask.checks.published import bound, bound_published
from gpudask.dashboard.html import render
from gpudask.dashboard.serve import BUILDER, MAX_JSON_BYTES, ROWS
from gpudask.plan import applied

MODULE = "gpudask.dashboard.page"  # the entry for distributed.scheduler.http.routes
PAGE = "gpudask"
METRIC_PREFIX = "gpudask-"  # worker metrics (Worker.metrics) shown on the page
REFRESH_SECONDS = 3


def cluster_state(scheduler: Any) -> dict[str, Any]:
    """What ``/gpudask/json`` returns, built in the caller's thread."""
    return json.loads(build(snapshot(scheduler)))  # type: ignore[no-any-return]


def snapshot(scheduler: Any) -> dict[str, Any]:
    """What :func:`build` needs, copied on the event loop (the scheduler's dicts change there)."""
    workers = [(address, types.SimpleNamespace(name=ws.name, host=ws.host, extra=dict(ws.extra),
                                               metrics=dict(ws.metrics)))
               for address, ws in sorted(scheduler.workers.items())]
    report = _check_report(scheduler.plugins.get(PLUGIN_NAME))
    return {"address": scheduler.address, "workers": workers, "report": report,
            "bokeh": _bokeh_app(scheduler) is not None, "probe": last_probe(scheduler),
            "extra_key": EXTRA_KEY}


def build(snap: dict[str, Any]) -> bytes:
    """The page's JSON from a :func:`snapshot`, off the event loop (:mod:`gpudask.dashboard.serve`)."""
    report = snap["report"]
    work = []
    bounded: dict[str, dict[str, Any]] = {}  # each worker's published data, bounded once per build
    for address, ws in snap["workers"]:
        published = bounded[address] = _dict(bound_published(ws.extra.get(PUBLISHED_KEY)))
        if published:
            work.append((address, _dict(published.get("plan")), published))
    rows, problem = ROWS.run(plugin_manager(), work) if work else ({}, None)
    problems = [problem] if problem else []
    pieces, size, left_out = [], 0, 0
    for address, ws in snap["workers"]:
        result = (report.get("workers") or {}).get(address) or ws.extra.get(snap["extra_key"])
        given = rows_by_column(*rows[address]) if rows and address in rows else {}
        piece = json.dumps(worker_state(address, ws, result, given, bounded[address]), default=str,
                           allow_nan=False)
        if size + len(piece) > MAX_JSON_BYTES:
            left_out += 1
            continue
        pieces.append(piece)
        size += len(piece) + 1
    if left_out:
        problems.append(f"{left_out} of {len(snap['workers'])} workers left out: the page's data is cut at "
                        f"{MAX_JSON_BYTES // 2**20} MiB; `gpudask status` lists every worker")
    findings = report.get("findings")
    if findings is None:
        findings = [f for _, ws in snap["workers"]
                    for f in (ws.extra.get(snap["extra_key"]) or {}).get("findings", [])][:1000]
    head = {
        "time": time.time(),
        "scheduler": {"address": snap["address"], "protocol": scheme(snap["address"])},
        "check": bound({"installed": bool(report), "action": report.get("action"), "status": report.get("status"),
                        "problem": report.get("problem"), "refused": sorted(report.get("refused") or {})}),
        "bokeh": snap["bokeh"],
        "findings": [bound(f) for f in findings],
        "probe": bound(_present(snap["probe"], {address for address, _ in snap["workers"]})),
        "problems": problems,
        "workers_left_out": left_out,
    }
    text = json.dumps(head, default=str, allow_nan=False)
    return (text[:-1] + ', "workers": [' + ",".join(pieces) + "]}").encode()


def _present(probe: dict[str, Any] | None, connected: set[str]) -> dict[str, Any] | None:
    """The last probe without the workers it probed that have left since (counted)."""
    if not probe:
        return probe
    workers = probe.get("workers") or []
    here = [w for w in workers if w in connected]
    return {**probe, "workers": here, "workers_left": len(workers) - len(here)}


def last_probe(scheduler: Any) -> dict[str, Any] | None:
    """The last ``gpudask check --probe``'s report (its event), the paths' values as text."""
    from gpudask.checks.probe import TOPIC

    try:
        events = scheduler.get_events(TOPIC)
    except Exception:  # noqa: BLE001 - an odd scheduler: no probe shown
        return None
    if not events:
        return None
    when, report = events[-1]
    report = _dict(report)
    paths = [{k: None if p.get(k) is None else str(p.get(k)) for k in ("path", "status", "seconds", "error", "fix",
                                                                      "detail")}
             for p in report.get("paths") or [] if isinstance(p, dict)]
    return {"time": when, "status": str(report.get("status")), "array": str(report.get("array")),
            "protocol": str(report.get("protocol")), "problem": report.get("problem") and str(report["problem"]),
            "workers": [str(w) for w in report.get("workers") or []], "paths": paths}


def worker_state(address: str, ws: Any, check_result: dict[str, Any] | None,
                 rows: dict[str, dict[str, Any]] | None = None,
                 published: dict[str, Any] | None = None) -> dict[str, Any]:
    """One worker's row, from what it published and its heartbeat metrics; ``rows``
    (:func:`rows_by_column`) and ``published`` (bounded) are made here when not given."""
    if published is None:
        published = _dict(bound_published(ws.extra.get(PUBLISHED_KEY)))
    plan = _dict(published.get("plan"))
    if rows is None:
        rows = rows_by_column(*plugin_manager().report_rows(plan, published)) if published else {}
    facts = _dict(bound(published.get("facts")))
    applied = bound(published.get("applied", ws.extra.get("applied")))
    env = _dict(plan.get("env"))
    gpu = _gpu(plan, facts)
    row = {
        "address": address,
        "name": str(ws.name),
        "title": worker_title(address, ws.name, plan.get("index"), gpu),
        "host": ws.host,
        "gpudask": bool(published),
        "version": published.get("version"),
        "gpu": gpu,
        "transports": {
            "planned": {"protocol": published.get("protocol"), "UCX_TLS": env.get("UCX_TLS"),
                        "ucx_transports": plan.get("ucx_transports") or []},
            "active": _active_transports(address, applied),
        },
        "sections": _dict(plan.get("sections")),
        "rows": rows,
        # plugins with nothing to do here (no GPU visible ...), as gpudask info lists them
        "skipped": [{"plugin": str(r.get("plugin")), "why": str(r.get("why"))} for r in plan.get("reasons") or []
                    if isinstance(r, dict) and r.get("decision") == "skipped"],
        "metrics": {k: v for k, v in sorted(ws.metrics.items()) if k.startswith(METRIC_PREFIX)},
        "applied": applied if isinstance(applied, dict) else None,
        "check": {"status": (check_result or {}).get("status"),
                  "findings": list((check_result or {}).get("findings") or [])},
    }
    # what a worker published is bounded (gpudask.checks.published): one worker's row
    # never floods or breaks the page, and it is always valid JSON
    return bound(row)  # type: ignore[no-any-return]


def worker_title(address: str, name: Any, index: Any, gpu: dict[str, Any]) -> str:
    """A worker's name when it has its own (``--name``), else its address, then its GPU:
    ``tcp://10.0.0.7:40123 · GPU 1``."""
    own = str(name) if name is not None and str(name) != address and not str(name).startswith(address) else None
    title = f"{own} ({address})" if own else address
    if gpu.get("index") is not None:
        title += f" \u00b7 GPU {gpu['index']}" + (f" ({gpu['name']})" if gpu.get("name") else "")
    elif isinstance(index, int) and not isinstance(index, bool):
        title += f" \u00b7 worker {index}"
    return title


def rows_by_column(rows: list[dict[str, Any]], problems: list[str]) -> dict[str, dict[str, Any]]:
    """``PluginManager.report_rows``' answer as the page shows it."""
    out = {r["column"]: {k: r.get(k) for k in ("summary", "planned", "actual", "note", "plugin")} for r in rows}
    if problems:
        out["problems"] = {"summary": "; ".join(problems)}
    return out


def plugin_manager() -> Any:
    """The plugins of this process's gpudask session, else (gpudask planned nothing here) the bootstrap's."""
    ctx = applied.session_context()  # answered by the apply stage, which installs this page
    return ctx.manager if ctx is not None and ctx.manager is not None else bootstrap.manager()


def _gpu(plan: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    uuid = plan.get("gpu")
    found: dict[str, Any] = {}
    for gpu in facts.get("gpus") or []:
        if not isinstance(gpu, dict):
            continue
        if gpu.get("uuid") == uuid:
            found = gpu
        for mig in _dict(gpu.get("mig")).get("instances") or []:
            if isinstance(mig, dict) and mig.get("uuid") == uuid:
                found = {**gpu, **mig, "name": f"{gpu.get('name')} MIG {mig.get('profile') or ''}".strip()}
    return {"uuid": uuid, "name": found.get("name"), "index": plan.get("gpu_index"),
            "memory_total": found.get("memory_total"), "cuda_visible_devices": plan.get("cuda_visible_devices")}


def _active_transports(address: str, applied: Any) -> dict[str, Any]:
    """The worker's protocol, and UCX_TLS as its applied state reports it."""
    out: dict[str, Any] = {"protocol": scheme(address), "UCX_TLS": None}
    if isinstance(applied, dict):
        for section in ("ucx", "env", "environment"):
            value = _dict(applied.get(section))
            tls = value.get("UCX_TLS", value.get("TLS", value.get("tls")))
            if tls is not None:
                out["UCX_TLS"] = tls if isinstance(tls, str) else ",".join(map(str, tls))
                break
    return out


def _check_report(check: Any) -> dict[str, Any]:
    report = getattr(check, "report", None)
    if report is None:
        return {}
    try:
        return report(sides=False)
    except Exception as e:  # noqa: BLE001 - the page shows what broke instead of a 500
        return {"problem": f"the scheduler check's report failed: {type(e).__name__}: {e}", "status": "error"}


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class StateHandler(RequestHandler):
    """``/gpudask/json``: :func:`cluster_state`, served by :mod:`gpudask.dashboard.serve`."""

    async def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        # allow_nan=False there: NaN/Infinity are not JSON and would blank the page (bound() replaced them)
        self.write(await BUILDER.get(self.server, snapshot, build))


class PageHandler(RequestHandler):
    """``/gpudask``: the page, drawn from the state."""

    async def get(self) -> None:
        body = await BUILDER.get(self.server, snapshot, build)  # shared with /gpudask/json's readers
        if _DRAWN[0] is not body:  # drawn once per build, off the event loop as the build is
            _DRAWN[:] = [body, await asyncio.to_thread(lambda: render(REFRESH_SECONDS, json.loads(body)))]
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(_DRAWN[1])


_DRAWN: list[Any] = [None, ""]  # the build last drawn, and its page


routes: list[tuple] = [(PAGE, PageHandler, {}), (f"{PAGE}/json", StateHandler, {})]


def install(scheduler: Any, prefix: str | None = None) -> bool:
    """Add the page to a running scheduler's HTTP server and link it from the bokeh dashboard
    (idempotent); whether handlers were added now."""
    app = getattr(scheduler, "http_application", None)
    if app is None:  # a scheduler without an HTTP server
        return False
    added = False
    if not any(rule.target is PageHandler for rule in _rules(app.default_router)):
        prefix = _http_prefix(app) if prefix is None else "/" + prefix.strip("/") + "/"
        handlers = [(re.escape(prefix) + path, cls, {**kwargs, "dask_server": scheduler})
                    for path, cls, kwargs in routes]
        app.add_handlers(".*$", handlers)
        added = True
    link_from_bokeh(scheduler)
    return added


def link_from_bokeh(scheduler: Any) -> bool:
    """Put ``gpudask`` into the bokeh dashboard's navigation (False: no bokeh dashboard here): the
    list ``template_variables(scheduler)["pages"]``, memoised per scheduler, read when a page opens."""
    if _bokeh_app(scheduler) is None:
        return False
    board = sys.modules["distributed.dashboard.scheduler"]
    pages = board.template_variables(scheduler).get("pages")
    if not isinstance(pages, list):
        return False
    if PAGE not in pages:
        pages.append(PAGE)
    return True


def _bokeh_app(scheduler: Any) -> Any:
    if "distributed.dashboard.scheduler" not in sys.modules:  # never import bokeh for this
        return None
    app = getattr(scheduler, "http_application", None)
    for sub in getattr(app, "applications", None) or []:
        if type(sub).__name__.endswith("BokehTornado"):
            return sub
    return None


def _rules(router: Any) -> list[Any]:
    return [r for rule in getattr(router, "rules", None) or [] for r in (rule, *_rules(rule.target))]


def _http_prefix(app: Any) -> str:
    """The scheduler's ``--dashboard-prefix``, read from where distributed's ``/health`` route was mounted."""
    for rule in _rules(app.default_router):
        pattern = getattr(getattr(rule, "matcher", None), "regex", None)
        if pattern is not None and pattern.pattern.endswith("health$"):
            return pattern.pattern[: -len("health$")].replace("\\", "")
    return "/"

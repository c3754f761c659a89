"""The HTML of ``/gpudask`` as one document: the markup, drawn by the scheduler from the state
(what ``/gpudask/json`` returns, every value through ``html.escape``) so it reads without
JavaScript, and a script that fetches the page again and swaps it in.
"""

from __future__ import annotations

import html
import json
import math
import re
import time
from typing import Any

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>gpudask</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; background: #fafafa; }
  header { background: #2b2f3a; color: #fff; padding: 10px 18px; display: flex; gap: 18px; align-items: baseline; }
  header h1 { font-size: 18px; margin: 0; }
  header a { color: #9cf; }
  main { padding: 12px 18px; }
  table { border-collapse: collapse; width: 100%; background: #fff; margin-bottom: 18px; }
  th, td { border: 1px solid #ddd; padding: 5px 8px; text-align: left; vertical-align: top; }
  th { background: #eef0f4; font-weight: 600; }
  .muted { color: #888; }
  .mono { font-family: ui-monospace, monospace; font-size: 12px; }
  .code { white-space: nowrap; }
  .kv div { overflow-wrap: break-word; }
  td.metrics { min-width: 14em; }  /* a counter and its value on one line, not one word per line */
  .kv .group { font-weight: 600; margin-top: 2px; }
  .kv .group ~ div:not(.group) { padding-left: 10px; }
  .kv b { font-weight: 500; color: #555; }
  .badge { display: inline-block; padding: 1px 7px; border-radius: 9px; font-size: 12px; font-weight: 600; }
  .ok { background: #d8f3dc; color: #1b5e20; } .info { background: #e3eefc; color: #1a4d8f; }
  .warning { background: #fff1c9; color: #7a5200; } .error { background: #fbd5d5; color: #8a1111; }
  .none { background: #eee; color: #666; }
  h2 { font-size: 15px; margin: 14px 0 6px; }
  #problem { color: #8a1111; }
</style>
</head>
<body data-refreshes="0"__DRAWN__>
<header><h1>gpudask</h1><span id="summary">__SUMMARY__</span><span id="links">__LINKS__</span></header>
<main>
<p id="problem">__PROBLEM__</p>
<h2>Workers</h2>
<table id="workers">
<thead><tr><th>Worker</th><th>GPU</th><th>Transports planned</th><th>Transports active</th>
<th>Plugins' plan</th><th>Live metrics</th><th>Applied</th><th>Check</th></tr></thead>
<tbody>__WORKERS__</tbody>
</table>
<h2>Findings of the scheduler check</h2>
<table id="findings">
<thead><tr><th>Severity</th><th>Workers</th><th>Plugin</th><th>Code</th><th>Message</th></tr></thead>
<tbody>__FINDINGS__</tbody>
</table>
<h2>Last probe (<span class="mono">gpudask check --probe</span>)</h2>
<p id="probe-summary" class="muted">__PROBE_SUMMARY__</p>
<table id="probe">
<thead><tr><th>Path</th><th>Status</th><th>Time</th><th>Detail, or what failed and the fix</th></tr></thead>
<tbody>__PROBE__</tbody>
</table>
<p class="muted" id="updated">__UPDATED__</p>
</main>
<script>
"use strict";
// the redraw is the first paint again: the scheduler draws the page (gpudask.dashboard.html,
// every value escaped there) and its header and main part are swapped in
const REFRESH_MS = __REFRESH__ * 1000;

async function refresh() {
  try {
    const response = await fetch(location.href, {cache: "no-store"});
    if (!response.ok) throw new Error("HTTP " + response.status);
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const part of ["header", "main"]) document.querySelector(part).replaceWith(page.querySelector(part));
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes) + 1);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString()
      + " \\u00b7 refreshes every " + (REFRESH_MS / 1000) + " s";
  } catch (e) {
    document.getElementById("updated").textContent = "could not reach the scheduler (" + e.message + "); retrying";
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}
setTimeout(refresh, document.body.dataset.drawn ? REFRESH_MS : 0);  // drawn by the server: redraw later
</script>
</body>
</html>
"""


def render(refresh_seconds: float, state: dict[str, Any] | None = None) -> str:
    """The page, with ``state`` (what ``/gpudask/json`` returns) drawn in: it reads without JavaScript."""
    page = _PAGE.replace("__REFRESH__", repr(float(refresh_seconds)))
    parts = first_paint(state) if state is not None else {**dict.fromkeys(_PARTS, ""), "SUMMARY": "loading&hellip;"}
    # one pass: a value drawn in (a worker's name) is never taken for a placeholder
    return re.sub(r"__(%s)__" % "|".join(_PARTS), lambda m: parts[m.group(1)], page)


_PARTS = ("SUMMARY", "LINKS", "PROBLEM", "WORKERS", "FINDINGS", "PROBE_SUMMARY", "PROBE", "UPDATED", "DRAWN")


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _dash(value: Any) -> str:
    return "\u2014" if value is None or value == "" else str(value)


def _el(tag: str, cls: str | None, inner: str, **attrs: str) -> str:
    attributes = (f' class="{_e(cls)}"' if cls else "") + "".join(f' {k.replace("_", "-")}="{_e(v)}"'
                                                                 for k, v in attrs.items())
    return f"<{tag}{attributes}>{inner}</{tag}>"


def _breakable(text: str) -> str:
    """A name that may wrap after its dots, dashes and underscores (never inside a word)."""
    return "<wbr>".join(_e(part) for part in re.split(r"(?<=[._-])", str(text)) if part)


def _bytes(n: float) -> str:
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return (f"{n:.2f}" if i else str(n)) + " " + units[i]


def _show(key: str, value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and re.search(r"(size|bytes|used|limit|memory|total)", key, re.I):
        return _bytes(value)
    if isinstance(value, list):
        return ", ".join(map(_js_string, value))
    return _js_string(value)  # never None: _kv leaves those out


def _js_string(value: Any) -> str:
    """A value as JavaScript's ``String(value)`` shows it (true, not True), as the page always has."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return "[object Object]" if isinstance(value, dict) else ",".join(map(_js_string, value))
    return str(value)


def _flatten(obj: Any, prefix: str, out: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    for k, v in (obj or {}).items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            _flatten(v, key, out)
        else:
            out.append((key, v))
    return out


def _kv(obj: Any, empty: str, grouped: bool = False) -> str:
    inner = ""
    for name, values in (list((obj or {}).items()) if grouped else [(None, obj)]):
        pairs = [(k, v) for k, v in _flatten(values if isinstance(values, dict) else {}, "", []) if v is not None]
        if not pairs:
            continue
        if name:
            inner += _el("div", "group", _breakable(name))
        inner += "".join(_el("div", None, _el("b", None, _breakable(f"{k}: ")) + _e(_show(k, v))) for k, v in pairs)
    return inner or _el("span", "muted", _e(empty))


def _lines(cls: str | None, items: list[tuple[str | None, Any]]) -> str:
    return _el("td", cls, "".join(_el("div", c, _e(_dash(t))) for c, t in items))


def _badge(status: Any) -> str:
    return _el("span", f"badge {status or 'none'}", _e(status or "not checked"))


def _transports(transports: dict[str, Any], missing: str) -> str:
    tls = transports.get("UCX_TLS")
    return _lines("mono", [(None, transports.get("protocol")), (None, f"UCX_TLS={tls}") if tls else ("muted", missing)])


def _worker_row(w: dict[str, Any]) -> str:
    gpu = w.get("gpu") or {}
    transports = w.get("transports") or {}
    cells = [
        _lines(None, [("worker-title", w.get("title")), ("mono muted", w.get("address")),
                      ("muted", f"gpudask {_dash(w.get('version'))}" if w.get("gpudask") else "no gpudask")]),
        _lines(None, [("gpu-name", gpu.get("name")), ("gpu-uuid mono", gpu.get("uuid")),
                      ("muted", "CUDA_VISIBLE_DEVICES=" + _dash(gpu.get("cuda_visible_devices"))),
                      ("muted", _bytes(gpu["memory_total"]) if gpu.get("memory_total") else None)]),
        _transports(transports.get("planned") or {}, "no UCX_TLS"),
        _transports(transports.get("active") or {}, "UCX_TLS not reported"),
    ]
    rows = {column: (row or {}).get("summary") for column, row in (w.get("rows") or {}).items()}
    plan = _kv(rows, "no plugin decisions") if rows or not w.get("skipped") else ""
    plan += "".join(_el("div", "skipped muted", _el("b", None, _e(f"{s.get('plugin')} skipped: ")) + _e(s.get("why")))
                    for s in w.get("skipped") or [])
    cells.append(_el("td", "kv mono", plan))
    cells.append(_el("td", "kv mono metrics", _kv(w.get("metrics"), "none reported", grouped=True)))
    cells.append(_el("td", "kv mono", _kv(w.get("applied"), "not reported")))
    check = w.get("check") or {}
    codes: dict[str, list[Any]] = {}
    for f in check.get("findings") or []:
        codes[str(f.get("code"))] = [f.get("severity"), codes.get(str(f.get("code")), [0, 0])[1] + 1]
    cells.append(_el("td", None, _badge(check.get("status")) + "".join(
        _el("div", f"mono code {severity}", _e(code + (f" \u00d7{n}" if n > 1 else ""))) for code, (severity, n) in
        codes.items())))
    return _el("tr", None, "".join(cells), data_worker=str(w.get("address")))


def _finding_rows(findings: list[dict[str, Any]], workers: list[dict[str, Any]]) -> list[str]:
    """A finding several workers share is one row naming them."""
    groups: dict[str, dict[str, Any]] = {}
    for f in findings:
        key = json.dumps([f.get("severity"), f.get("plugin"), f.get("code"), f.get("message")], default=str)
        g = groups.setdefault(key, {**f, "subjects": []})
        if f.get("subject") not in g["subjects"]:
            g["subjects"].append(f.get("subject"))
    every = sorted(str(w.get("address")) for w in workers)
    out = []
    for g in groups.values():
        everyone = len(workers) > 4 and sorted(map(str, g["subjects"])) == every
        who = (_el("td", None, _e(f"every worker ({len(g['subjects'])})")) if everyone
               else _lines("mono", [(None, s) for s in g["subjects"]]))
        out.append(_el("tr", "finding", _el("td", None, _badge(g.get("severity"))) + who
                       + _el("td", None, _e(_dash(g.get("plugin")))) + _el("td", "mono", _e(_dash(g.get("code"))))
                       + _el("td", None, _e(g.get("message")))))
    return out


def _duration(seconds: Any) -> str:
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return _dash(seconds)
    if not math.isfinite(s):
        return _dash(seconds)
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def _probe_row(p: dict[str, Any]) -> str:
    status = p.get("status")
    badge = _el("span", "badge " + ("error" if status == "failed" else "ok" if status == "ok" else "none"),
                _e(_dash(status)))
    detail = f"{_dash(p.get('error'))}; fix: {_dash(p.get('fix'))}" if status == "failed" else _dash(p.get("detail"))
    return _el("tr", "probe-path", _el("td", "mono", _e(_dash(p.get("path")))) + _el("td", None, badge)
               + _el("td", "mono", _e(_duration(p.get("seconds")))) + _el("td", None, _e(detail)))


def _empty(text: str, span: int) -> str:
    return _el("tr", None, f'<td class="muted" colspan="{span}">{_e(text)}</td>')


def first_paint(state: dict[str, Any]) -> dict[str, str]:
    """The page's parts drawn from ``state``."""
    check = state.get("check") or {}
    workers = state.get("workers") or []
    summary = (f"scheduler {(state.get('scheduler') or {}).get('address')} \u00b7 {len(workers)} worker(s) \u00b7 check: "
               + (f"{_dash(check.get('status'))} (action {_dash(check.get('action'))})" if check.get("installed")
                  else "not installed"))
    problem = " \u00b7 ".join(str(p) for p in [check.get("problem"), *(state.get("problems") or [])] if p)
    findings = _finding_rows(state.get("findings") or [], workers)
    probe = state.get("probe")
    probe_summary = ""
    if probe:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(probe.get("time") or 0)))
        probe_summary = (f"status {_dash(probe.get('status'))} \u00b7 {_dash(probe.get('array'))} over "
                         f"{_dash(probe.get('protocol'))} \u00b7 workers {', '.join(probe.get('workers') or [])}"
                         + (f" ({probe['workers_left']} probed worker(s) since left)" if probe.get("workers_left")
                            else "") + f" \u00b7 at {when}" + (f" \u00b7 {probe['problem']}" if probe.get("problem") else ""))
    paths = [_probe_row(p) for p in (probe or {}).get("paths") or []]
    return {
        "SUMMARY": _e(summary),
        "LINKS": '<a href="status">dashboard</a>' if state.get("bokeh") else "",
        "PROBLEM": _e(problem),
        "WORKERS": "".join(_worker_row(w) for w in workers) or _empty("no workers", 8),
        "FINDINGS": "".join(findings) or _empty("no findings: every worker matches the scheduler"
                                                if check.get("installed") else "the scheduler check is not installed", 5),
        "PROBE_SUMMARY": _e(probe_summary),
        "PROBE": "".join(paths) or _empty("no path probed" if probe else "no probe yet: run gpudask check --probe", 4),
        "UPDATED": _e("drawn by the scheduler at " + time.strftime("%H:%M:%S") + "; the page redraws itself"),
        "DRAWN": ' data-drawn="1"',
    }

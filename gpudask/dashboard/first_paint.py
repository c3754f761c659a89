"""The page's parts of ``/gpudask`` drawn from the state (what ``/gpudask/json`` returns), so it
reads without JavaScript.  Every value goes in through ``html.escape``."""

from __future__ import annotations

import html
import json
import math
import re
import time
from typing import Any


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


def _worker_row(w: dict[str, Any]) -> str:
    gpu = w.get("gpu") or {}
    planned = (w.get("transports") or {}).get("planned") or {}
    active = (w.get("transports") or {}).get("active") or {}
    cells = [
        _lines(None, [("worker-title", w.get("title")), ("mono muted", w.get("address")),
                      ("muted", f"gpudask {_dash(w.get('version'))}" if w.get("gpudask") else "no gpudask")]),
        _lines(None, [("gpu-name", gpu.get("name")), ("gpu-uuid mono", gpu.get("uuid")),
                      ("muted", "CUDA_VISIBLE_DEVICES=" + _dash(gpu.get("cuda_visible_devices"))),
                      ("muted", _bytes(gpu["memory_total"]) if gpu.get("memory_total") else None)]),
        _lines("mono", [(None, planned.get("protocol")), (None if planned.get("UCX_TLS") else "muted",
                         f"UCX_TLS={planned['UCX_TLS']}" if planned.get("UCX_TLS") else "no UCX_TLS")]),
        _lines("mono", [(None, active.get("protocol")), (None if active.get("UCX_TLS") else "muted",
                         f"UCX_TLS={active['UCX_TLS']}" if active.get("UCX_TLS") else "UCX_TLS not reported")]),
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

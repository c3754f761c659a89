"""The HTML of ``/gpudask``: the markup, drawn once here from the state (the first paint,
without JavaScript), and a script that redraws it from ``/gpudask/json`` every few seconds.

Kept apart from the handlers so the page can be read (and changed) as one document.  Every
value from the cluster goes into the page escaped (``html.escape`` here, ``textContent`` in
the script), never as HTML.  The Python drawing below and the script's make the same rows.
"""

from __future__ import annotations

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
const REFRESH_MS = __REFRESH__ * 1000;
const STATE_URL = location.pathname.replace(/\\/+$/, "") + "/json";

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}
// a name that may wrap after its dots, dashes and underscores (never inside a word)
function breakable(text) {
  const span = el("span");
  String(text).split(/(?<=[._-])/).forEach((part, i) => {
    if (i) span.appendChild(document.createElement("wbr"));
    span.appendChild(document.createTextNode(part));
  });
  return span;
}
// seconds as the CLI says them: 14.2 ms, 1.30 s
function duration(seconds) {
  const s = Number(seconds);
  if (seconds === null || seconds === undefined || seconds === "" || !isFinite(s)) return dash(seconds);
  return s < 1 ? (s * 1000).toFixed(1) + " ms" : s.toFixed(2) + " s";
}
function dash(value) { return value === undefined || value === null || value === "" ? "\\u2014" : value; }
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(2) : String(n)) + " " + units[i];
}
// sizes are shown in bytes units when the key says it is one
function show(key, value) {
  if (typeof value === "number" && /(size|bytes|used|limit|memory|total)/i.test(key)) return bytes(value);
  if (Array.isArray(value)) return value.join(", ");
  if (value === null || value === undefined) return "\\u2014";
  return String(value);
}
function flatten(obj, prefix, out) {
  for (const [k, v] of Object.entries(obj || {})) {
    const key = prefix ? prefix + "." + k : k;
    if (v && typeof v === "object" && !Array.isArray(v)) flatten(v, key, out); else out.push([key, v]);
  }
  return out;
}
// key: value lines, unset values left out; grouped: one heading per top-level dict (a metric)
function kv(obj, empty, grouped) {
  const td = el("td", "kv mono" + (grouped ? " metrics" : ""));
  const groups = grouped ? Object.entries(obj || {}) : [[null, obj]];
  for (const [name, values] of groups) {
    const pairs = flatten(values, "", []).filter(([k, v]) => v !== null && v !== undefined);
    if (!pairs.length) continue;
    if (name) { const head = el("div", "group"); head.appendChild(breakable(name)); td.appendChild(head); }
    for (const [k, v] of pairs) {
      const row = el("div");
      const key = el("b");
      key.appendChild(breakable(k + ": "));
      row.appendChild(key);
      row.appendChild(document.createTextNode(show(k, v)));
      td.appendChild(row);
    }
  }
  if (!td.childNodes.length) td.appendChild(el("span", "muted", empty));
  return td;
}
function badge(status) { return el("span", "badge " + (status || "none"), status || "not checked"); }
function lines(td, items) { for (const [cls, text] of items) td.appendChild(el("div", cls, dash(text))); return td; }

function workerRow(w) {
  const tr = el("tr");
  tr.dataset.worker = w.address;
  tr.appendChild(lines(el("td"), [["worker-title", w.title], ["mono muted", w.address],
    ["muted", w.gpudask ? "gpudask " + dash(w.version) : "no gpudask"]]));
  const gpu = w.gpu || {};
  tr.appendChild(lines(el("td"), [["gpu-name", gpu.name], ["gpu-uuid mono", gpu.uuid],
    ["muted", "CUDA_VISIBLE_DEVICES=" + dash(gpu.cuda_visible_devices)],
    ["muted", gpu.memory_total ? bytes(gpu.memory_total) : null]]));
  const planned = (w.transports || {}).planned || {}, active = (w.transports || {}).active || {};
  tr.appendChild(lines(el("td", "mono"), [[null, planned.protocol],
    [planned.UCX_TLS ? null : "muted", planned.UCX_TLS ? "UCX_TLS=" + planned.UCX_TLS : "no UCX_TLS"]]));
  tr.appendChild(lines(el("td", "mono"), [[null, active.protocol],
    [active.UCX_TLS ? null : "muted", active.UCX_TLS ? "UCX_TLS=" + active.UCX_TLS : "UCX_TLS not reported"]]));
  const rows = {};
  for (const [column, row] of Object.entries(w.rows || {})) rows[column] = (row || {}).summary;
  const plan = kv(rows, "no plugin decisions");
  const skipped = w.skipped || [];
  if (skipped.length && !Object.keys(rows).length) plan.replaceChildren();
  for (const s of skipped) {
    const row = el("div", "skipped muted");
    row.appendChild(el("b", null, s.plugin + " skipped: "));
    row.appendChild(document.createTextNode(s.why));
    plan.appendChild(row);
  }
  tr.appendChild(plan);
  tr.appendChild(kv(w.metrics, "none reported", true));
  tr.appendChild(kv(w.applied, "not reported"));
  const check = el("td");
  check.appendChild(badge((w.check || {}).status));
  const codes = new Map();
  for (const f of (w.check || {}).findings || []) {
    codes.set(f.code, [f.severity, (codes.get(f.code) || [0, 0])[1] + 1]);
  }
  for (const [code, [severity, n]] of codes) {
    check.appendChild(el("div", "mono code " + severity, code + (n > 1 ? " \\u00d7" + n : "")));
  }
  tr.appendChild(check);
  return tr;
}
// a finding several workers share is one row naming them
function groupFindings(findings, workers) {
  const groups = new Map();
  for (const f of findings) {
    const key = JSON.stringify([f.severity, f.plugin, f.code, f.message]);
    if (!groups.has(key)) groups.set(key, Object.assign({}, f, {subjects: []}));
    const g = groups.get(key);
    if (!g.subjects.includes(f.subject)) g.subjects.push(f.subject);
  }
  const all = workers.map(w => w.address).sort().join(" ");
  for (const g of groups.values()) {
    g.everyWorker = workers.length > 4 && g.subjects.slice().sort().join(" ") === all;
  }
  return [...groups.values()];
}
function findingRow(f) {
  const tr = el("tr", "finding");
  const sev = el("td"); sev.appendChild(badge(f.severity)); tr.appendChild(sev);
  tr.appendChild(f.everyWorker ? el("td", null, "every worker (" + f.subjects.length + ")")
                               : lines(el("td", "mono"), f.subjects.map(s => [null, s])));
  tr.appendChild(el("td", null, dash(f.plugin)));
  tr.appendChild(el("td", "mono", dash(f.code)));
  tr.appendChild(el("td", null, f.message));
  return tr;
}
function probeRow(p) {
  const tr = el("tr", "probe-path");
  tr.appendChild(el("td", "mono", dash(p.path)));
  const st = el("td"); st.appendChild(badge(p.status === "failed" ? "error" : p.status === "ok" ? "ok" : "none"));
  st.lastChild.textContent = dash(p.status);
  tr.appendChild(st);
  tr.appendChild(el("td", "mono", duration(p.seconds)));
  tr.appendChild(el("td", null, p.status === "failed" ? dash(p.error) + "; fix: " + dash(p.fix) : dash(p.detail)));
  return tr;
}
function replace(tbody, rows, emptyText, span) {
  tbody.replaceChildren(...rows);
  if (rows.length) return;
  const tr = el("tr"), td = el("td", "muted", emptyText);
  td.colSpan = span;
  tr.appendChild(td);
  tbody.appendChild(tr);
}
function draw(state) {
  const check = state.check || {};
  document.getElementById("summary").textContent = "scheduler " + state.scheduler.address + " \\u00b7 "
    + state.workers.length + " worker(s) \\u00b7 check: "
    + (check.installed ? dash(check.status) + " (action " + dash(check.action) + ")" : "not installed");
  const links = document.getElementById("links");
  links.replaceChildren();
  if (state.bokeh) { const a = el("a", null, "dashboard"); a.href = "status"; links.appendChild(a); }
  document.getElementById("problem").textContent = [check.problem].concat(state.problems || [])
    .filter(Boolean).join(" \\u00b7 ");
  replace(document.querySelector("#workers tbody"), state.workers.map(workerRow), "no workers", 8);
  replace(document.querySelector("#findings tbody"), groupFindings(state.findings || [], state.workers).map(findingRow),
          check.installed ? "no findings: every worker matches the scheduler"
                          : "the scheduler check is not installed", 5);
  const probe = state.probe;
  document.getElementById("probe-summary").textContent = probe
    ? "status " + dash(probe.status) + " \u00b7 " + dash(probe.array) + " over " + dash(probe.protocol)
      + " \u00b7 workers " + (probe.workers || []).join(", ")
      + (probe.workers_left ? " (" + probe.workers_left + " probed worker(s) since left)" : "") + " \u00b7 at "
      + new Date(probe.time * 1000).toLocaleString() + (probe.problem ? " \u00b7 " + probe.problem : "")
    : "";
  replace(document.querySelector("#probe tbody"), probe ? (probe.paths || []).map(probeRow) : [],
          probe ? "no path probed" : "no probe yet: run gpudask check --probe", 4);
}
async function refresh() {
  try {
    const response = await fetch(STATE_URL, {cache: "no-store"});
    if (!response.ok) throw new Error("HTTP " + response.status);
    draw(await response.json());
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
    """The page; with ``state`` (what ``/gpudask/json`` returns) drawn in it already, so it
    reads without JavaScript (a headless screenshot, a text browser); the script redraws it."""
    page = _PAGE.replace("__REFRESH__", repr(float(refresh_seconds)))
    from gpudask.dashboard.first_paint import first_paint

    parts = first_paint(state) if state is not None else {
        "SUMMARY": "loading&hellip;", "LINKS": "", "PROBLEM": "", "WORKERS": "", "FINDINGS": "",
        "PROBE_SUMMARY": "", "PROBE": "", "UPDATED": "", "DRAWN": ""}
    import re

    # one pass: a value drawn in (a worker's name) is never taken for a placeholder
    return re.sub(r"__(SUMMARY|LINKS|PROBLEM|WORKERS|FINDINGS|PROBE_SUMMARY|PROBE|UPDATED|DRAWN)__",
                  lambda m: parts[m.group(1)], page)

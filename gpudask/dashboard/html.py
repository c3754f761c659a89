"""The HTML of ``/gpudask``, kept apart from the handlers so it reads as one document: the
markup, drawn by the scheduler (:mod:`gpudask.dashboard.first_paint`, every value escaped),
and a script that fetches the page again every few seconds and swaps it in.
"""

from __future__ import annotations

import re
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
// the redraw is the first paint again: the scheduler draws the page (gpudask.dashboard.first_paint,
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
    """The page; with ``state`` (what ``/gpudask/json`` returns) drawn in it already, so it
    reads without JavaScript (a headless screenshot, a text browser)."""
    page = _PAGE.replace("__REFRESH__", repr(float(refresh_seconds)))
    from gpudask.dashboard.first_paint import first_paint

    parts = first_paint(state) if state is not None else {**dict.fromkeys(_PARTS, ""), "SUMMARY": "loading&hellip;"}
    # one pass: a value drawn in (a worker's name) is never taken for a placeholder
    return re.sub(r"__(%s)__" % "|".join(_PARTS), lambda m: parts[m.group(1)], page)


_PARTS = ("SUMMARY", "LINKS", "PROBLEM", "WORKERS", "FINDINGS", "PROBE_SUMMARY", "PROBE", "UPDATED", "DRAWN")

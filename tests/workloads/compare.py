"""Compare the workload suite's results across cluster forms.

    python -m tests.workloads.compare DIR/results.jsonl [...]

For each array module and workflow, every form that ran it must have passed (its value
equal to the local NumPy computation) and all their values must be equal.  Prints one
line per workflow; exit 1 on any difference or failure.

One known limitation of distributed is accepted, and said: ``rechunk_p2p_default`` on
CuPy (dask's default method, P2P, fails on CuPy chunks: distributed reads shards through
``memoryview``).  There every plain-client form (``processes``, ``dask-cuda``) may fail
with the P2P error, the form where gpudask is imported (``local``) must pass, and the
``processes`` form's client must have received gpudask's warning (stock dask-cuda has
none: its line says so).  On NumPy it is held to the rule above.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any


def load(*paths: str | pathlib.Path) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        for text in pathlib.Path(path).read_text().splitlines():
            if text.strip():
                out.append(json.loads(text))
    return out


KNOWN_P2P = "rechunk_p2p_default"
PLAIN_CLIENT_FORMS = ("processes", "dask-cuda")  # their client does not import gpudask


def _p2p_failure(run: dict[str, Any]) -> bool:
    error = run.get("error") or ""
    return run["status"] == "error" and "P2P" in error and "failed" in error


def known_p2p(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str], str]:
    """``rechunk_p2p_default`` on CuPy: ``(runs held to the usual rule, problems, note)``."""
    problems: list[str] = []
    kept: list[dict[str, Any]] = []
    notes = []
    for r in runs:
        warned = (r.get("detail") or {}).get("gpudask_warning")
        gpudask_client = str(r.get("suite", "")).endswith("-gpudask-client")  # its plan rechunks with tasks
        if r.get("form") == "processes" and not gpudask_client and not warned:
            problems.append(f"{r['suite']}: gpudask's P2P rechunk warning did not reach the client")
        if r.get("form") in PLAIN_CLIENT_FORMS and _p2p_failure(r):
            notes.append(f"{r['suite']} P2P error (known), warned: {'yes' if warned else 'no'}")
            continue
        if r.get("form") in PLAIN_CLIENT_FORMS and r["status"] == "ok":
            notes.append(f"{r['suite']} ok: P2P passed on CuPy, warned: {'yes' if warned else 'no'}")
        kept.append(r)
    return kept, problems, "; ".join(notes)


def compare(lines: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """``(report, problems)``: one report line per (array, workflow); problems, empty when all agree."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for line in lines:
        if line.get("workflow", "").endswith("-end"):
            if line.get("status") != "ok":
                problems_end = f"{line['suite']}: {line['workflow']}: {line.get('detail')}"
                groups.setdefault(("!", problems_end), [])
            continue
        groups.setdefault((line["array"], line["workflow"]), []).append(line)
    report: list[str] = []
    problems: list[str] = []
    for (array, workflow), runs in sorted(groups.items()):
        if array == "!":
            problems.append(workflow)
            continue
        note = ""
        if array == "cupy" and workflow == KNOWN_P2P:
            runs, known, note = known_p2p(runs)
            problems += [f"{array} {workflow}: {k}" for k in known]
            if known:
                note += " (problems below)"
        bad = [f"{r['suite']} {r['status']}: {r.get('error') or ''}".strip() for r in runs
               if r["status"] not in ("ok", "skipped")]
        ran = [r for r in runs if r["status"] == "ok"]
        values = {json.dumps(r.get("value"), sort_keys=True) for r in ran}
        if len(values) > 1:
            bad.append("values differ: " + "; ".join(f"{r['suite']}={json.dumps(r.get('value'))}" for r in ran))
        forms = ", ".join([f"{r['suite']} {r['status']}" for r in runs] + ([note] if note else []))
        verdict = "FAIL" if bad or (note and "problems" in note) else "known" if note else "same"
        report.append(f"{verdict:5} {array:6} {workflow:19} {forms}")
        problems += [f"{array} {workflow}: {b}" for b in bad]
    return report, problems


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.workloads.compare RESULTS.jsonl [...]", file=sys.stderr)
        return 2
    report, problems = compare(load(*argv))
    print("\n".join(report))
    for p in problems:
        print(f"problem: {p}")
    print(f"{len(report)} workflow(s) compared, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

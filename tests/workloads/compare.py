"""Compare the workload suite's results across cluster forms.

    python -m tests.workloads.compare DIR/results.jsonl [...]

For each array module and workflow, every form that ran it must have passed (its value
equal to the local NumPy computation) and all their values must be equal.  Prints one
line per workflow; exit 1 on any difference or failure.
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
        bad = [f"{r['suite']} {r['status']}: {r.get('error') or ''}".strip() for r in runs
               if r["status"] not in ("ok", "skipped")]
        ran = [r for r in runs if r["status"] == "ok"]
        values = {json.dumps(r.get("value"), sort_keys=True) for r in ran}
        if len(values) > 1:
            bad.append("values differ: " + "; ".join(f"{r['suite']}={json.dumps(r.get('value'))}" for r in ran))
        forms = ", ".join(f"{r['suite']} {r['status']}" for r in runs)
        report.append(f"{'FAIL' if bad else 'same'}  {array:6} {workflow:16} {forms}")
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

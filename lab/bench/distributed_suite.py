#!/usr/bin/env python
"""Run distributed's own tests plain and with gpudask preloaded, side by side.

Usage (from anywhere, in an environment where gpudask and distributed are installed):

    python lab/bench/distributed_suite.py /path/to/distributed-checkout [--out DIR]
        [--gpudask-ref REV] [--only test_nanny,test_local] [--k test_worker='not gather']
        [--report-only]

The checkout must be distributed's git repository at the tag of the installed
distributed (the PyPI sdist ships no tests), e.g.

    git clone https://github.com/dask/distributed /tmp/distributed-src
    git -C /tmp/distributed-src checkout "$(python -c 'import distributed; print(distributed.__version__)')"

Its test dependencies: pytest, pytest-timeout and pytest-rerunfailures (distributed's
tests use the `flaky` marker under --strict-markers). Tests needing missing optional
packages (pandas, requests, ...) skip themselves in both runs alike.

For every test file below the script runs pytest twice, one file at a time, plain and
then preloaded, so both runs of a file see the same machine load:

  plain      the environment as given, minus any DASK_DISTRIBUTED__*__PRELOAD
  preloaded  DASK_DISTRIBUTED__{SCHEDULER,WORKER,NANNY}__PRELOAD='["gpudask"]'

pytest runs in the checkout with its own conftest and pyproject settings, plus
`-p no:cacheprovider --timeout 120 --timeout-method signal` (signal: a hung test
fails alone instead of killing the whole file's run). test_worker runs without its
slow tests (distributed skips them unless --runslow); test_client runs only its
restart/plugin/preload tests. Results go to DIR (default ./distributed-suite-out):
one junit XML and one log per file and run, and summary.md with the table: per
file passed/failed/skipped plain vs preloaded, wall time each, and the tests that
pass plain and fail preloaded. --report-only rebuilds summary.md from DIR.

--gpudask-ref REV runs a snapshot of this repository at REV (git archive into
DIR/gpudask-<commit>, laid out as installed: plugins/ becomes gpudask/plugins/) put
first on PYTHONPATH, so commits landing in an editable checkout during the hour do not
mix two versions into one run. Without it the installed gpudask runs; the summary
records which one (path, commit) and says so if its checkout moved during the run.

This is a manual check, not part of CI (CI cannot fetch distributed's repository).
It takes about an hour on a 2-core machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

# (short name, path inside the checkout, -k expression or None)
TEST_FILES = [
    ("test_preload", "distributed/tests/test_preload.py", None),
    ("test_nanny", "distributed/tests/test_nanny.py", None),
    ("test_nanny_plugin", "distributed/diagnostics/tests/test_nanny_plugin.py", None),
    ("test_worker_plugin", "distributed/diagnostics/tests/test_worker_plugin.py", None),
    ("test_scheduler_plugin", "distributed/diagnostics/tests/test_scheduler_plugin.py", None),
    ("test_worker", "distributed/tests/test_worker.py", None),
    ("test_worker_memory", "distributed/tests/test_worker_memory.py", None),
    ("test_spill", "distributed/tests/test_spill.py", None),
    ("test_failed_workers", "distributed/tests/test_failed_workers.py", None),
    ("test_dask_worker", "distributed/cli/tests/test_dask_worker.py", None),
    ("test_dask_scheduler", "distributed/cli/tests/test_dask_scheduler.py", None),
    ("test_local", "distributed/deploy/tests/test_local.py", None),
    ("test_adaptive", "distributed/deploy/tests/test_adaptive.py", None),
    ("test_client", "distributed/tests/test_client.py", "restart or plugin or preload"),
]

PRELOAD_VARS = {
    "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": '["gpudask"]',
    "DASK_DISTRIBUTED__WORKER__PRELOAD": '["gpudask"]',
    "DASK_DISTRIBUTED__NANNY__PRELOAD": '["gpudask"]',
}
RUNS = ("plain", "preloaded")
PYTEST_ARGS = [
    "-p", "no:cacheprovider",
    "--timeout", "120",
    "--timeout-method", "signal",
    "--color", "no",
    "-rA",
]


REPO = Path(__file__).resolve().parents[2]  # lab/bench/ in the checkout
EXTRA_PATH: list[str] = []  # the --gpudask-ref snapshot, first on PYTHONPATH


def run_env(run: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PRELOAD_VARS}
    if EXTRA_PATH:
        env["PYTHONPATH"] = os.pathsep.join(EXTRA_PATH + [p for p in [env.get("PYTHONPATH")] if p])
    if run == "preloaded":
        env.update(PRELOAD_VARS)
    return env


def run_file(checkout: Path, out: Path, name: str, path: str, k: str | None, run: str) -> float:
    """Run one file once; record its wall time and the CPU time of pytest and the
    processes it waited for (less sensitive than wall time to a busy machine)."""
    xml = out / run / f"{name}.xml"
    log = out / run / f"{name}.log"
    xml.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", path, *PYTEST_ARGS, f"--junitxml={xml}"]
    if k:
        cmd += ["-k", k]
    start = time.monotonic()
    cpu_before = cpu_of_children()
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        subprocess.run(cmd, cwd=checkout, env=run_env(run), stdout=fh, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    (out / run / f"{name}.wall").write_text(f"{wall:.1f}\n")
    (out / run / f"{name}.cpu").write_text(f"{cpu_of_children() - cpu_before:.1f}\n")
    return wall


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def outcomes(xml: Path) -> dict[str, str]:
    """Test id -> passed/failed/skipped from a junit XML (error counts as failed)."""
    if not xml.exists():
        return {}
    result = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            result[test_id] = "failed"
        elif "skipped" in tags:
            result[test_id] = "skipped"
        else:
            result[test_id] = "passed"
    return result


def read_time(out: Path, run: str, name: str, kind: str = "wall") -> float | None:
    path = out / run / f"{name}.{kind}"
    return float(path.read_text()) if path.exists() else None


def counts(res: dict[str, str]) -> str:
    if not res:
        return "—"
    values = list(res.values())
    return "/".join(str(values.count(s)) for s in ("passed", "failed", "skipped"))


def summary(out: Path, names: list[str]) -> str:
    meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
    lines = [
        "# distributed's suite, plain vs gpudask preloaded",
        "",
        *(f"- {key}: {value}" for key, value in meta.items()),
        "",
        "p/f/s: passed/failed/skipped (errors count as failed). Wall and CPU seconds per file;",
        "CPU is pytest's and its reaped children's user+sys time.",
        "",
        "| file | plain p/f/s | preloaded p/f/s | wall plain | wall preloaded | wall ratio "
        "| CPU plain | CPU preloaded | CPU ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    regressions, fixed = [], []
    totals = {(kind, run): 0.0 for kind in ("wall", "cpu") for run in RUNS}
    both_done = True
    for name in names:
        res = {run: outcomes(out / run / f"{name}.xml") for run in RUNS}
        cells = []
        for kind in ("wall", "cpu"):
            t = {run: read_time(out, run, name, kind) for run in RUNS}
            if None in t.values():
                both_done = both_done and kind == "cpu"
                cells += [f"{t[r]:.0f}" if t[r] is not None else "—" for r in RUNS] + ["—"]
                continue
            for run in RUNS:
                totals[kind, run] += t[run]
            cells += [f"{t['plain']:.0f}", f"{t['preloaded']:.0f}", ratio(t["preloaded"], t["plain"])]
        lines.append(f"| {name} | {counts(res['plain'])} | {counts(res['preloaded'])} | " + " | ".join(cells) + " |")
        for test_id, outcome in res["plain"].items():
            other = res["preloaded"].get(test_id)
            if outcome == "passed" and other == "failed":
                regressions.append(test_id)
            if outcome == "failed" and other == "passed":
                fixed.append(test_id)
    cells = []
    for kind in ("wall", "cpu"):
        p, q = totals[kind, "plain"], totals[kind, "preloaded"]
        cells += [f"{p:.0f}", f"{q:.0f}", ratio(q, p)] if p else ["—", "—", "—"]
    lines.append("| **total** | | | " + " | ".join(cells) + " |")
    if not both_done:
        lines += ["", "(some files have not finished both runs; totals cover the finished ones)"]
    lines += ["", f"## Pass plain, fail preloaded ({len(regressions)})", ""]
    lines += [f"- `{t}`" for t in regressions] or ["none"]
    lines += ["", f"## Fail plain, pass preloaded ({len(fixed)}; flaky tests show up here)", ""]
    lines += [f"- `{t}`" for t in fixed] or ["none"]
    return "\n".join(lines) + "\n"


def ratio(preloaded: float, plain: float) -> str:
    return f"{preloaded / plain:.2f}" if plain else "—"


def snapshot(ref: str, out: Path) -> Path:
    """This repository at ``ref``, laid out like the installed package (see pyproject's
    package-dir): gpudask/, plugins/ as gpudask/plugins/, gpudask_dask_cli.py."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                            capture_output=True, text=True)
    if commit.returncode:
        sys.exit(f"distributed_suite: --gpudask-ref {ref!r} is not a commit of {REPO}")
    sha = commit.stdout.strip()
    dest = out / f"gpudask-{sha[:12]}"
    if not dest.exists():
        tmp = out / f".gpudask-{sha[:12]}.tmp"
        tmp.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", sha, "gpudask", "plugins",
                                  "gpudask_dask_cli.py"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        (tmp / "plugins").rename(tmp / "gpudask" / "plugins")
        (tmp / "COMMIT").write_text(sha + "\n")
        tmp.rename(dest)
    return dest


def gpudask_identity(checkout: Path) -> str:
    """Which gpudask the runs import (as seen from the checkout, with the runs' PYTHONPATH)."""
    # plugins load through the installed entry points: name any that resolve elsewhere
    code = ("import gpudask, gpudask.plugins, os, importlib, importlib.metadata as m; "
            "root, plugins = os.path.dirname(gpudask.__file__), os.path.dirname(gpudask.plugins.__file__); "
            "elsewhere = [e.name for e in m.entry_points(group='gpudask') if not "
            "importlib.import_module(e.value.split(':')[0]).__file__.startswith((root + os.sep, plugins + os.sep))]; "
            "print(root, plugins, gpudask.__version__, "
            "','.join(elsewhere) or '-')")
    found = subprocess.run([sys.executable, "-c", code], cwd=checkout, env=run_env("plain"),
                           capture_output=True, text=True)
    if found.returncode:
        sys.exit(f"distributed_suite: cannot import gpudask: {found.stderr.strip().splitlines()[-1]}")
    package, plugins, version, elsewhere = found.stdout.split()
    root = Path(package).parent
    if (root / "COMMIT").exists():
        where = f"snapshot of commit {(root / 'COMMIT').read_text().strip()}"
    else:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        where = (f"checkout at {head.stdout.strip()}" + (" with uncommitted changes" if dirty else "")
                 if head.returncode == 0 else "not a git checkout")
    if Path(plugins).parent != Path(package):
        where += f"; its plugins from {plugins}"
    if elsewhere != "-":
        where += f"; entry-point plugins loaded from outside it: {elsewhere}"
    return f"{version} from {package} ({where})"


def match_version(checkout: Path, distributed) -> None:
    """Give the checkout the installed version string, or stop if the code differs.

    Tests run the checkout's copy of distributed (pytest puts the checkout first on
    sys.path) while `dask worker`/`dask scheduler` subprocesses run the installed one;
    a plain git checkout has no generated _version.py and calls itself "unknown".
    """
    installed = Path(distributed.__file__).parent
    version_file = checkout / "distributed" / "_version.py"
    if not version_file.exists() and (installed / "_version.py").exists():
        version_file.write_text((installed / "_version.py").read_text())
        print(f"distributed_suite: wrote {version_file} ({distributed.__version__})")
    for module in ("scheduler.py", "worker.py", "nanny.py", "preloading.py"):
        if (installed / module).read_bytes() != (checkout / "distributed" / module).read_bytes():
            sys.exit(f"distributed_suite: {checkout} is not distributed {distributed.__version__} "
                     f"(distributed/{module} differs from the installed one); check out that tag")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkout", type=Path, help="distributed's repository at the installed tag")
    parser.add_argument("--out", type=Path, default=Path("distributed-suite-out"))
    parser.add_argument("--only", default="", help="comma-separated short names, e.g. test_nanny")
    parser.add_argument(
        "--k", action="append", default=[], metavar="NAME=EXPR",
        help="replace the -k expression of one file, e.g. --k test_worker='not gather'",
    )
    parser.add_argument("--gpudask-ref", metavar="REV",
                        help="run a snapshot of this repository at REV instead of the installed gpudask")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()

    checkout = args.checkout.resolve()
    out = args.out.resolve()
    overrides = dict(item.split("=", 1) for item in args.k)
    only = {n for n in args.only.split(",") if n}
    files = [(n, p, overrides.get(n, k)) for n, p, k in TEST_FILES if not only or n in only]
    for name, path, _ in files:
        if not (checkout / path).exists():
            sys.exit(f"distributed_suite: {checkout / path} not found; give a git checkout of "
                     "dask/distributed (the sdist has no tests)")

    if not args.report_only:
        import distributed  # the installed one, whose tag the checkout should match

        match_version(checkout, distributed)
        out.mkdir(parents=True, exist_ok=True)
        if args.gpudask_ref:
            EXTRA_PATH.append(str(snapshot(args.gpudask_ref, out)))
        gpudask_before = gpudask_identity(checkout)
        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "host": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
            "python": platform.python_version(),
            "distributed (installed)": distributed.__version__,
            "gpudask": gpudask_before,
            "checkout": str(checkout),
            "-k": {n: k for n, _, k in files if k},
        }
        (out / "meta.json").write_text(json.dumps(meta, indent=1))
        for name, path, k in files:
            for run in RUNS:
                wall = run_file(checkout, out, name, path, k, run)
                print(f"{name:24} {run:10} {wall:7.1f} s  {counts(outcomes(out / run / f'{name}.xml'))}",
                      flush=True)
        gpudask_after = gpudask_identity(checkout)
        if gpudask_after != gpudask_before:
            meta["WARNING"] = f"gpudask changed during the run; at the end: {gpudask_after}"
            (out / "meta.json").write_text(json.dumps(meta, indent=1))
    text = summary(out, [n for n, _, _ in files])
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

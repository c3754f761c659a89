#!/usr/bin/env python
"""Run distributed-ucxx's own tests plain and with gpudask preloaded, N times each; report flips.

Usage (in an environment where gpudask and distributed-ucxx are installed):

    python lab/bench/distributed_ucxx_suite.py [--runs N] [--out DIR] [--tests DIR] [-k EXPR]
        [--report-only]

distributed-ucxx installs its tests with the package (``distributed_ucxx/tests``); that
directory is run as it is (``--tests`` names another one, e.g. an sdist's).  Runs
alternate, plain then preloaded, N of each, so both modes meet the same machine load:

  plain      the environment as given, minus any DASK_DISTRIBUTED__*__PRELOAD
  preloaded  DASK_DISTRIBUTED__{SCHEDULER,WORKER,NANNY}__PRELOAD='["gpudask"]'

pytest runs with ``-p no:cacheprovider --timeout 300``, its rootdir and config in DIR
(nothing is written into site-packages).  Results: ``DIR/<mode>-<i>.{xml,log,wall}`` and
``DIR/summary.md``: per run passed/failed/skipped and wall time, then every *flip* -- a
test whose outcome is not the same in every run of both modes -- with its outcomes.
Exit status 1 when a test flips, 0 otherwise.  See docs/distributed-suite.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from distributed_suite import outcomes  # the same junit reader (this script runs from lab/bench/)

PRELOAD_VARS = {
    "DASK_DISTRIBUTED__SCHEDULER__PRELOAD": '["gpudask"]',
    "DASK_DISTRIBUTED__WORKER__PRELOAD": '["gpudask"]',
    "DASK_DISTRIBUTED__NANNY__PRELOAD": '["gpudask"]',
}
MODES = ("plain", "preloaded")


def installed_tests() -> Path:
    import distributed_ucxx

    return Path(distributed_ucxx.__file__).parent / "tests"


def run_env(mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PRELOAD_VARS}
    env.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    if mode == "preloaded":
        env.update(PRELOAD_VARS)
    return env


def run_once(tests: Path, out: Path, mode: str, i: int, k: str | None) -> float:
    ini = out / "pytest.ini"
    if not ini.exists():
        ini.write_text("[pytest]\n")  # rootdir and config here: nothing written next to the tests
    xml, log = out / f"{mode}-{i}.xml", out / f"{mode}-{i}.log"
    cmd = [sys.executable, "-m", "pytest", str(tests), "-c", str(ini), "--rootdir", str(out),
           "-p", "no:cacheprovider", "--timeout", "300", "--color", "no", "-rA", f"--junitxml={xml}"]
    if k:
        cmd += ["-k", k]
    start = time.monotonic()
    with open(log, "w") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        subprocess.run(cmd, cwd=out, env=run_env(mode), stdout=fh, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    (out / f"{mode}-{i}.wall").write_text(f"{wall:.1f}\n")
    return wall


def summary(out: Path) -> tuple[str, int]:
    runs = sorted((p.stem for p in out.glob("*-*.xml")), key=lambda s: (MODES.index(s.split("-")[0]),
                                                                       int(s.split("-")[1])))
    results = {run: outcomes(out / f"{run}.xml") for run in runs}
    lines = ["# distributed-ucxx's tests, plain and with gpudask preloaded", "",
             "| run | passed | failed | skipped | wall s |", "| --- | ---: | ---: | ---: | ---: |"]
    for run, res in results.items():
        values = list(res.values())
        wall = out / f"{run}.wall"
        lines.append(f"| {run} | {values.count('passed')} | {values.count('failed')} | {values.count('skipped')} "
                     f"| {wall.read_text().strip() if wall.exists() else '?'} |")
    tests = sorted({t for res in results.values() for t in res})
    flips = []
    for t in tests:
        seen = {run: results[run].get(t, "missing") for run in runs}
        if len(set(seen.values())) > 1:
            flips.append((t, seen))
    lines += ["", f"{len(tests)} tests; {len(flips)} flip(s) (an outcome that is not the same in every run):", ""]
    for t, seen in flips:
        lines.append(f"- `{t}`: " + ", ".join(f"{run} {outcome}" for run, outcome in seen.items()))
    return "\n".join(lines) + "\n", len(flips)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of each mode (default 1)")
    parser.add_argument("--out", type=Path, default=Path("distributed-ucxx-suite-out"))
    parser.add_argument("--tests", type=Path, default=None, help="the tests directory (default: the installed one)")
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument("--report-only", action="store_true", help="rebuild summary.md from --out")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: accepted: 1 or more")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        tests = (args.tests or installed_tests()).resolve()
        if not (tests / "conftest.py").is_file():
            parser.error(f"--tests {tests}: no conftest.py there; accepted: distributed-ucxx's tests directory")
        for i in range(args.runs):
            for mode in MODES:
                wall = run_once(tests, out, mode, i, args.k)
                print(f"{mode} run {i}: {wall:.0f} s", flush=True)
    text, flips = summary(out)
    (out / "summary.md").write_text(text)
    print(text)
    return 1 if flips else 0


if __name__ == "__main__":
    sys.exit(main())

"""dask-cuda's own ``local_cupy`` benchmark as a client of the cluster under test.

A client no one here wrote (issue 16: its dot ran 10x slower on gpudask workers than on
``dask cuda worker`` until the worker-memory plugin): ``python -m
dask_cuda.benchmarks.local_cupy --scheduler-file ...`` against the gpudask and dask-cuda
clusters of the same ``gpudask bench`` run.  Figures ``dc_local_cupy_<operation>_s``: the
wall clock of each of the benchmark's runs; its own worker-to-worker bandwidth goes to the
notes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

OPERATIONS = ("transpose_sum", "dot", "slice")
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("dask_cuda") is not None and importlib.util.find_spec("nvtx") is not None


def parse(output: str) -> dict[str, Any]:
    """The per-run wall clocks (seconds) and the p2p bandwidth lines of local_cupy's report."""
    runs: list[float] = []
    lines = output.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if re.match(r"^Wall clock\s+\|\s+Throughput", line))
    except StopIteration:
        return {"runs": [], "p2p": []}
    for line in lines[start + 2:]:
        if line.startswith("="):
            break
        m = re.match(r"^\s*([\d.]+)\s*(s|ms|us)\s*\|", line)
        if m:
            runs.append(float(m.group(1)) * _UNITS[m.group(2)])
    p2p = [re.sub(r"\s*\|\s*", " ", line).strip() for line in lines if re.match(r"^\(\d+,\d+\)\s+\|", line)]
    return {"runs": runs, "p2p": p2p}


def run(scheduler_file: str, protocol: str, operation: str, size: int, chunk: int, runs: int,
        timeout: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "dask_cuda.benchmarks.local_cupy", "--scheduler-file", scheduler_file,
            "-p", protocol, "-t", "gpu", "-o", operation, "-s", str(size), "-c", str(chunk), "--runs", str(runs)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    result = parse(out.stdout)
    result["returncode"] = out.returncode
    if out.returncode != 0 or not result["runs"]:
        result["error"] = (out.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return result

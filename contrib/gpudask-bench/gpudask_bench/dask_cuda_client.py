"""dask-cuda's own ``local_cupy`` benchmark, a client no one here wrote (issue 16: its dot ran
10x slower on gpudask workers until the worker-memory plugin), against the gpudask and dask-cuda
clusters: figures ``dc_local_cupy_<operation>_s``, its own p2p bandwidth in the notes."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

from gpudask_bench.configs import has_module

OPERATIONS = ("transpose_sum", "dot", "slice")
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}

# local_cupy's (size, chunk) per operation (3.2 GB float64 arrays on a GPU).  A bare
# "AssertionError" from local_cupy means its client found no worker (a cluster still starting):
# the caller waits for the workers first, and error_text() keeps the traceback's last frame.
SIZES = {op: (20000, 2000) for op in OPERATIONS}
QUICK_SIZES = {op: (10000, 1000) for op in OPERATIONS}


def argv(scheduler_file: str, protocol: str, operation: str, size: int, chunk: int, runs: int) -> list[str]:
    """The local_cupy command for one operation against an existing cluster.

    ``--disable-rmm``: without it local_cupy calls ``rmm.reinitialize`` (half the GPU each) on
    workers without dask-cuda's ``RMMSetup`` plugin (gpudask's), which would then run on
    dask-cuda's memory setup; ``dask cuda worker`` keeps its own setup either way."""
    return [sys.executable, "-m", "dask_cuda.benchmarks.local_cupy", "--scheduler-file", scheduler_file,
            "-p", protocol, "-t", "gpu", "-o", operation, "-s", str(size), "-c", str(chunk), "--runs", str(runs),
            "--disable-rmm"]


def error_text(stderr: str, limit: int = 400) -> str:
    """What failed, from a Python traceback on stderr: the exception line with the last frame
    (file:line and its source line) before it -- a bare ``AssertionError`` says nothing alone."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if not lines:
        return "no output"
    last = lines[-1].strip()
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    if not frames:
        return last[:limit]
    i = frames[-1]
    m = re.match(r'\s*File "([^"]+)", line (\d+)', lines[i])
    where = f"{'/'.join(m.group(1).split('/')[-3:])}:{m.group(2)}" if m else lines[i].strip()
    code = lines[i + 1].strip() if i + 1 < len(lines) - 1 else ""
    return (f"{last} at {where}" + (f" ({code})" if code and not code.startswith("^") else ""))[:limit]


def available() -> bool:
    return has_module("dask_cuda") and has_module("nvtx")


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
        timeout: float, log: str | None = None) -> dict[str, Any]:
    """Run local_cupy once for ``operation``; its whole output goes to ``log`` when given."""
    cmd = argv(scheduler_file, protocol, operation, size, chunk, runs)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        stdout, stderr, rc = out.stdout, out.stderr, out.returncode
    except subprocess.TimeoutExpired as e:
        def text(b: Any) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        stdout, stderr, rc = text(e.stdout), text(e.stderr) + f"\ntimed out after {timeout:.0f} s", None
    if log:
        with open(log, "w") as f:
            f.write(" ".join(cmd) + f"\n--- exit {rc}\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n")
    result = {**parse(stdout), "returncode": rc, "argv": cmd[3:]}
    if rc != 0 or not result["runs"]:
        result["error"] = f"timed out after {timeout:.0f} s" if rc is None else error_text(stderr)
    return result

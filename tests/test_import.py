"""`import gpudask` stays light: the CLI process of `dask worker --preload gpudask` imports it."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("cupy", "rmm", "ucxx", "numba", "cudf", "torch", "distributed", "pynvml", "cuda")


def test_import_gpudask_pulls_in_nothing_heavy():
    code = ("import sys, gpudask; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_import_in_a_plain_process_does_not_plan_or_probe():
    code = "import gpudask, gpudask.apply.process as s, os; print(s.current(), os.environ.get('GPUDASK_PROBED_FACTS'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "None None", out.stderr

"""Importing gpudask stays light: no CUDA library, no UCX, no GPU probing.

``dask worker --preload gpudask`` imports gpudask in the CLI process and in every worker;
``gpudask`` commands and plugins are imported in processes that may have no GPU at all.
Each entry point is imported first in a fresh interpreter, as it is in real use.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

ROOT = pathlib.Path(__file__).resolve().parent.parent

# what `import gpudask` (or any of the entry points below) must never pull in
FORBIDDEN = ("cupy", "rmm", "ucxx", "distributed_ucxx", "numba", "cudf", "torch", "pynvml")

ENTRY_POINTS = ["gpudask", "gpudask.cli", "gpudask.facts", "gpudask.testing", "gpudask.testing.processes"]
try:  # the bench, another distribution (contrib/gpudask-bench), when it is installed
    import gpudask_bench  # noqa: F401

    ENTRY_POINTS.append("gpudask_bench.cli")
except ImportError:
    pass
# every plugin module (loading the plugins is part of planning); the helpers a plugin
# imports inside its worker-side hooks only (spill_store) load with distributed, in workers
ENTRY_POINTS += ["gpudask.plugins." + ".".join(p.relative_to(ROOT / "plugins").with_suffix("").parts)
                 for p in sorted((ROOT / "plugins").rglob("*.py")) if p.stem != "__init__" and "\nname = " in p.read_text()]
if (ROOT / "gpudask" / "pluginapi.py").exists():
    ENTRY_POINTS.append("gpudask.pluginapi")


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_import_pulls_in_nothing_heavy(module):
    code = (f"import importlib, json, sys\nimportlib.import_module({module!r})\n"
            f"print(json.dumps([m for m in {FORBIDDEN!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_import_in_a_plain_process_does_not_plan_or_probe():
    code = "import gpudask, gpudask.apply.process as s, os; print(s.current(), os.environ.get('GPUDASK_PROBED_FACTS'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "None None", out.stderr


def test_the_runtime_imports_neither_pytest_nor_the_bench_nor_gpudask_testing():
    """pytest belongs to the pytest plugin (gpudask.testing.plugin) alone; the process helper
    runs without it (the bench imports it), and the runtime and its CLI import neither the
    testing package nor the bench (which gpudask's CLI loads only to run or list it)."""
    code = ("import importlib, json, sys\n"
            "for m in ('gpudask', 'gpudask.cli', 'gpudask.apply.preload', 'gpudask.plugins'):\n"
            "    importlib.import_module(m)\n"
            "runtime = [m for m in sys.modules if m == 'pytest' or m.startswith(('gpudask.testing', 'gpudask_bench'))]\n"
            "import gpudask.testing.processes\n"
            "print(json.dumps([runtime, 'pytest' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT / "docs")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [[], False]


def test_the_checks_package_names_every_export_once_and_each_resolves():
    """``gpudask.checks`` imports its modules on first use: its table of where each name lives,
    its ``__all__`` and the names themselves agree (a name added to one and not the other fails here)."""
    import gpudask.checks as checks

    assert sorted(checks._WHERE) == sorted(checks.__all__)
    for name in checks.__all__:
        assert getattr(checks, name) is getattr(importlib.import_module(checks._WHERE[name]), name)

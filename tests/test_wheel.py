"""`pip wheel .` gives a wheel that works on its own: installed into a fresh virtual
environment (no source tree, no editable install), it lists every built-in plugin and plans.
The bench is not in it (contrib/gpudask-bench is its own distribution): `gpudask bench` there
says in one line how to get it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]


def builtin_entry_points() -> dict[str, str]:
    """The built-in plugins: the tuple in code (gpudask.plugin.manager.BUILTIN_PLUGINS)."""
    from gpudask.plugin.manager import BUILTIN_PLUGINS

    return dict(BUILTIN_PLUGINS)


def _is_plugin(path: pathlib.Path) -> bool:
    """A plugin module names itself (``name = ...``); helpers of a plugin (spill_store) do not."""
    import ast

    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "name" for t in n.targets)
               for n in tree.body)


def test_every_plugin_module_is_an_entry_point():
    modules = {"gpudask.plugins." + ".".join(p.relative_to(ROOT / "plugins").with_suffix("").parts)
               for p in (ROOT / "plugins").rglob("*.py") if p.stem != "__init__" and _is_plugin(p)}
    assert modules == set(builtin_entry_points().values())


@pytest.mark.process
def test_wheel_installed_alone_lists_every_builtin_plugin(tmp_path):
    wheels = tmp_path / "wheels"
    # build from a copy of the tracked files: setuptools writes build/ next to the sources
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout: cannot tell the tracked files")
    import shutil

    for name in tracked:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, source / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
                           capture_output=True, text=True, timeout=280)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("gpudask-*.whl")
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = next((z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")), "")
    assert "gpudask/testing/processes.py" in names and "gpudask/testing/plugin.py" in names
    assert "gpudask/testing/hosts/hgx-4gpu-2ib.json" in names  # the example hosts, package data
    assert not [n for n in names if n.startswith(("gpudask/bench/", "gpudask_bench", "bench/", "lab/"))], "the bench or the lab is in the wheel"
    assert "bench" not in entry_points and "gpudask.commands" not in entry_points, entry_points
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True,
                             timeout=280)
    assert install.returncode == 0, install.stderr[-3000:]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(("GPUDASK_", "DASK_", "UCX_"))}
    where = tmp_path / "elsewhere"  # not the source tree: only the wheel can be imported
    where.mkdir()

    def gpudask(*args: str) -> str:
        out = subprocess.run([str(venv / "bin" / "gpudask"), *args], cwd=where, env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    origin = subprocess.run([python, "-c", "import gpudask; print(gpudask.__file__)"], cwd=where, env=env,
                            capture_output=True, text=True, timeout=60).stdout
    assert origin.startswith(str(venv)), origin
    listed = {p["name"]: p for p in json.loads(gpudask("plugins", "--json"))}
    assert set(listed) == set(builtin_entry_points())
    assert all(p["source"] == "builtin" for p in listed.values())
    table = gpudask("plugins")
    for name in builtin_entry_points():
        assert any(line.split()[:1] == [name] for line in table.splitlines()), name
    # the planning modules and the package data came along too: a described host plans
    facts = tmp_path / "host.json"
    facts.write_text((ROOT / "tests" / "hosts" / "hgx-4gpu-2ib.json").read_text())
    plan = json.loads(gpudask("info", "--facts", str(facts), "--json"))
    assert [w["gpu_index"] for w in plan["workers"]] == [0, 1, 2, 3]
    # ... and so does an example host shipped with gpudask.testing
    kit = subprocess.run([python, "-c", "from gpudask.testing import plan_for; "
                          "print([w.gpu_index for w in plan_for('hgx-4gpu-2ib').workers])"],
                         cwd=where, env=env, capture_output=True, text=True, timeout=120)
    assert kit.stdout.strip() == "[0, 1, 2, 3]", kit.stderr[-3000:]
    # without gpudask-bench: one line that says how to get the command, no usage text, exit 2
    bench = subprocess.run([str(venv / "bin" / "gpudask"), "bench", "--quick"], cwd=where, env=env,
                           capture_output=True, text=True, timeout=120)
    assert bench.returncode == 2 and bench.stdout == "", (bench.stdout, bench.stderr)
    assert bench.stderr.strip().splitlines() == [
        "gpudask: error: `gpudask bench` comes with the gpudask-bench distribution, which is not installed: "
        "python -m pip install ./contrib/gpudask-bench (in gpudask's source tree)"]
    assert "bench" not in gpudask("--help")

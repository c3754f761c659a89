"""``gpudask.testing``'s kit for a plugin's tests: plans for described hosts, facts files,
the example hosts shipped as package data -- all a plugin's tests need beside ``pluginapi``."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from conftest import HOSTS, plan_on, sections_with

ROOT = pathlib.Path(__file__).parent.parent


def test_the_example_hosts_are_package_data_and_the_tests_hosts():
    from gpudask.testing import example_host, example_hosts

    names = example_hosts()
    assert "dgx-8gpu-nvswitch-4ib" in names and len(names) >= 10
    assert names == sorted(p.stem for p in HOSTS.glob("*.json"))
    path = example_host("single-gpu")
    assert path.parent.parent == pathlib.Path(__import__("gpudask.testing").testing.__file__).parent
    assert json.loads(path.read_text())["gpus"]
    with pytest.raises(ValueError, match="no example host 'single-gpo'; accepted: cpu-ib, "):
        example_host("single-gpo")


def test_a_plan_for_a_described_host_is_the_plan_gpudask_info_prints():
    from gpudask.testing import example_host, plan_for

    for name, protocol in (("hgx-4gpu-2ib", "ucx"), ("no-gpu", "tcp")):
        path = str(example_host(name))
        assert plan_for(name, protocol, 2).to_dict() == plan_on(path, protocol, 2).to_dict()
    plan = plan_for("hgx-4gpu-2ib", "ucx", config={"gpudask.rmm.pool-size": "1GB"})
    assert {w.sections["rmm"]["initial_pool_size"] for w in plan.workers} == {10**9}


def test_facts_file_writes_a_new_file_with_the_changes(tmp_path):
    from gpudask.testing import facts_file, plan_for

    one = facts_file(tmp_path, "hgx-4gpu-2ib", sections=sections_with("hgx-4gpu-2ib.json", infiniband={"ports": []}))
    two = facts_file(tmp_path, "hgx-4gpu-2ib")
    assert one != two and json.loads(one.read_text())["sections"]["infiniband"] == {"ports": []}
    assert "rc" not in plan_for(one, "ucx").workers[0].ucx_transports
    assert "rc" in plan_for(two, "ucx").workers[0].ucx_transports
    three = facts_file(tmp_path / "new", json.loads(two.read_text()), hostname="x")
    assert three.name == "x-0.json" and json.loads(three.read_text())["gpus"]


def test_plan_for_loads_installed_plugins_only_when_asked(tmp_path, monkeypatch):
    from gpudask.testing import plan_for

    site = tmp_path / "site"
    (site / "kitplug-1.0.dist-info").mkdir(parents=True)
    (site / "kitplug-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: kitplug\nVersion: 1.0\n")
    (site / "kitplug-1.0.dist-info" / "entry_points.txt").write_text("[gpudask]\nkit = kitplug\n")
    (site / "kitplug.py").write_text("from gpudask.pluginapi import hookimpl\nname = 'kit'\n"
                                     "@hookimpl\ndef gpudask_plan_process(plan):\n    plan.note('kit', 'here')\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("GPUDASK_DISABLE_PLUGIN_AUTOLOAD")  # a plugin author's session: autoload on
    assert "kit" not in [p["name"] for p in plan_for("single-gpu").plugins]
    assert "kit" in [p["name"] for p in plan_for("single-gpu", autoload=True).plugins]
    assert "GPUDASK_DISABLE_PLUGIN_AUTOLOAD" not in os.environ  # put back as it was


def test_the_authoring_docs_test_imports_only_the_plugin_api_and_the_test_kit():
    text = (ROOT / "docs" / "plugin-authoring.md").read_text()
    section = text[text.index("## Test\n"):text.index("## Debug\n")]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    imported = {node.module for node in ast.walk(ast.parse(code)) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Import) for a in node.names}
    assert {m for m in imported if m and m.startswith("gpudask")} == {"gpudask.testing"}


def test_importing_the_kit_imports_no_more_of_gpudask():
    code = ("import sys; import gpudask; before = set(sys.modules); import gpudask.testing, gpudask.testing.plans; "
            "print(sorted(m for m in set(sys.modules) - before if m.startswith(('gpudask', 'dask', 'distributed'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "['gpudask.testing', 'gpudask.testing.plans']"


@pytest.mark.process
def test_stop_leaves_alone_a_process_that_got_a_stopped_ones_pid(tmp_path):
    """A process started by the kit that exited and was reaped gives its pid back to the kernel;
    stopping its cluster later signalled whatever process had that pid (on a busy CI machine, a
    worker of another test, which died with an empty log).  Its own live processes still stop."""
    from gpudask.testing.processes import spawn, stop

    gone = spawn(["true"], os.environ, tmp_path / "gone.log", tmp_path)
    gone.wait(timeout=30)
    time.sleep(0.1)  # a reused pid comes after a wrap of the pid space: a later start (ticks of 10 ms)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # not the kit's
    mine = spawn(["sleep", "60"], os.environ, tmp_path / "mine.log", tmp_path)
    try:
        gone.pid = other.pid  # as if the kernel had given the reaped pid to that process
        assert stop([gone, mine], grace=0.2) == []
        assert mine.poll() is not None
        assert other.poll() is None  # the other process lives on
    finally:
        other.kill()
        other.wait()

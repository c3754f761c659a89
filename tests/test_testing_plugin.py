"""The ``gpudask.testing`` pytest plugin, used the way a third-party plugin's tests use it:
docs/testing.md's example module run by pytest in a folder of its own (its conftest.py
enables the plugin, a facts file describes the host) on real processes; the clean-up it
promises; the one-line refusals of the factory."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from conftest import HOSTS, base_env

ROOT = pathlib.Path(__file__).parents[1]
DOC = ROOT / "docs" / "testing.md"


def _doc_example() -> str:
    """The block of docs/testing.md that is a test module."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    (module,) = [b for b in blocks if "def test_" in b]
    return module


def _run_pytest(where: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(where),
                           "-c", str(where / "pytest.ini"), *args], cwd=where, env=base_env(), capture_output=True,
                          text=True, timeout=240)


@pytest.fixture
def project(tmp_path: pathlib.Path) -> pathlib.Path:
    """A plugin package's tests folder: conftest.py enabling the plugin, a facts file."""
    where = tmp_path / "project"
    where.mkdir()
    (where / "pytest.ini").write_text("[pytest]\n")
    (where / "conftest.py").write_text('pytest_plugins = ["gpudask.testing.plugin"]\n')
    shutil.copy(HOSTS / "workstation-2gpu-pcie.json", where / "host.json")
    return where


@pytest.mark.process
def test_the_documented_example_passes_on_real_processes_and_keeps_the_logs(project, tmp_path):
    (project / "test_example.py").write_text(_doc_example())
    logs = tmp_path / "logs"
    out = _run_pytest(project, "--gpudask-keep-logs", str(logs))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "1 passed" in out.stdout
    kept = logs / "test_each_worker_gets_its_own_gpu"
    assert sorted(p.name for p in kept.iterdir()) == ["scheduler.log", "worker.log"]
    assert "gpudask" in (kept / "worker.log").read_text()


@pytest.mark.process
def test_every_process_a_test_started_is_gone_after_it(project):
    """The test leaves its pids and the factory's refusals behind; after pytest returns, none
    of the pids (scheduler, the nanny host, the worker processes) runs."""
    (project / "test_left_running.py").write_text('''
import json, pathlib, psutil, pytest

def test_starts_two_clusters_and_returns(gpudask_cluster_factory, tmp_path_factory):
    a = gpudask_cluster_factory()
    b = gpudask_cluster_factory("second")
    with pytest.raises(ValueError, match="a second cluster needs a name"):
        gpudask_cluster_factory()
    with pytest.raises(ValueError, match="accepted: a new folder name"):
        gpudask_cluster_factory("second")
    pids = []
    for c in (a, b):
        c.scheduler()
        c.worker("--nworkers", "2")
        with c.client() as client:
            client.wait_for_workers(2, timeout=60)
            pids += list(client.run(__import__("os").getpid).values())
        pids += [p.pid for p in c.procs]
    assert b.tmp_path.name == "second" and a.tmp_path != b.tmp_path
    pathlib.Path(__file__).with_name("pids.json").write_text(json.dumps(pids))
''')
    out = _run_pytest(project)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    import json

    import psutil

    pids = json.loads((project / "pids.json").read_text())
    assert len(pids) == 2 * (2 + 2)  # per cluster: two workers, the scheduler, the dask worker process
    running = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert running == []

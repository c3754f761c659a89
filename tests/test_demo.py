"""`gpudask demo`, the README's first command, as a newcomer runs it."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

# the demo takes 8786/8787 when they are free: one test process runs every demo (pytest-xdist)
pytestmark = pytest.mark.xdist_group("default-ports")

ROOT = pathlib.Path(__file__).parent.parent


@contextlib.contextmanager
def held(port: int):
    """Keep ``port`` taken on every interface while the block runs (someone else may hold it already)."""
    sock = socket.socket()
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen()
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        sock.close()  # taken by another process: just as good
        sock = None
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # it is really in use
        yield
    finally:
        if sock is not None:
            sock.close()


@pytest.mark.process
def test_demo_uses_free_ports_when_8786_and_8787_are_taken():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "DASK_", "GPUDASK_"))}
    with held(8786), held(8787):
        out = subprocess.run([sys.executable, "-m", "gpudask.cli", "demo", "--nworkers", "1", "--json"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["workers"] == 1 and report["backend"] in ("NumPy", "CuPy")
    assert not report["scheduler"].endswith(":8786") and ":8787/" not in report["dashboard"]
    assert "already in use" not in out.stderr and "8787" not in out.stderr, out.stderr


@pytest.mark.process
def test_demo_prints_its_pages_while_the_cluster_runs_and_says_when_it_has_closed():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "DASK_", "GPUDASK_"))}
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "demo", "--nworkers", "1"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    closed = next(i for i, line in enumerate(lines) if line.startswith("cluster closed"))
    urls = [i for i, line in enumerate(lines) if "http://" in line]
    assert urls and max(urls) < closed  # no address of a cluster already gone
    assert any(lines[i].strip().split()[0].endswith("/gpudask") for i in urls)
    report = json.loads(subprocess.run([sys.executable, "-m", "gpudask.cli", "demo", "--nworkers", "1", "--json"],
                                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=240).stdout)
    assert report["gpudask_page"].endswith("/gpudask") and report["gpudask_page_status"] == 200
    if not report["bokeh"]:
        assert "needs bokeh, not installed here: pip install bokeh" in out.stdout


@pytest.mark.process
def test_demo_keep_shows_the_table_before_it_waits_and_does_not_suggest_itself_again():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "DASK_", "GPUDASK_"))}
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "demo", "--nworkers", "2", "--keep", "1"], cwd=ROOT,
                         env={**env, "COLUMNS": "100"}, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    table = lines.index("What every plugin decided (full reasons: gpudask info --reasons):")
    kept = next(i for i, line in enumerate(lines) if line.startswith("the cluster stays up 1 s (--keep 1)"))
    assert table < kept < len(lines) - 1 and lines[-1] == "cluster closed (its pages with it)"
    assert "--keep 60" not in out.stdout
    # a decision both workers share is one row
    whys = [line for line in lines[table:kept] if line.startswith("all ")]
    assert whys and not any(line.startswith(("0 ", "1 ")) and line[2:].strip() in {w[4:].strip() for w in whys}
                            for line in lines[table:kept])

"""Two Python processes each running ``LocalGPUCluster(n_workers=1)`` on one 2-GPU host
(issue 32): each numbers its workers from 0, so both workers are planned on GPU 0; the
second process says so in one warning naming the first."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import base_env, host

TWO_GPUS = host("workstation-2gpu-pcie.json")

SCRIPT = """
import sys, time
from gpudask import LocalGPUCluster

if __name__ == "__main__":
    with LocalGPUCluster(n_workers=1, dashboard_address=None) as cluster:
        print("READY", flush=True)
        if sys.argv[1] == "hold":
            time.sleep(60)
"""


@pytest.mark.process
def test_a_second_local_gpu_cluster_on_the_same_gpus_says_so(tmp_path):
    (tmp_path / "one.py").write_text(SCRIPT)
    env = base_env(GPUDASK_FACTS=TWO_GPUS, TMPDIR=str(tmp_path))
    env.pop("XDG_RUNTIME_DIR", None)
    first = subprocess.Popen([sys.executable, "one.py", "hold"], cwd=str(tmp_path), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert first.stdout.readline().strip() == "READY"
        out = subprocess.run([sys.executable, "one.py", "go"], cwd=str(tmp_path), env=env, capture_output=True,
                             text=True, timeout=120)
    finally:
        first.kill()
        first.wait()
    assert out.returncode == 0, out.stderr[-3000:]
    # before: both workers on GPU 0, no word
    lines = [x for x in out.stderr.splitlines() if "another gpudask process on this host" in x]
    assert len(lines) == 1, out.stderr[-3000:]
    assert f"(pid {first.pid}) already runs workers on GPU(s) 0: this LocalGPUCluster's 1 worker(s) share them" \
        in lines[0], lines[0]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]

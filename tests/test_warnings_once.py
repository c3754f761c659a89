"""Every gpudask warning about the host or the command line is said once per command, not once
per worker process (issue 42: "3 workers on 2 GPUs" three times, the InfiniBand warning 2-3 times).

A described 2-GPU host without InfiniBand (GPUDASK_FACTS), three workers, InfiniBand asked for:
two host warnings, each one line in the command's output."""

from __future__ import annotations

import collections
import importlib.util
import re
import subprocess
import sys

import pytest

from conftest import base_env, host

TWO_GPUS = host("workstation-2gpu-pcie.json")  # 2 GPUs over PCIe, no InfiniBand port
SHARED = "3 workers on 2 visible GPU(s): GPUs are shared round-robin"
NO_IB = "but this host has no active InfiniBand port: UCX uses its other transports"


def _warnings(log: str) -> collections.Counter[str]:
    """Each gpudask warning about the host or the command line in a log, the time stamp and
    process cut off, counted (the scheduler check's findings, one per worker, are not these)."""
    said: collections.Counter[str] = collections.Counter()
    for line in log.splitlines():
        m = re.search(r"(gpudask: warning: .*|- WARNING - gpudask: .*)", line)
        if m:
            said[m.group(1).split(" - WARNING - ", 1)[-1]] += 1
    return said


def _once(said: collections.Counter[str], *expected: str) -> None:
    for text in expected:
        lines = [line for line in said if text in line]
        assert len(lines) == 1 and said[lines[0]] == 1, (text, dict(said))
    repeated = {line: n for line, n in said.items() if n > 1}
    assert not repeated, repeated


needs_ucx = pytest.mark.skipif(importlib.util.find_spec("distributed_ucxx") is None,
                               reason="distributed-ucxx is not installed")


@pytest.mark.process
@pytest.mark.ucx_client  # its Client opens UCX in the test process
@needs_ucx
def test_dask_worker_with_three_workers_on_a_described_host_says_each_host_warning_once(cluster):
    env = base_env(GPUDASK_FACTS=TWO_GPUS, DASK_GPUDASK__TRANSPORT__INFINIBAND="true")
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cluster.worker("--nworkers", "3", "--nthreads", "1", "--preload", "gpudask", env=env)
    with cluster.client() as client:
        client.wait_for_workers(3, timeout=120)
    _once(_warnings(cluster.log("worker")), SHARED, NO_IB)
    _once(_warnings(cluster.log("scheduler")), NO_IB)  # the scheduler's own command: its InfiniBand warning
    # gpudask left the CUDA transports out of UCX_TLS itself (the host is described, this machine has
    # no GPU): the check does not tell the user to unset a UCX_TLS they never set, once per worker
    assert "leaves out cuda_ipc" not in cluster.log("scheduler"), cluster.log("scheduler")


@pytest.mark.process
@needs_ucx
def test_local_gpu_cluster_with_three_workers_on_a_described_host_says_each_host_warning_once(tmp_path):
    script = tmp_path / "three.py"
    script.write_text(
        "import gpudask\n"
        "if __name__ == '__main__':\n"
        "    with gpudask.LocalGPUCluster(n_workers=3, protocol='ucx', dashboard_address=':0') as c:\n"
        "        c.wait_for_workers(3, timeout=120)\n"
        "        print('STARTED', len(c.workers))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=str(tmp_path),
                         env=base_env(GPUDASK_FACTS=TWO_GPUS, DASK_GPUDASK__TRANSPORT__INFINIBAND="true"))
    assert "STARTED 3" in out.stdout, out.stderr[-3000:]
    _once(_warnings(out.stdout + out.stderr), SHARED, NO_IB)

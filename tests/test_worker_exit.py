"""A gpudask worker process leaves within the time its nanny gives it (issue 42: the demo over UCX
ended with "Worker process still alive after 4.0 seconds, killing", once per worker).

The nanny waits 0.8 x its close timeout for the worker process to exit after the Worker has
closed; the time went to CPython's finalization collecting every object of the spawned process
(gpudask.apply.process._end_without_collecting_everything)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent

# Two workers closed by nannies given 1 s: they must exit within 0.8 s of the stop message.  On an
# idle 2-core host the two nannies closed in 1.46-1.54 s with the finalization collecting everything
# (the workers killed), in 0.11-0.13 s without; LocalCluster's close gives 4 s, which a busy host's
# 2.5-3.9 s of finalization came near or passed.
CLOSE_TIGHT = r"""
import asyncio, sys, time
import gpudask
from distributed import Client, LocalCluster

if __name__ == "__main__":
    protocol = sys.argv[1]
    gpudask.initialize(protocol=protocol, nworkers=2)
    kwargs = gpudask.cluster_kwargs(n_workers=2, protocol=protocol, scheduler_port=0, dashboard_address=":0",
                                    silence_logs=False)
    with LocalCluster(**kwargs) as cluster:
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=120)
            import dask.array as da
            x = da.random.random((2000, 2000), chunks=500)  # the demo's kind of work: arrays, a P2P rechunk
            assert float(x.rechunk((2000, 125)).sum().compute()) > 0
        started = time.perf_counter()
        cluster.sync(lambda: asyncio.gather(*(w.close(timeout=1) for w in cluster.workers.values())))
        print(f"nannies closed in {time.perf_counter() - started:.2f} s", flush=True)
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "DASK_", "GPUDASK_"))}


@pytest.mark.process
@pytest.mark.parametrize("protocol", ["tcp", "ucx"])
def test_worker_processes_exit_before_their_nanny_kills_them(protocol, tmp_path):
    if protocol == "ucx" and importlib.util.find_spec("distributed_ucxx") is None:
        pytest.skip("distributed-ucxx is not installed")
    script = tmp_path / "close_tight.py"
    script.write_text(CLOSE_TIGHT)
    out = subprocess.run([sys.executable, str(script), protocol], cwd=tmp_path, env=_env(), capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "nannies closed in" in out.stdout
    assert out.stderr.count("Worker closed") == 2, out.stderr[-3000:]  # each Worker closed itself ...
    assert "still alive" not in out.stderr and "killing" not in out.stderr, out.stderr[-3000:]  # ... and its process left


@pytest.mark.process
@pytest.mark.xdist_group("default-ports")  # with tests/test_demo.py: the demo takes 8786/8787 when free
def test_demo_over_ucx_closes_its_cluster_without_killing_a_worker():
    if importlib.util.find_spec("distributed_ucxx") is None:
        pytest.skip("distributed-ucxx is not installed")
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "demo", "--protocol", "ucx", "--nworkers", "2"],
                         cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1].startswith("cluster closed")
    both = out.stdout + out.stderr
    assert "still alive" not in both and "killing" not in both, out.stderr[-3000:]

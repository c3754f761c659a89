"""A described GPU host (``GPUDASK_FACTS``) over UCX starts on a CPU, as docs/facts.md promises.

The plan of the described host is applied in each live process but for the hardware that is not
this machine's: no CUDA transport or CUDA context (distributed-ucxx's init_once failed on
NVML), no InfiniBand transport, ports or rdmacm (UCX found no listener).  Real `dask scheduler` /
`dask worker` processes and a ``LocalGPUCluster`` over UCX on TCP; the plans themselves
(``gpudask info --facts``) are unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import cloudpickle
import pytest
from conftest import base_env, host, tracebacks_but_ucx_registration_close

from plugins.ucx.rules import without

cloudpickle.register_pickle_by_value(sys.modules[__name__])

DGX = host("dgx-8gpu-nvswitch-4ib.json")  # 8 GPUs over NVSwitch, 4 InfiniBand ports
TWO_GPUS = host("workstation-2gpu-pcie.json")
CUDA = frozenset({"cuda", "cuda_copy", "cuda_ipc", "gdr_copy"})


def ucx_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in base_env().items() if not k.startswith("UCX_") or k == "UCX_WARN_UNUSED_ENV_VARS"}
    env.update(extra)
    return env


@pytest.mark.parametrize("tls, expected", [
    ("tcp,cuda_copy,cuda_ipc", "tcp"), ("rc,tcp,cuda_copy,cuda_ipc", "rc,tcp"), ("cuda_copy", "tcp"),
    ("all", "^cuda"), ("^rc", "^rc,cuda"), ("^cuda", None), ("tcp", None), (None, None), ("", None),
    ("TCP,CUDA", "tcp"),
])
def test_the_cuda_transports_are_taken_out_of_ucx_tls_in_ucx_syntax(tls, expected):
    assert without(tls, CUDA, "cuda") == expected


def live_ucx() -> dict:
    """What UCX and dask's config of this process say (run in the workers and the scheduler)."""
    import dask
    import ucxx

    config = ucxx.get_config()
    return {"TLS": config.get("TLS"), "SOCKADDR_TLS_PRIORITY": config.get("SOCKADDR_TLS_PRIORITY"),
            "env": {k: v for k, v in os.environ.items() if k.startswith("UCX_")},
            "context": dask.config.get("distributed-ucxx.create-cuda-context", None)}


@pytest.mark.process
@pytest.mark.ucx_client
def test_a_described_dgx_scheduler_and_workers_start_over_ucx_on_a_cpu(cluster):
    """`dask scheduler --protocol ucx --preload gpudask` with a DGX described died on NVML's
    traceback (and, for the InfiniBand part, on "cannot create listener"); now the scheduler
    and its workers run, each saying in its plan what it left out and why."""
    env = ucx_env(GPUDASK_FACTS=DGX)
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(2, timeout=120)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        live = client.run(live_ucx)
        scheduler_live = client.run_on_scheduler(live_ucx)
        assert client.submit(sum, [1, 2], pure=False).result(timeout=60) == 3
    planned = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--facts", DGX, "--protocol", "ucx",
                              "--nworkers", "2", "--json"], capture_output=True, text=True, timeout=120, env=env)
    described_plan = json.loads(planned.stdout)
    assert "cuda_ipc" in described_plan["workers"][0]["env"]["UCX_TLS"]  # the described host's plan, unchanged
    assert "UCX_NET_DEVICES" in described_plan["workers"][0]["env"]
    for address, w in workers.items():
        plan = w["gpudask"]["plan"]
        assert plan["env"]["UCX_TLS"] == "tcp" == live[address]["TLS"], (plan["env"], live[address])
        assert "UCX_NET_DEVICES" not in live[address]["env"] and live[address]["context"] is False
        assert not CUDA & set(plan["ucx_transports"])
        left_out = {r["decision"]: r["why"] for r in plan["reasons"] if r["decision"].startswith("no ")
                    and r["decision"].endswith(" in UCX here")}
        assert set(left_out) == {"no GPU in UCX here", "no InfiniBand in UCX here"}, plan["reasons"]
        assert all(f"the host is described ({DGX})" in why for why in left_out.values())
        assert "CUDA_VISIBLE_DEVICES" in plan["env"]  # the rest of the plan is applied as planned
    assert scheduler_live["TLS"] == "tcp" and scheduler_live["SOCKADDR_TLS_PRIORITY"] != "rdmacm"
    log = cluster.log("scheduler") + cluster.log("worker")
    assert tracebacks_but_ucx_registration_close(log) == [] and "NVMLError" not in log


@pytest.mark.process
def test_a_local_gpu_cluster_of_a_described_host_starts_over_ucx_on_a_cpu(tmp_path):
    """``GPUDASK_FACTS=<GPU host> LocalGPUCluster(protocol="ucx")`` ended in "Cluster failed to
    start" (NVMLError_Uninitialized in distributed-ucxx's init_once)."""
    script = tmp_path / "local.py"
    script.write_text(textwrap.dedent("""
        import json, os
        import gpudask
        from distributed import Client

        if __name__ == "__main__":
            with gpudask.LocalGPUCluster(protocol="ucx") as cluster, Client(cluster) as client:
                tls = client.run(lambda: os.environ.get("UCX_TLS"))
                print(json.dumps({"workers": sorted(tls), "tls": sorted(set(tls.values())),
                                  "result": client.submit(lambda x: x + 1, 1).result(timeout=60)}))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                         env=ucx_env(GPUDASK_FACTS=TWO_GPUS), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(report["workers"]) == 2 and all(w.startswith("ucx://") for w in report["workers"])
    assert report["tls"] == ["tcp"] and report["result"] == 2


_REGISTRATION_RACE = """\
2026-12-02 20:17:49,057 - distributed.core - INFO - Lost connection to 'ucx://127.0.0.1:53919'
Traceback (most recent call last):
  File "/venv/distributed_ucxx/ucxx.py", line 534, in read
    await self.ep.recv(msg)
ucxx.UCXXCanceledError: Request canceled

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/venv/distributed/scheduler.py", line 4811, in add_nanny
    await comm.read()
distributed.comm.core.CommClosedError: Connection closed by writer
2026-12-02 20:17:49,308 - distributed.worker - INFO - Run out-of-band function 'live_ucx'
"""


def test_only_the_ucx_registration_close_race_is_left_out_of_a_logs_tracebacks():
    ours = ("x - INFO - planned\nTraceback (most recent call last):\n  File \"/gpudask/a.py\", line 1, in f\n"
            "pynvml.NVMLError_Uninitialized: Uninitialized\nx - INFO - next\n")
    assert tracebacks_but_ucx_registration_close(_REGISTRATION_RACE) == []
    found = tracebacks_but_ucx_registration_close(_REGISTRATION_RACE + ours)
    assert len(found) == 1 and found[0].endswith("NVMLError_Uninitialized: Uninitialized")
    elsewhere = _REGISTRATION_RACE.replace("in add_nanny", "in add_worker")
    assert len(tracebacks_but_ucx_registration_close(elsewhere)) == 1

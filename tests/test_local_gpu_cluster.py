"""``LocalGPUCluster`` takes what a ``LocalCUDACluster`` user types: each dask-cuda argument
becomes its gpudask setting, or is refused in one line naming what to use instead."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import base_env, host

import gpudask
from gpudask.errors import ConfigError

TWO_GPUS = host("workstation-2gpu-pcie.json")

SCRIPT = """
import json

import dask

if __name__ == "__main__":
    import gpudask
    from distributed import Client

    keys = ("gpudask.rmm.pool-size", "gpudask.spill.device-memory-limit", "gpudask.spill.log",
            "gpudask.transport.tcp", "gpudask.rmm.allocator")
    with gpudask.LocalGPUCluster(n_workers=1, rmm_pool_size="1GB", device_memory_limit="2GB", rmm_async=False,
                                 rmm_managed_memory=False, enable_tcp_over_ucx=True, log_spilling=True,
                                 jit_unspill=False, pre_import="json", dashboard_address=":0") as cluster, \\
            Client(cluster) as client:
        (w,) = client.scheduler_info(n_workers=-1)["workers"].values()
        out = {"sections": w["gpudask"]["plan"]["sections"],
               "worker_config": list(client.run(lambda: [dask.config.get(k, None) for k in keys]).values())[0],
               "preloads": list(client.run(lambda dask_worker: [p.name for p in dask_worker.preloads]).values())[0],
               "client_config": [dask.config.get(k, None) for k in keys]}
    print("RESULT " + json.dumps(out))
"""


@pytest.mark.process
def test_local_gpu_cluster_takes_local_cuda_cluster_arguments_as_gpudask_settings(tmp_path):
    script = tmp_path / "cuda_args.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                         env=base_env(GPUDASK_FACTS=TWO_GPUS), cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.split("RESULT ", 1)[1])
    rmm, spill = result["sections"]["rmm"], result["sections"]["spill"]
    assert rmm["allocator"] == "pool" and rmm["initial_pool_size"] == 10**9
    assert spill["device_memory_limit"] == 2 * 10**9
    # the worker process runs with the settings (rmm_async=False: dask-cuda's default, nothing set) ...
    assert result["worker_config"] == ["1GB", "2GB", True, True, None]
    assert result["preloads"] == ["gpudask", "json"]  # pre_import, after gpudask
    # ... and the client's own dask config is left as it was
    assert result["client_config"] == [None, None, False, None, None]


@pytest.mark.parametrize("kwargs, says", [
    ({"jit_unspill": True}, "jit_unspill=True (a dask-cuda LocalCUDACluster argument) is not supported by "
                            "LocalGPUCluster; instead: gpudask has no JIT-unspill proxy objects; spilling is "
                            "gpudask.spill.device-memory-limit"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "instead: set the CUDA_VISIBLE_DEVICES environment variable of this process"),
    ({"shared_filesystem": True}, "shared_filesystem=True"),
    # blamed on the keyword typed, not on "dask config"
    ({"rmm_pool_size": "lots"}, "gpudask.rmm.pool-size = 'lots' (from LocalGPUCluster(rmm_pool_size='lots')) is "
                                "not valid; accepted: a size"),
    ({"device_memory_limit": "1 parsec"}, "gpudask.spill.device-memory-limit = '1 parsec' (from "
                                          "LocalGPUCluster(device_memory_limit='1 parsec'))"),
    ({"rmm_pol_size": "1GB"}, "rmm_pol_size: not an argument of LocalCluster, Nanny or Worker (did you mean "
                              "rmm_pool_size?); accepted: theirs, and in LocalGPUCluster dask-cuda's LocalCUDACluster "
                              "arguments (cudf_spill_stats, device_memory_limit, enable_cudf_spill,"),
    # a plugin's refusal, raised in its hook: the setting's own line, no PluginError chain
    ({"device_memory_limit": "500GB"}, "gpudask.spill.device-memory-limit = '500GB' (from "
                                       "LocalGPUCluster(device_memory_limit='500GB')) = 500000000000 bytes is more "
                                       "than GPU 0"),
])
def test_local_gpu_cluster_refuses_what_has_no_gpudask_equivalent_in_one_line_before_starting(monkeypatch, kwargs,
                                                                                              says):
    monkeypatch.setenv("GPUDASK_FACTS", TWO_GPUS)
    with pytest.raises(ConfigError) as e:
        gpudask.LocalGPUCluster(n_workers=0, dashboard_address=":0", **kwargs)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert e.value.__cause__ is None and (e.value.__context__ is None or e.value.__suppress_context__)  # no chain
    assert "gpudask plugin" not in str(e.value)


@pytest.mark.process
def test_gpu_keywords_on_a_host_without_a_gpu_warn_once_per_plugin(tmp_path):
    script = tmp_path / "no_gpu.py"
    script.write_text(
        "import gpudask\n"
        "if __name__ == '__main__':\n"
        "    with gpudask.LocalGPUCluster(n_workers=1, dashboard_address=':0', rmm_pool_size='1GB',\n"
        "                                 rmm_managed_memory=True, enable_nvlink=True,\n"
        "                                 enable_tcp_over_ucx=True) as c:\n"
        "        print('STARTED', len(c.workers))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                         env=base_env(GPUDASK_FACTS=host("no-gpu.json")), cwd=str(tmp_path))
    assert "STARTED 1" in out.stdout, out.stderr[-3000:]
    lines = [line.split(" - WARNING - ", 1)[1] for line in out.stderr.splitlines() if "no effect" in line]
    # the UCX transport keywords over tcp: one line for both (the protocol is the first reason)
    assert sorted(lines) == [
        "gpudask: enable_tcp_over_ucx=True, enable_nvlink=True have no effect: the protocol is tcp, and UCX "
        "transports apply only over UCX (--protocol ucx, a ucx:// scheduler)",
        "gpudask: rmm_pool_size='1GB', rmm_managed_memory=True have no effect: plugin rmm is skipped in every "
        "worker (no GPU visible: no RMM pool)"], out.stderr[-3000:]


def test_an_argument_whose_plugin_is_disabled_is_refused_naming_the_setting(monkeypatch):
    monkeypatch.setenv("GPUDASK_FACTS", TWO_GPUS)
    monkeypatch.setenv("GPUDASK_DISABLE_PLUGINS", "rmm")
    with pytest.raises(ConfigError, match=r"rmm_pool_size='1GB' sets gpudask.rmm.pool-size, which no loaded gpudask "
                                          r"plugin provides"):
        gpudask.LocalGPUCluster(n_workers=0, rmm_pool_size="1GB")


def _migration_rows() -> dict[str, str]:
    """docs/migrating-from-dask-cuda.md's LocalCUDACluster table: argument -> its gpudask cell."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parent.parent / "docs" / "migrating-from-dask-cuda.md").read_text()
    table = text.split("## `LocalCUDACluster` parameters", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2:
            for name in re.findall(r"`([A-Za-z_]+)`", cells[0]):
                rows[name] = cells[1]
    return rows


def test_the_migration_guide_lists_every_argument_the_plugins_declare_with_its_setting(monkeypatch):
    from gpudask.compat import dask_cuda

    monkeypatch.setenv("GPUDASK_FACTS", TWO_GPUS)
    table = dask_cuda.table()
    rows = _migration_rows()
    # the plugins declare them: rmm's, spill's and the transports' arguments are all there
    assert {"rmm_pool_size", "rmm_async", "device_memory_limit", "enable_nvlink", "enable_rdmacm"} <= set(table.arguments)
    for arg in table.arguments.values():
        assert arg.name in rows and f"`{arg.key}" in rows[arg.name], (arg.name, arg.key)
    for name in table.refused:
        assert name in rows and "refused" in rows[name], name


def test_a_refusal_and_a_setting_of_a_disabled_plugin_are_still_named(monkeypatch):
    from gpudask.compat import dask_cuda

    monkeypatch.setenv("GPUDASK_FACTS", TWO_GPUS)
    monkeypatch.setenv("GPUDASK_DISABLE_PLUGINS", "spill")
    with pytest.raises(ConfigError, match=r"jit_unspill=True \(a dask-cuda LocalCUDACluster argument\) is not "
                                          r"supported by LocalGPUCluster; instead: gpudask has no JIT-unspill"):
        gpudask.LocalGPUCluster(n_workers=0, jit_unspill=True)
    with pytest.raises(ConfigError, match=r"device_memory_limit='2GB' sets gpudask.spill.device-memory-limit, which "
                                          r"no loaded gpudask plugin provides"):
        gpudask.LocalGPUCluster(n_workers=0, device_memory_limit="2GB")
    # the arguments a refusal line offers are the loaded plugins' only
    assert "device_memory_limit" not in dask_cuda.accepted_names() and "rmm_pool_size" in dask_cuda.accepted_names()
    kwargs = {"rmm_async": True, "rmm_allocator_external_lib_list": "cupy, torch", "jit_unspill": False,
              "device_memory_limit": None, "n_workers": 0}
    assert dask_cuda.take_arguments(kwargs) == (
        {"gpudask.rmm.allocator": "async", "gpudask.rmm.libraries": ["cupy", "torch"]},
        {"gpudask.rmm.allocator": "rmm_async=True", "gpudask.rmm.libraries": "rmm_allocator_external_lib_list='cupy, torch'"})
    assert kwargs == {"n_workers": 0}


def test_a_plugins_refusal_is_one_exception_not_a_chain_blaming_the_plugin(monkeypatch):
    """It was two tracebacks ending in "PluginError: gpudask plugin 'tcp' (from gpudask)
    failed in gpudask_validate: ..." for a protocol the host cannot run."""
    monkeypatch.setenv("GPUDASK_FACTS", host("ucx-missing.json"))
    with pytest.raises(ConfigError) as e:
        gpudask.LocalGPUCluster(n_workers=0, dashboard_address=":0", protocol="ucx")
    assert str(e.value).startswith("protocol 'ucx' needs distributed-ucxx, which is not installed on no-ucx")
    assert e.value.__cause__ is None and e.value.__suppress_context__

"""gpudask-prometheus: metric families from real gpudask plans, and /metrics of a real cluster.

Runs without a GPU: the hosts are described by facts files (schema 2).
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

# distributed's defaults enter dask.config at its import: imported before _isolated saves the config,
# or the first test to import it leaves the next ones a config without them (KeyError: 'distributed')
import distributed  # noqa: F401
import pytest

import gpudask_prometheus as plugin

prometheus_client = pytest.importorskip("prometheus_client")


def _facts(tmp_path, gpus=2):
    data = {
        "schema": 2, "hostname": "test-host", "cpu_count": 16,
        "driver_version": "580.1" if gpus else None, "cuda_driver_version": 13000 if gpus else None,
        "gpus": [{"index": i, "uuid": f"GPU-0000000{i}-0000-0000-0000-000000000000", "name": "NVIDIA Test",
                  "memory_total": 16 * 2**30, "compute_capability": [9, 0], "pci_bus_id": None, "pci_path": None,
                  "numa_node": None, "cpu_affinity": list(range(8 * i, 8 * i + 8)),
                  "mig": {"enabled": False, "instances": []}} for i in range(gpus)],
        "net_interfaces": {"lo": ["127.0.0.1"]}, "cuda_visible_devices": None,
        "sections": {"nvlink": {"peers": {}}, "infiniband": {"ports": []},
                     "ucx_info": {"transports": ["self", "tcp", "cuda_copy"]}},
        "packages": {"distributed": "2026.7.1", "dask": "2026.7.1", "rmm": "26.10.0", "cupy": "14.2.0"},
    }
    path = tmp_path / f"host-{gpus}.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    import dask.config

    monkeypatch.setenv("GPUDASK_DISABLE_PLUGIN_AUTOLOAD", "1")
    for name in [n for n in os.environ if n.startswith(("GPUDASK_", "DASK_GPUDASK__")) and
                 n != "GPUDASK_DISABLE_PLUGIN_AUTOLOAD"]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    saved = copy.deepcopy(dask.config.config)
    yield
    dask.config.config.clear()
    dask.config.config.update(saved)


def _published(facts_path, index):
    """What a worker's gpudask publishes, computed the same way, with this plugin loaded."""
    from gpudask.apply.process import Session, plan_host

    host = plan_host("tcp", 2, facts_path=facts_path, extra_plugins=[plugin])
    return Session("worker", host, host.for_role("worker", index)).published()


def _text(families):
    class Fixed:
        def collect(self):
            return families

    registry = prometheus_client.CollectorRegistry()
    registry.register(Fixed())
    return prometheus_client.generate_latest(registry).decode()


def test_worker_metrics_from_a_real_plan(tmp_path, monkeypatch):
    (tmp_path / "gpudask.toml").write_text('[rmm]\npool-size = "1GB"\n')
    published = _published(_facts(tmp_path), 1)
    text = _text(plugin.worker_metrics(published, "dask_gpudask"))
    assert ('dask_gpudask_worker_info{cuda_visible_devices="1,0",facts="' in text)
    assert 'gpu="GPU-00000001-0000-0000-0000-000000000000",gpu_name="NVIDIA Test",index="1"' in text
    assert ('dask_gpudask_worker_gpu_memory_total_bytes{gpu="GPU-00000001-0000-0000-0000-000000000000"} '
            '1.7179869184e+10') in text
    assert 'dask_gpudask_worker_memory_pool_bytes{allocator="pool",size="initial"} 1e+09' in text
    assert "dask_gpudask_worker_visible_gpus 2.0" in text
    assert 'dask_gpudask_worker_plugin_info{plugin="prometheus",source="registered"} 900.0' in text
    assert 'dask_gpudask_worker_decisions{plugin="gpu-pinning",skipped="false"}' in text
    assert "dask_gpudask_worker_needs_restart 0.0" in text


def test_cluster_metrics_per_worker_with_check_findings(tmp_path):
    facts = _facts(tmp_path)
    workers = {
        "tcp://10.0.0.1:1": {"gpudask": _published(facts, 0),
                             "gpudask-check": {"status": "warning", "findings": [
                                 {"severity": "warning", "code": "x", "message": "m"}]}},
        "tcp://10.0.0.1:2": {"gpudask": _published(facts, 1), "gpudask-check": {"status": "ok", "findings": []}},
        "tcp://10.0.0.2:3": {},  # a stock worker: no gpudask
    }
    text = _text(plugin.cluster_metrics(workers, "dask_gpudask"))
    assert 'dask_gpudask_cluster_info{cuda_visible_devices="0,1",facts=' in text
    assert 'worker="tcp://10.0.0.1:2"} 1.0' in text
    assert 'dask_gpudask_cluster_workers{gpudask="yes"} 2.0' in text
    assert 'dask_gpudask_cluster_workers{gpudask="no"} 1.0' in text
    assert 'dask_gpudask_cluster_check_findings{severity="warning",worker="tcp://10.0.0.1:1"} 1.0' in text
    assert 'dask_gpudask_cluster_check_status{worker="tcp://10.0.0.1:1"} 2.0' in text
    assert 'dask_gpudask_cluster_check_status{worker="tcp://10.0.0.1:2"} 0.0' in text


def test_turned_off_by_setting(tmp_path, monkeypatch):
    """gpudask.prometheus.enabled=false: the preload hook registers nothing."""
    from gpudask.apply.process import plan_host

    monkeypatch.setenv("DASK_GPUDASK__PROMETHEUS__ENABLED", "false")
    host = plan_host("tcp", 1, facts_path=_facts(tmp_path), extra_plugins=[plugin])
    before = dict(plugin._COLLECTORS)
    plugin.gpudask_server_setup(host.ctx, host.workers[0], server=object())
    assert plugin._COLLECTORS == before


# ------------------------------------------------------------------- a real cluster
def _installed() -> bool:
    return any(ep.value == "gpudask_prometheus" for ep in importlib.metadata.entry_points(group="gpudask"))


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


@pytest.mark.skipif(not _installed(), reason="pip install -e contrib/gpudask-prometheus first")
def test_metrics_endpoints_of_a_real_cluster(tmp_path):
    from distributed import Client

    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUDASK_", "DASK_GPUDASK__"))}
    env.update(PYTHONUNBUFFERED="1", GPUDASK_GROUP=f"prom-{os.getpid()}")
    sched_file = tmp_path / "scheduler.json"
    procs = []
    try:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address",
             "127.0.0.1:0", "--scheduler-file", str(sched_file), "--preload", "gpudask"],
            env=env, cwd=tmp_path, stdout=open(tmp_path / "s.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True))
        deadline = time.time() + 60
        while not sched_file.exists() and time.time() < deadline:
            time.sleep(0.1)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "dask", "worker", "--scheduler-file", str(sched_file), "--host", "127.0.0.1",
             "--nworkers", "2", "--preload", "gpudask", "--death-timeout", "60"],
            env={**env, "GPUDASK_FACTS": _facts(tmp_path)}, cwd=tmp_path, stdout=open(tmp_path / "w.log", "w"),
            stderr=subprocess.STDOUT, start_new_session=True))
        with Client(scheduler_file=str(sched_file), timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
            info = client.scheduler_info(n_workers=-1)
            sched_text = _get(f"http://127.0.0.1:{info['services']['dashboard']}/metrics")
            assert 'dask_gpudask_cluster_workers{gpudask="yes"} 2.0' in sched_text
            for address, w in info["workers"].items():
                assert f'worker="{address}"' in sched_text
                port = w["services"]["dashboard"]
                text = _get(f"http://127.0.0.1:{port}/metrics")
                index = w["gpudask"]["plan"]["index"]
                cvd = "0,1" if index == 0 else "1,0"
                assert f'cuda_visible_devices="{cvd}"' in text and f'index="{index}"' in text
                assert 'dask_gpudask_worker_plugin_info{plugin="prometheus",source="entry point"} 900.0' in text
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

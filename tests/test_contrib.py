"""Third-party plugin packages: the two examples in contrib/, installed for real.

Installs contrib/gpudask-torch-rmm and contrib/gpudask-prometheus with pip into a
private folder that only these tests put on ``PYTHONPATH`` (so the rest of the suite, and
the environment, never see them), then checks what any third-party plugin gets: found through the ``gpudask`` entry point
group, ordered by priority, listed by ``gpudask plugins``, turned off by
``GPUDASK_DISABLE_PLUGINS`` / ``gpudask.plugins.disable``, its hooks run in the right
processes of a real cluster, its decisions in the plan reasons and its metrics on the
``/metrics`` endpoints.  Also runs each package's own tests.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import urllib.request

import pytest
from conftest import base_env

# every test here starts dask processes; one test process runs them all (pytest-xdist), so the
# packages are installed once (the module fixture below)
pytestmark = [pytest.mark.process, pytest.mark.xdist_group("contrib-installed")]

ROOT = pathlib.Path(__file__).parents[1]
CONTRIB = ROOT / "contrib"
PACKAGES = {"gpudask-torch-rmm": ("torch-rmm", 110), "gpudask-prometheus": ("prometheus", 900),
            "gpudask-gds": ("gds", 130)}


SITE: pathlib.Path | None = None  # where the fixture installed the two packages
SOURCES: pathlib.Path | None = None  # copies of contrib/*: pip and pytest write next to the sources


def install_command(target: pathlib.Path) -> list[str]:
    """pip install of every package into ``target`` in one pip run, without build isolation when this
    environment can build the packages itself (setuptools >= 70.1, or setuptools >= 64 with wheel)."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
           *(str(SOURCES / dist) for dist in PACKAGES)]
    try:
        import setuptools

        version = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
        has_wheel = importlib.util.find_spec("wheel") is not None
        if version >= (70, 1) or (version >= (64, 0) and has_wheel):
            cmd.insert(4, "--no-build-isolation")
    except (ImportError, ValueError):
        pass
    return cmd


# session-wide: xdist's loadgroup keeps these tests on one test process, but may run another
# module's tests between them, which ended a module fixture (two installs, 19 s each)
@pytest.fixture(scope="session", autouse=True)
def contrib_installed(tmp_path_factory):
    global SITE, SOURCES
    SITE = tmp_path_factory.mktemp("contrib-site")
    SOURCES = tmp_path_factory.mktemp("contrib-src")
    for dist in PACKAGES:
        shutil.copytree(CONTRIB / dist, SOURCES / dist,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"))
    out = subprocess.run(install_command(SITE), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"installing contrib/{', '.join(PACKAGES)} failed:\n{out.stdout}\n{out.stderr}"
    for dist in PACKAGES:
        assert list(SITE.glob(dist.replace("-", "_") + "-*.dist-info")), dist
    yield
    SITE = SOURCES = None


def contrib_env(**extra: str) -> dict[str, str]:
    """A process environment in which the contrib packages are installed, and loaded by name
    (the test session's autoload is off: other installed plugins stay out)."""
    env = base_env(**{"GPUDASK_LOAD_PLUGINS": "torch-rmm,prometheus,gds", **extra})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH", "")) if p)
    return env


def gpudask_cli(*args: str, env: dict[str, str] | None = None, cwd: str | None = None) -> str:
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", *args], capture_output=True, text=True, timeout=120,
                         env=env or contrib_env(), cwd=cwd)
    assert out.returncode == 0, out.stderr
    return out.stdout


def plugins(env: dict[str, str] | None = None, cwd: str | None = None) -> list[dict]:
    return json.loads(gpudask_cli("plugins", "--json", env=env, cwd=cwd))


def test_found_ordered_by_priority_and_listed():
    listed = plugins()
    by_name = {p["name"]: p for p in listed}
    for dist, (name, priority) in PACKAGES.items():
        assert by_name[name]["source"] == "entry point" and by_name[name]["distribution"] == dist
        assert by_name[name]["priority"] == priority
    assert by_name["torch-rmm"]["hooks"] == ["gpudask_config_options", "gpudask_facts_packages", "gpudask_plan_finish",
                                            "gpudask_plan_process", "gpudask_setup_memory"]
    assert by_name["gds"]["hooks"] == ["gpudask_facts_sections", "gpudask_plan_process"]
    order = [(p["priority"], p["name"]) for p in listed]
    assert order == sorted(order)
    names = [p["name"] for p in listed]
    assert names.index("rmm") < names.index("torch-rmm") < names.index("scheduler-parity") < names.index("prometheus")
    table = gpudask_cli("plugins")
    assert "entry point (gpudask-torch-rmm)" in table and "entry point (gpudask-prometheus)" in table


def test_disabled_by_environment_config_and_autoload(tmp_path):
    names = [p["name"] for p in plugins(contrib_env(GPUDASK_DISABLE_PLUGINS="torch-rmm"))]
    assert "torch-rmm" not in names and "prometheus" in names
    names = [p["name"] for p in plugins(contrib_env(DASK_GPUDASK__PLUGINS__DISABLE="prometheus"))]
    assert "prometheus" not in names and "torch-rmm" in names
    elsewhere = tmp_path / "project"
    elsewhere.mkdir()
    (elsewhere / "gpudask.toml").write_text('[plugins]\ndisable = ["torch-rmm", "prometheus"]\n')
    names = [p["name"] for p in plugins(cwd=str(elsewhere))]
    assert "torch-rmm" not in names and "prometheus" not in names
    autoloaded = contrib_env(GPUDASK_DISABLE_PLUGIN_AUTOLOAD="0")
    del autoloaded["GPUDASK_LOAD_PLUGINS"]
    assert {"torch-rmm", "prometheus"} <= {p["name"] for p in plugins(autoloaded)}
    autoloaded["GPUDASK_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    assert all(p["source"] == "builtin" for p in plugins(autoloaded))
    # their settings are in `gpudask config` only while they are loaded
    rows = {r["key"] for r in json.loads(gpudask_cli("config", "--json"))}
    assert {"gpudask.torch-rmm.enabled", "gpudask.prometheus.enabled"} <= rows


def test_decision_in_gpudask_info_for_a_described_host(tmp_path):
    facts = _facts_with_torch(tmp_path)
    plan = json.loads(gpudask_cli("info", "--json", "--facts", facts))
    for worker in plan["workers"]:
        asks, reason = [r for r in worker["reasons"] if r["plugin"] == "torch-rmm"]
        assert asks["decision"] == "asks rmm: allocates_through=['torch']"  # rmm learns it through the plan
        assert worker["requests"] == {"rmm": {"torch-rmm": {"allocates_through": ["torch"]}}}
        assert reason["decision"] == "torch allocator: rmm"
    off = json.loads(gpudask_cli("info", "--json", "--facts", facts,
                                 env=contrib_env(DASK_GPUDASK__TORCH_RMM__ENABLED="false")))
    (reason,) = [r for r in off["workers"][0]["reasons"] if r["plugin"] == "torch-rmm"]
    assert reason == {"plugin": "torch-rmm", "decision": "skipped",
                      "why": "gpudask.torch-rmm.enabled is false (from $DASK_GPUDASK__TORCH_RMM__ENABLED)"}


def _facts_with_torch(tmp_path) -> str:
    """The 2-GPU workstation, with torch installed (the plugin's condition) and GPUDirect
    Storage (gds's own facts section)."""
    data = json.loads((ROOT / "tests" / "hosts" / "workstation-2gpu-pcie.json").read_text())
    data["packages"]["torch"] = "2.9.0"
    data["sections"] = {"gds": {"nvidia_fs": "2.17.5", "cufile_json": None}}
    path = tmp_path / "workstation-with-torch.json"
    path.write_text(json.dumps(data))
    return str(path)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def test_hooks_run_in_the_right_processes_of_a_real_cluster(cluster, tmp_path):
    facts = _facts_with_torch(tmp_path)
    env = contrib_env(GPUDASK_FACTS=facts, GPUDASK_TRACE_PLUGINS="1")
    cluster.scheduler("--preload", "gpudask", "--dashboard-address", "127.0.0.1:0", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        info = client.scheduler_info(n_workers=-1)
        pids = client.run(os.getpid)
        scheduler_metrics = _get(f"http://127.0.0.1:{info['services']['dashboard']}/metrics")
        worker_metrics = {a: _get(f"http://127.0.0.1:{w['services']['dashboard']}/metrics")
                          for a, w in info["workers"].items()}
    for address, w in info["workers"].items():
        published = w["gpudask"]
        # listed in the worker's published plugins, with its priority and distribution
        listed = {p["name"]: p for p in published["plugins"]}
        assert listed["torch-rmm"]["distribution"] == "gpudask-torch-rmm"
        assert listed["prometheus"]["source"] == "entry point"
        # its decision is in the plan reasons; its worker hook ran in that worker process
        reasons = [r for r in published["plan"]["reasons"] if r["plugin"] == "torch-rmm"]
        assert [r["decision"] for r in reasons] == ["asks rmm: allocates_through=['torch']", "torch allocator: rmm"]
        # gds's own fact crossed to the worker process with the facts; its decision took effect there
        assert published["facts"]["sections"]["gds"] == {"nvidia_fs": "2.17.5", "cufile_json": None}
        assert published["plan"]["env"]["KVIKIO_COMPAT_MODE"] == "OFF" == published["applied"]["env"]["KVIKIO_COMPAT_MODE"]
        memory = published["memory"]["torch-rmm"]
        assert memory["pid"] == pids[address]
        assert memory["torch_allocator"] == "default" and memory["why"].startswith("host described by")
        # the worker's /metrics has gpudask's view of this worker
        index = published["plan"]["index"]
        text = worker_metrics[address]
        assert f'index="{index}"' in text and f'cuda_visible_devices="{"0,1" if index == 0 else "1,0"}"' in text
        assert 'dask_gpudask_worker_plugin_info{plugin="torch-rmm",source="entry point"} 110.0' in text
        assert 'dask_gpudask_cluster_info{' in scheduler_metrics and f'worker="{address}"' in scheduler_metrics
    assert 'dask_gpudask_cluster_workers{gpudask="yes"} 2.0' in scheduler_metrics
    assert "dask_gpudask_cluster_check_status{" in scheduler_metrics
    # traced hook calls: memory setup in the worker processes only; preload hooks where they belong
    scheduler_log, worker_log = cluster.log("scheduler"), cluster.log("worker")
    assert "gpudask_setup_memory -> torch-rmm" not in scheduler_log
    assert worker_log.count("gpudask_setup_memory -> torch-rmm role=worker") == 2
    assert "gpudask_server_setup -> prometheus role=scheduler" in scheduler_log
    assert worker_log.count("gpudask_server_setup -> prometheus role=worker") == 2


def test_disabled_plugin_stays_out_of_a_real_cluster(cluster, tmp_path):
    env = contrib_env(GPUDASK_FACTS=_facts_with_torch(tmp_path), GPUDASK_DISABLE_PLUGINS="torch-rmm,prometheus")
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", env=env)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        (w,) = client.scheduler_info(n_workers=-1)["workers"].values()
    names = [p["name"] for p in w["gpudask"]["plugins"]]
    assert "torch-rmm" not in names and "prometheus" not in names
    assert "torch-rmm" not in w["gpudask"]["memory"]
    assert not [r for r in w["gpudask"]["plan"]["reasons"] if r["plugin"] == "torch-rmm"]


@pytest.mark.parametrize("dist", sorted(PACKAGES))
def test_the_packages_own_tests_pass(dist):
    env = contrib_env()
    # a package's tests register their own module: its installed copy is not loaded by name
    # beside it (as in a plugin author's checkout: autoload off, nothing named)
    del env["GPUDASK_LOAD_PLUGINS"]
    # their real-cluster test is the same as test_hooks_run_in_the_right_processes_of_a_real_cluster
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not real_cluster",
                          "tests"],
                         cwd=SOURCES / dist, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout

"""Shared fixtures: described hosts, real subprocess clusters on loopback, GPU detection."""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys

import distributed  # noqa: F401 - its config defaults must exist before any test snapshots dask.config
import pytest

from gpudask.bench.processes import ProcessCluster

HOSTS = pathlib.Path(__file__).parent / "hosts"
BIN = pathlib.Path(sys.executable).parent


@functools.cache
def real_gpu_count() -> int:
    """GPUs NVML sees on this machine (0 without a driver). Never creates a CUDA context."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    if real_gpu_count():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _clean_gpudask_env(monkeypatch, tmp_path):
    """Tests start from the user's view: no gpudask bookkeeping from a parent, no cached facts."""
    for name in list(os.environ):
        if name.startswith("GPUDASK_") or name.startswith("DASK_GPUDASK__"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no stray gpudask.toml
    import copy

    import dask.config

    from gpudask import facts

    saved_config, saved_defaults = copy.deepcopy(dask.config.config), copy.deepcopy(dask.config.defaults)
    facts.clear_cache()
    yield
    facts.clear_cache()
    # planning registers plugin defaults and applies plans: each test starts from the same config
    dask.config.config.clear()
    dask.config.config.update(saved_config)
    dask.config.defaults[:] = saved_defaults


def host(name: str) -> str:
    return str(HOSTS / name)


def described(tmp_path: pathlib.Path, base: str, **changes) -> str:
    """A described host derived from one in tests/hosts (a new file each time: facts are cached by path)."""
    data = json.loads((HOSTS / base).read_text())
    data.update(changes)
    path = tmp_path / f"host-{len(list(tmp_path.glob('host-*.json')))}.json"
    path.write_text(json.dumps(data))
    return str(path)


def plan_on(facts: str, protocol: str, nworkers: int | None = None, **config):
    """``gpudask info`` in-process: the host plan for a facts file, with dask config set."""
    import dask.config

    from gpudask.session import plan_host

    with dask.config.set(config):
        return plan_host(protocol, nworkers, facts_path=facts)


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUDASK_", "DASK_GPUDASK__"))}
    env.update(PYTHONUNBUFFERED="1", UCX_WARN_UNUSED_ENV_VARS="n", DASK_DISTRIBUTED__WORKER__DAEMON="False")
    env.update(extra)
    return env


class Cluster(ProcessCluster):
    """Real `dask scheduler` / `dask worker` processes on 127.0.0.1, logs and scheduler file
    in ``tmp_path``: the process helper `gpudask bench` uses, with the tests' environment
    (:func:`base_env` at start time) unless a test gives its own."""

    def __init__(self, tmp_path: pathlib.Path):
        super().__init__(tmp_path)
        self.tmp_path = tmp_path

    def spawn(self, label: str, argv: list[str], env: dict[str, str] | None = None,
              cwd: str | None = None) -> subprocess.Popen:
        return super().spawn(label, argv, base_env() if env is None else env, cwd)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()

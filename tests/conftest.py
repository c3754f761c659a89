"""Shared fixtures: described hosts, real subprocess clusters on loopback, GPU detection."""

from __future__ import annotations

import functools
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import distributed  # noqa: F401 - its config defaults must exist before any test snapshots dask.config
import pytest

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

    from gpudask.apply.process import plan_host

    with dask.config.set(config):
        return plan_host(protocol, nworkers, facts_path=facts)


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUDASK_", "DASK_GPUDASK__"))}
    env.update(PYTHONUNBUFFERED="1", UCX_WARN_UNUSED_ENV_VARS="n", DASK_DISTRIBUTED__WORKER__DAEMON="False")
    env.update(extra)
    return env


class Cluster:
    """A real `dask scheduler` + `dask worker` pair of processes on 127.0.0.1."""

    def __init__(self, tmp_path: pathlib.Path):
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []
        self.scheduler_file = str(tmp_path / "scheduler.json")
        self.logs: dict[str, pathlib.Path] = {}

    def _spawn(self, label: str, args: list[str], env: dict[str, str], cwd: str | None = None) -> subprocess.Popen:
        log = self.tmp_path / f"{label}.log"
        self.logs[label] = log
        proc = subprocess.Popen(args, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                cwd=cwd or str(self.tmp_path), start_new_session=True)
        self.procs.append(proc)
        return proc

    def scheduler(self, *extra: str, env: dict[str, str] | None = None, protocol: str = "tcp",
                  cwd: str | None = None) -> subprocess.Popen:
        args = [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                "--protocol", protocol, "--scheduler-file", self.scheduler_file, *extra]
        proc = self._spawn("scheduler", args, env or base_env(), cwd)
        deadline = time.time() + 60
        while not os.path.exists(self.scheduler_file):
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("scheduler did not start:\n" + self.log("scheduler"))
            time.sleep(0.1)
        return proc

    def worker(self, *extra: str, env: dict[str, str] | None = None, label: str = "worker",
               cwd: str | None = None) -> subprocess.Popen:
        # loopback, unless the test names the interface itself (dask refuses both)
        where = [] if "--interface" in extra else ["--host", "127.0.0.1"]
        args = [sys.executable, "-m", "dask", "worker", "--scheduler-file", self.scheduler_file, *where,
                "--no-dashboard", "--death-timeout", "60", *extra]
        return self._spawn(label, args, env or base_env(), cwd)

    def client(self, timeout: float = 30):
        from distributed import Client

        return Client(scheduler_file=self.scheduler_file, timeout=timeout)

    @property
    def address(self) -> str:
        return json.loads(pathlib.Path(self.scheduler_file).read_text())["address"]

    def log(self, label: str) -> str:
        path = self.logs.get(label)
        return path.read_text() if path and path.exists() else ""

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()

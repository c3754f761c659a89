"""Pools planned for the GPU, not for what is free at the moment (plugins/rmm/shares.py, setup.py).

A default pool is half of the GPU's total memory split between every worker on it: this
command's, and those of this user's other gpudask commands on the host, counted from their
host plans in the state directory -- at plan time and again when each worker starts, so a
worker that restarts (or is killed) counts the same and gets the same pool.  A starting worker
waits, bounded, while its predecessor's memory is released, and when memory really is short
one line names who holds it (NVML's process list).

Plan and unit tests run on described hosts and real host-plan files of real (sleeping)
processes; the wait is driven by a scripted reading of the GPU's free memory (the hardware);
the process test starts two ``dask worker`` commands on a described host.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from conftest import HOSTS, base_env, host, plan_on

from gpudask.errors import GpudaskError
from gpudask.plugins.rmm import shares
from gpudask.plugins.rmm import setup as rmm_setup

GiB = 2**30
H200_TOTAL = json.loads((HOSTS / "h200-single.json").read_text())["gpus"][0]["memory_total"]
H200_UUID = json.loads((HOSTS / "h200-single.json").read_text())["gpus"][0]["uuid"]
HOSTNAME = json.loads((HOSTS / "h200-single.json").read_text())["hostname"]


@pytest.fixture
def own_state(tmp_path, monkeypatch):
    """A private state directory of this test (TMPDIR), so the host plans written are its own."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.delenv(shares.PLAN_ENV, raising=False)
    monkeypatch.delenv(shares.GROUP_ENV, raising=False)
    from gpudask.facts import statedir

    return statedir.state_dir()


@pytest.fixture
def sleeper():
    """Live processes standing in for other gpudask commands (their pids own the host plans)."""
    procs: list[subprocess.Popen] = []

    def start() -> int:
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        procs.append(p)
        return p.pid

    yield start
    for p in procs:
        p.kill()
        p.wait()


def write_plan(state, pid: int, workers: int, uuid: str = H200_UUID, hostname: str = HOSTNAME,
               started: int | None = None) -> None:
    """A host plan of another command: ``workers`` workers planned on GPU ``uuid``, the first
    ``started`` of them (default: all) started (their slot files, as gpudask/apply/runtime.py
    leaves them)."""
    doc = {"format": 1, "facts": {"hostname": hostname, "gpus": [{"uuid": uuid, "index": 0}]},
           "workers": [{"role": "worker", "index": i, "gpu": uuid} for i in range(workers)]}
    path = state / f"plan-{pid}.json"
    path.write_text(json.dumps(doc))
    os.chmod(path, 0o600)
    group = state / f"pid-{pid}"
    group.mkdir(mode=0o700, exist_ok=True)
    for i in range(workers if started is None else started):
        (group / f"slot-{i}.lock").touch(mode=0o600)


# --------------------------------------------------------------------------- counting other commands
def test_other_commands_are_counted_from_their_host_plans(own_state, sleeper):
    a, b = sleeper(), sleeper()
    write_plan(own_state, a, 1)
    write_plan(own_state, b, 3)
    write_plan(own_state, sleeper(), 2, uuid="GPU-other")
    write_plan(own_state, sleeper(), 5, hostname="another-host")
    assert shares.other_commands(HOSTNAME) == {H200_UUID: {a: 1, b: 3}, "GPU-other": {max(
        pid for pid in shares.other_commands(HOSTNAME)["GPU-other"]): 2}}
    assert shares.other_commands(HOSTNAME, exclude={b})[H200_UUID] == {a: 1}


def test_only_started_workers_are_counted(own_state, sleeper):
    """A client that planned (gpudask.initialize()) but started no worker counts nothing; a
    command with 1 of its 4 workers started so far counts 1."""
    client, command = sleeper(), sleeper()
    write_plan(own_state, client, 2, started=0)
    write_plan(own_state, command, 4, started=1)
    assert shares.other_commands(HOSTNAME) == {H200_UUID: {command: 1}}


def test_dead_reused_and_broken_plans_are_not_counted(own_state, sleeper):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_plan(own_state, dead.pid, 4)
    reused = sleeper()
    write_plan(own_state, reused, 4)
    past = time.time() - 3600  # written an hour before that process started: its pid was reused
    os.utime(own_state / f"plan-{reused}.json", (past, past))
    broken = sleeper()
    (own_state / f"plan-{broken}.json").write_text("{not json")
    os.chmod(own_state / f"plan-{broken}.json", 0o600)
    shared = sleeper()
    write_plan(own_state, shared, 1)
    os.chmod(own_state / f"plan-{shared}.json", 0o666)  # others may write it: never trusted
    assert shares.other_commands(HOSTNAME) == {}


def test_the_facts_probe_counts_other_commands(own_state, sleeper, monkeypatch):
    from gpudask.facts import load_facts
    from gpudask.plugins.rmm import shares as rmm_facts

    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML here: free memory unknown
    pid = sleeper()
    write_plan(own_state, pid, 2)
    assert rmm_facts.probe(load_facts(host("h200-single.json"))) == {
        "memory_free": {}, "other_workers": {"0": {str(pid): 2}}}


# --------------------------------------------------------------------------- counted again at start
def _section(tmp_path, **config):
    h = plan_on(str(HOSTS / "h200-single.json"), "tcp", 1, **{"gpudask.rmm.allocator": "pool", **config})
    return h, dict(h.workers[0].sections["rmm"])


def test_a_worker_counts_the_commands_started_after_its_own(own_state, sleeper, tmp_path):
    """The first command planned 0.5 of the GPU for its one worker; a second command with one
    worker on the GPU since: at its (re)start the worker's pool is 0.5 / 2 -- every time."""
    h, memory = _section(tmp_path)
    assert memory["initial_pool_size"] == H200_TOTAL // 2 // 256 * 256 and memory["share"]["workers"] == 1
    ctx = h.ctx
    plan = h.workers[0]
    assert rmm_setup._recount(ctx, plan, memory) == (memory, None)  # alone: as planned
    second = sleeper()
    write_plan(own_state, second, 1)
    sizes = set()
    for _restart in range(10):
        recounted, line = rmm_setup._recount(ctx, plan, memory)
        sizes.add((recounted["initial_pool_size"], recounted["maximum_pool_size"]))
        assert line and f"1 of pid {second}" in line and "2 workers share GPU" in line
    assert sizes == {(H200_TOTAL // 4 // 256 * 256, int(0.9 * H200_TOTAL / 2) // 256 * 256)}


def test_the_worker_does_not_count_its_own_command_twice(own_state, monkeypatch, sleeper, tmp_path):
    h, memory = _section(tmp_path)
    planner = sleeper()
    write_plan(own_state, planner, 1)  # the host plan this worker took
    monkeypatch.setenv(shares.PLAN_ENV, str(own_state / f"plan-{planner}.json"))
    assert rmm_setup._recount(h.ctx, h.workers[0], memory) == (memory, None)


def test_a_declared_count_and_a_set_maximum_are_kept(own_state, sleeper, tmp_path):
    h, memory = _section(tmp_path, **{"gpudask.rmm.workers-per-gpu": 2})
    write_plan(own_state, sleeper(), 1)
    assert rmm_setup._recount(h.ctx, h.workers[0], memory) == (memory, None)  # 2 declared, 2 counted
    h, memory = _section(tmp_path, **{"gpudask.rmm.maximum-pool-size": "20GB"})
    recounted, _ = rmm_setup._recount(h.ctx, h.workers[0], memory)
    assert recounted["maximum_pool_size"] == memory["maximum_pool_size"] == 20 * 10**9 // 256 * 256


def test_an_explicit_pool_is_never_recounted(own_state, sleeper, tmp_path):
    h, memory = _section(tmp_path, **{"gpudask.rmm.pool-size": "20GB"})
    write_plan(own_state, sleeper(), 3)
    assert rmm_setup._recount(h.ctx, h.workers[0], memory) == (memory, None)


def test_setup_on_a_described_host_reports_the_recounted_pool(own_state, sleeper, tmp_path):
    h, _memory = _section(tmp_path)
    write_plan(own_state, sleeper(), 1)
    report = rmm_setup._setup(h.ctx, h.workers[0])
    assert report["applied"] is False and "no real GPU" in report["skipped"]
    assert report["initial_pool_size"] == H200_TOTAL // 4 // 256 * 256
    assert report["planned_initial_pool_size"] == H200_TOTAL // 2 // 256 * 256
    assert "2 workers share" in report["recounted"]


# --------------------------------------------------------------------------- waiting, and who holds it
class Gpu:
    """The GPU's free memory as NVML would read it, moving as a script says (the hardware)."""

    def __init__(self, readings, total=100 * GiB):
        self.readings, self.total, self.t = list(readings), total, 0.0

    def read(self):
        return (self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]), self.total

    def clock(self):
        return self.t

    def sleep(self, seconds):
        self.t += seconds


def test_a_restart_waits_for_the_old_pool_to_be_released():
    gpu = Gpu([10 * GiB] * 8 + [60 * GiB])  # the predecessor's 50 GiB come back after 8 readings
    waited = shares.wait_for_memory(gpu.read, 40 * GiB, 30, lambda: True, gpu.clock, gpu.sleep)
    assert waited.why_stopped == "enough free" and waited.free == 60 * GiB and waited.seconds > 1


def test_memory_nobody_releases_ends_the_wait_early():
    gpu = Gpu([10 * GiB])
    waited = shares.wait_for_memory(gpu.read, 40 * GiB, 30, lambda: False, gpu.clock, gpu.sleep)
    assert waited.why_stopped == "nothing being released" and shares.SETTLE <= waited.seconds < 30


def test_a_process_going_away_is_waited_for_up_to_the_limit():
    gpu = Gpu([10 * GiB])
    waited = shares.wait_for_memory(gpu.read, 40 * GiB, 12, lambda: True, gpu.clock, gpu.sleep)
    assert waited.why_stopped == "time limit" and 12 <= waited.seconds < 13


def test_no_wait_when_enough_is_free_or_nvml_cannot_tell():
    gpu = Gpu([50 * GiB])
    assert shares.wait_for_memory(gpu.read, 40 * GiB, 30, lambda: True, gpu.clock, gpu.sleep).seconds == 0
    assert shares.wait_for_memory(lambda: None, 40 * GiB, 30, lambda: True) is None


def test_short_memory_names_who_holds_it_in_one_line():
    text = shares.holders_text([(11, 600 * 2**20), (12, 70 * GiB), (13, None)], {12: "gpudask worker 0 of pid-99"})
    assert text.startswith("pid 12 (gpudask worker 0 of pid-99) 71680 MiB, pid 11 (") and "pid 13" in text
    section = {"allocator": "pool", "initial_pool_size": 40 * GiB, "maximum_pool_size": None, "gpu": "GPU-x",
               "fit_to_free": False}
    with pytest.raises(GpudaskError) as e:
        rmm_setup.fit(section, 20 * GiB, 100 * GiB, "worker 0", text)
    assert "\n" not in str(e.value) and "pid 12 (gpudask worker 0 of pid-99) 71680 MiB" in str(e.value)
    fitted, line = rmm_setup.fit(dict(section, fit_to_free=True), 20 * GiB, 100 * GiB, "worker 0", text)
    assert fitted["initial_pool_size"] < 20 * GiB and "pid 12" in line and "\n" not in line
    assert shares.holders_text(None) == "NVML cannot list the processes on this GPU"


def test_a_worker_knows_its_predecessor(own_state, monkeypatch):
    monkeypatch.setenv(shares.GROUP_ENV, "pid-123456789")
    assert shares.predecessor(0) is None
    shares.record(0, "GPU-x", 4 * GiB)
    assert shares.predecessor(0) is None  # itself
    text = json.loads((own_state / "pid-123456789" / "rmm-worker-0.json").read_text())
    text["pid"] = 4242
    (own_state / "pid-123456789" / "rmm-worker-0.json").write_text(json.dumps(text))
    assert shares.predecessor(0) == 4242 and shares.predecessor(1) is None
    assert shares.known_workers() == {4242: "gpudask worker 0 of pid-123456789"}


# --------------------------------------------------------------------------- two commands, real processes
def _reports(client):
    from gpudask.plugins.rmm import setup as worker_setup

    def report():
        r = worker_setup._REPORT or {}
        return {k: r.get(k) for k in ("initial_pool_size", "maximum_pool_size", "planned_initial_pool_size")}

    return report


@pytest.mark.process
@pytest.mark.timeout(240)
def test_two_commands_on_one_gpu_get_equal_pools_through_restarts_and_a_kill(cluster, tmp_path):
    """Two ``dask worker --nworkers 1`` commands on the one GPU of a described H200: the second
    counts the first (its host plan) and starts at 0.5 / 2 of the GPU; after a restart the first
    does too, and both keep that pool through restarts and a kill -9 of a worker."""
    own = tmp_path / "tmp"  # a state directory of this test's own: other tests' commands are not counted
    own.mkdir(mode=0o700)
    env = base_env(GPUDASK_FACTS=host("h200-single.json"), DASK_GPUDASK__RMM__ALLOCATOR="pool",
                   DASK_DISTRIBUTED__WORKER__DAEMON="False", TMPDIR=str(own))
    env.pop("XDG_RUNTIME_DIR", None)
    cluster.scheduler(env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "1", "--nthreads", "1", env=env, label="first")
    share = H200_TOTAL // 4 // 256 * 256
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=120)
        cluster.worker("--preload", "gpudask", "--nworkers", "1", "--nthreads", "1", env=env, label="second")
        client.wait_for_workers(2, timeout=120)
        report = _reports(client)
        start = client.run(report)
        assert sorted(r["initial_pool_size"] for r in start.values()) == [share, H200_TOTAL // 2 // 256 * 256]
        seen = []
        for _ in range(3):
            client.restart(timeout=120)
            sizes = client.run(report)
            seen.append(sorted((r["initial_pool_size"], r["maximum_pool_size"]) for r in sizes.values()))
        assert seen == [[(share, int(0.9 * H200_TOTAL / 2) // 256 * 256)] * 2] * 3, seen
        pids = client.run(os.getpid)
        victim = next(iter(pids.values()))
        os.kill(victim, signal.SIGKILL)
        deadline = time.time() + 120
        while time.time() < deadline:
            now = client.run(os.getpid, on_error="ignore")  # the killed worker's entry errs until it is gone
            if len(now) == 2 and victim not in now.values():
                break
            time.sleep(0.5)
        assert victim not in client.run(os.getpid).values()
        assert sorted(r["initial_pool_size"] for r in client.run(report).values()) == [share, share]

"""``gpudask check --probe``: data through every path of real clusters (tcp and UCX over
TCP), a failing path named with its fix, bad input in one line, the last probe on /gpudask."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import urllib.request

import pytest
from conftest import base_env, real_gpu_count

from gpudask.testing.processes import dask_command
from gpudask.checks.probe import PATHS, TOPIC, format_probe


def cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudask.cli", "check", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or base_env())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def path_lines(stdout: str) -> dict[str, str]:
    return {p: line for line in stdout.splitlines() for p in PATHS if line.startswith(p + " ")}


@pytest.mark.process
@pytest.mark.parametrize("protocol", ["tcp", pytest.param("ucx", marks=pytest.mark.ucx_client)])
def test_probe_passes_every_path_and_the_page_shows_it(cluster, protocol):
    cluster.scheduler("--preload", "gpudask", "--dashboard-address", "127.0.0.1:0", protocol=protocol)
    cluster.worker("--preload", "gpudask", "--protocol", protocol, "--nworkers", "2", "--nthreads", "1")
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=120)
        port = client.scheduler_info()["services"]["dashboard"]
        workers = sorted(client.scheduler_info()["workers"])
        out = cli("--probe", "--payload", "1MiB", "--scheduler-file", cluster.scheduler_file)
        assert out.returncode == 0, out.stdout + out.stderr
        lines = path_lines(out.stdout)
        assert set(lines) == set(PATHS), out.stdout
        for line in lines.values():
            assert " ok " in line and " ms" in line, line
        assert out.stdout.splitlines()[-1] == "probe: ok"
        assert "numpy arrays" in out.stdout and f"{workers[1]} fetched from {workers[0]}" in out.stdout

        js = cli("--probe", "--payload", "1MiB", "--json", cluster.address)
        assert js.returncode == 0, js.stdout + js.stderr
        report = json.loads(js.stdout)
        assert report["status"] == "ok" and report["stored"] is True and report["protocol"] == protocol
        assert [p["path"] for p in report["paths"]] == list(PATHS)
        assert all(p["status"] == "ok" and p["seconds"] > 0 for p in report["paths"])
        (when, stored), *_ = client.get_events(TOPIC)[-1:]
        assert stored["status"] == "ok"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/gpudask/json", timeout=10) as r:
            state = json.loads(r.read())
        assert state["probe"]["status"] == "ok" and state["probe"]["workers"] == workers[:2]
        assert [p["path"] for p in state["probe"]["paths"]] == list(PATHS)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/gpudask", timeout=10) as r:
            page = r.read().decode()
        assert 'id="probe"' in page and page.count('class="probe-path"') == len(PATHS)  # the paths, drawn


@pytest.mark.process
def test_an_unreachable_worker_fails_its_paths_with_the_fix_and_exit_1(cluster):
    env = base_env(DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="3s")
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--nthreads", "1", env=env, label="good")
    # registers (it connects to the scheduler) but advertises an address nobody listens on
    bad = f"tcp://127.0.0.1:{free_port()}"
    cluster.spawn("bad", dask_command("worker", "--scheduler-file", cluster.scheduler_file, "--preload", "gpudask",
                                      "--listen-address", f"tcp://127.0.0.1:{free_port()}", "--contact-address",
                                      bad, "--no-dashboard", "--death-timeout", "60", "--nthreads", "1"), env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=120)
        (good,) = [w for w in client.scheduler_info()["workers"] if w != bad]
    out = cli("--probe", "--payload", "1MiB", "--scheduler-file", cluster.scheduler_file, "--path-timeout", "5",
              "--workers", f"{bad},{good}", env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = path_lines(out.stdout)
    assert set(lines) == set(PATHS), out.stdout
    assert "FAILED" in lines["worker -> worker"] and f"{good} could not get data from {bad}" in lines["worker -> worker"]
    assert "fix: the workers must reach each other" in lines["worker -> worker"]
    assert "FAILED" in lines["worker -> client direct"] and f"this client must reach {bad}" in lines[
        "worker -> client direct"]
    assert "FAILED" in lines["worker -> client via scheduler"]
    assert out.stdout.splitlines()[-1] == "probe: failed"


@pytest.mark.process
@pytest.mark.parametrize(("args", "says"), [
    (["--probe", "--workers", "a,b,c"], "gpudask: error: --workers 'a,b,c': accepted: SOURCE or SOURCE,DESTINATION"),
    (["--probe", "--path-timeout", "0"], "gpudask: error: --path-timeout 0: accepted: a number of seconds above 0"),
    (["--probe", "--payload", "lots"], "gpudask: error: --payload lots: accepted: a size from 8 bytes to 4GiB"),
    (["--workers", "a"], "gpudask: error: --workers goes with --probe"),
    (["--probe", "not an address"], "gpudask: error: 'not an address' is not a scheduler address"),
])
def test_bad_probe_input_is_one_line_and_exit_2(args, says):
    address = [] if "not an address" in args else ["tcp://127.0.0.1:9"]
    out = cli(*args, *address, "--timeout", "2", timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith(says), line


@pytest.mark.process
def test_a_probe_of_an_unknown_worker_says_which_workers_there_are(cluster):
    cluster.scheduler("--preload", "gpudask")
    cluster.worker("--preload", "gpudask", "--nthreads", "1")
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=120)
        (w,) = client.scheduler_info()["workers"]
    out = cli("--probe", "--payload", "1MiB", cluster.address, "--workers", "tcp://127.0.0.1:1")
    assert out.returncode == 1
    assert f"failed: not a worker of this scheduler: tcp://127.0.0.1:1; its workers: {w}" in out.stdout


def test_the_page_shows_a_probe_as_text_never_markup():
    from distributed import Scheduler

    import gpudask.dashboard.page as dashboard

    async def main():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address=":0") as s:
            assert dashboard.cluster_state(s)["probe"] is None
            s.log_event(TOPIC, {"status": "failed", "array": "<b>x</b>", "workers": ["tcp://a:1"], "paths": [
                {"path": "worker -> worker", "status": "failed", "seconds": None, "error": "<script>1</script>",
                 "fix": 7}, "junk"]})
            probe = dashboard.cluster_state(s)["probe"]
            assert probe["status"] == "failed" and probe["array"] == "<b>x</b>"
            assert probe["paths"] == [{"path": "worker -> worker", "status": "failed", "seconds": None,
                                       "error": "<script>1</script>", "fix": "7", "detail": None}]
    asyncio.run(main())
    page = dashboard.render(3)
    assert "innerHTML" not in page  # every value goes in through textContent


def test_format_probe_is_one_line_per_path():
    report = {"scheduler": "ucx://s:1", "protocol": "ucx", "array": "cupy", "workers": ["ucx://a:1", "ucx://b:1"],
              "timeout": 10.0, "status": "failed", "paths": [
                  {"path": PATHS[0], "status": "ok", "seconds": 0.0123, "detail": "cupy from the client"},
                  {"path": PATHS[1], "status": "skipped", "seconds": None, "detail": "one worker"},
                  {"path": PATHS[2], "status": "failed", "seconds": None, "error": "no answer within 10 s",
                   "fix": "give the scheduler a GPU"}]}
    text = format_probe(report).splitlines()
    assert text[0] == "probe of ucx://s:1 (ucx): cupy arrays, workers ucx://a:1, ucx://b:1, 10 s per path"
    assert text[1].split() == [*PATHS[0].split(), "ok", "12.3", "ms", "cupy", "from", "the", "client"]
    assert "skipped" in text[2] and text[3].endswith("FAILED  no answer within 10 s; fix: give the scheduler a GPU")
    assert text[-1] == "probe: failed"


@pytest.mark.gpu
@pytest.mark.process
def test_probe_moves_cupy_through_every_path_over_ucx(cluster):
    assert real_gpu_count() >= 1
    cluster.scheduler("--preload", "gpudask", protocol="ucx")
    cluster.worker("--preload", "gpudask", "--protocol", "ucx", "--nworkers", "2", "--nthreads", "1")
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=180)
    out = cli("--probe", "--payload", "1MiB", "--json", "--scheduler-file", cluster.scheduler_file, timeout=180)
    report = json.loads(out.stdout)
    assert report["array"] == "cupy", report
    assert out.returncode == 0, format_probe(report)
    assert all(p["status"] == "ok" for p in report["paths"]), format_probe(report)


def test_a_gpu_path_far_below_one_hosts_hardware_is_slow_with_its_fix():
    """64 MiB staged through host memory (0.5 GB/s on an H200) against CUDA IPC (45 GB/s)."""
    from gpudask.checks.probe import _rates

    def report(seconds):
        return {"paths": [{"path": p, "status": "ok", "seconds": seconds, "detail": None} for p in PATHS]}

    staged = report(0.124)
    _rates(staged, "ucx", "cupy")
    assert [p["status"] for p in staged["paths"]] == ["ok", "slow", "slow", "slow"]  # the submit argument has no bar
    assert "staged through host memory" in staged["paths"][1]["fix"] and staged["paths"][1]["gbps"] == 0.54
    line = format_probe({**staged, "scheduler": "ucx://a:1", "protocol": "ucx", "array": "cupy", "timeout": 10,
                         "workers": ["a", "b"], "status": "slow"})
    assert "worker -> worker                SLOW       124.0 ms    0.54 GB/s  fix: 0.54 GB/s for 64 MiB" in line
    direct = report(0.0015)
    _rates(direct, "ucx", "cupy")
    assert {p["status"] for p in direct["paths"]} == {"ok"} and direct["paths"][1]["gbps"] == 44.74
    for protocol, module in (("tcp", "cupy"), ("ucx", "numpy")):  # no hardware claim for these
        r = report(0.124)
        _rates(r, protocol, module)
        assert {p["status"] for p in r["paths"]} == {"ok"}

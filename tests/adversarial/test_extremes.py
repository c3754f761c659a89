"""Settings, command-line values, facts and peers at their extremes (issue 32): one line
naming what was wrong and what is accepted, never a traceback, a hang or a silent accept."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import base_env, described, host

from gpudask.errors import ConfigError, FactsError

TWO_GPUS = host("workstation-2gpu-pcie.json")


def _cli(tmp_path, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudask.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(tmp_path), env=base_env(**env))


def _one_line(out: subprocess.CompletedProcess, *parts: str) -> str:
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "Traceback" not in text, text
    (line,) = out.stderr.strip().splitlines()
    for part in parts:
        assert part in line, line
    return line


@pytest.mark.process
def test_an_empty_timeout_variable_is_one_line(tmp_path):
    out = _cli(tmp_path, "info", GPUDASK_FACTS=TWO_GPUS, DASK_GPUDASK__SCHEDULER_CHECK__TIMEOUT="")
    # before: IndexError: string index out of range (parse_timedelta of "")
    _one_line(out, "gpudask.scheduler-check.timeout = ''", "$DASK_GPUDASK__SCHEDULER_CHECK__TIMEOUT",
              "accepted: a positive number of seconds")


@pytest.mark.process
def test_gpudask_info_with_a_million_workers_is_refused_at_once(tmp_path):
    start = time.monotonic()
    out = _cli(tmp_path, "info", "--nworkers", "1000000", GPUDASK_FACTS=TWO_GPUS)
    # before: RSS 7 GB and growing
    _one_line(out, "nworkers=1000000 is not valid; accepted: an integer from 0 to 4096")
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("n", [2.5, 10**7, -1, True])
def test_local_gpu_cluster_refuses_a_worker_count_before_planning(n):
    from gpudask.cluster import cluster_kwargs

    # before: 2.5 -> a traceback inside the planner; 10**7 -> a hang
    with pytest.raises(ConfigError, match=r"n_workers=.* is not valid; accepted: an integer from 0 to 4096"):
        cluster_kwargs(n_workers=n)


@pytest.mark.parametrize("value", ["-1", "99999999999999999999999", "4096", " 1x"])
def test_gpudask_worker_index_out_of_range_is_refused(monkeypatch, value):
    from gpudask.apply.slots import worker_index

    monkeypatch.setenv("GPUDASK_WORKER_INDEX", value)
    # before: -1 and 10**23 accepted (a worker on no GPU, or a hang indexing the plans)
    with pytest.raises(ConfigError, match=r"GPUDASK_WORKER_INDEX=.* is not valid; accepted: an integer from 0 to 4095"):
        worker_index()


@pytest.fixture
def silent_peer():
    """An address that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in held:
        conn.close()


@pytest.mark.process
@pytest.mark.parametrize("command", ["status", "check"])
def test_status_and_check_against_a_silent_peer_honour_the_timeout(tmp_path, silent_peer, command):
    start = time.monotonic()
    out = _cli(tmp_path, command, silent_peer, "--timeout", "2", timeout=60)
    # before: no end (the process was killed after 25 s)
    assert time.monotonic() - start < 15
    _one_line(out, f"no answer from the scheduler at {silent_peer} within 2 s (--timeout)")


@pytest.mark.process
@pytest.mark.parametrize("value", ["1e308", "nan", "0", "-3"])
def test_a_timeout_no_wait_can_use_is_one_line(tmp_path, value):
    out = _cli(tmp_path, "check", "tcp://127.0.0.1:9", "--timeout", value)
    # before: 1e308 -> OverflowError traceback
    _one_line(out, "--timeout", "accepted: a number of seconds above 0 and at most 604800")


FACTS_MUTATIONS = {
    "memory 2**70": (lambda d: d["gpus"][0].update(memory_total=2**70), "gpus[0].memory_total",
                     "an integer of at most 2**53"),
    "index 2**70": (lambda d: d["gpus"][1].update(index=2**70), "gpus[1].index", "an integer of at most 2**53"),
    "negative CUDA version": (lambda d: d.update(cuda_driver_version=-1), "cuda_driver_version",
                              "an integer >= 0 or null"),
    "negative driver version": (lambda d: d.update(driver_version="-535.1"), "driver_version",
                                "digits and dots"),
    "negative compute capability": (lambda d: d["gpus"][0].update(compute_capability=[-9, 0]),
                                    "gpus[0].compute_capability[0]", "an integer from 0 to 1000"),
    "escape in a GPU name": (lambda d: d["gpus"][0].update(name="A100\x1b]0;owned\x07"), "gpus[0].name",
                             "a string without control characters"),
    "1 MB hostname": (lambda d: d.update(hostname="h" * 2**20), "hostname", "a string of at most 4096 characters"),
    "1 MB interface name": (lambda d: d["net_interfaces"].update({"i" * 2**20: ["10.0.0.1"]}),
                            "net_interfaces.<key>", "a string of at most 4096 characters"),
}


@pytest.mark.parametrize("case", sorted(FACTS_MUTATIONS))
def test_a_mutated_facts_file_is_refused_naming_the_key(tmp_path, case):
    from gpudask.facts import load_facts

    change, key, accepted = FACTS_MUTATIONS[case]
    data = json.loads(open(TWO_GPUS).read())
    change(data)
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    # before: accepted by gpudask info (then tracebacks in the worker, or escapes on the terminal)
    with pytest.raises(FactsError) as e:
        load_facts(path)
    text = str(e.value)
    assert f"key {key!r} must be" in text and accepted in text, text
    assert "\x1b" not in text and "\n" not in text and len(text) < 400, text


@pytest.mark.process
def test_gpudask_info_on_facts_with_a_terminal_escape_prints_none(tmp_path):
    path = described(tmp_path, "workstation-2gpu-pcie.json", hostname="evil\x1b[2J\x1b]0;owned\x07")
    out = _cli(tmp_path, "info", "--facts", path)
    line = _one_line(out, "key 'hostname' must be a string without control characters")
    assert "\x1b" not in out.stdout + out.stderr, line

"""``dask worker --scheduler-file F`` started beside its scheduler: gpudask waits for F to learn
the protocol (gpudask.apply.runtime.protocol_from), polling every 10 ms (every 0.1 s, as distributed,
after the first 2 s), bounded by the timeout."""

from __future__ import annotations

import json
import os
import threading
import time

from gpudask.apply import runtime


def _write_later(path, text: str, delay: float) -> threading.Thread:
    def write() -> None:
        time.sleep(delay)
        with open(path, "w") as f:
            f.write(text)

    t = threading.Thread(target=write)
    t.start()
    return t


def test_a_file_written_later_is_found_soon_after(tmp_path):
    path = tmp_path / "scheduler.json"
    writer = _write_later(path, json.dumps({"address": "ucx://10.0.0.1:8786"}), 0.15)
    t0 = time.monotonic()
    assert runtime.protocol_from(None, str(path), wait=True, timeout=10) == "ucx"
    waited = time.monotonic() - t0
    writer.join()
    assert 0.15 <= waited < 5  # found after the write, not at the timeout


def test_a_file_still_being_written_is_read_again(tmp_path):
    path = tmp_path / "scheduler.json"
    path.write_text('{"address": "tc')  # half written
    writer = _write_later(path, json.dumps({"address": "tcp://127.0.0.1:1"}), 0.05)
    assert runtime.protocol_from(None, str(path), wait=True, timeout=10) == "tcp"
    writer.join()


def test_no_file_ends_at_the_timeout(tmp_path):
    t0 = time.monotonic()
    assert runtime.protocol_from(None, str(tmp_path / "never.json"), wait=True, timeout=0.1) is None
    assert time.monotonic() - t0 < 5


def test_without_wait_a_missing_or_odd_file_says_nothing(tmp_path):
    assert runtime.protocol_from(None, str(tmp_path / "never.json")) is None
    (tmp_path / "list.json").write_text("[1, 2]")
    assert runtime.protocol_from(None, str(tmp_path / "list.json"), wait=True, timeout=10) is None
    (tmp_path / "number.json").write_text(json.dumps({"address": 5}))
    assert runtime.protocol_from(None, str(tmp_path / "number.json"), wait=True, timeout=10) is None


def test_a_fifo_is_not_read(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    assert runtime.protocol_from(None, str(fifo), wait=True, timeout=None) is None  # would block for ever
    assert time.monotonic() - t0 < 5


def test_an_address_given_wins_over_the_file(tmp_path):
    assert runtime.protocol_from("ucxx://h:1", str(tmp_path / "never.json"), wait=True, timeout=None) == "ucxx"


def test_after_the_first_seconds_it_looks_as_often_as_distributed(tmp_path, monkeypatch):
    """A scheduler file on a shared file system is looked for by every node's worker command:
    fast looks only at first, then one every 0.1 s (what distributed's own wait does)."""
    real_sleep, slept = time.sleep, []

    def sleep(seconds):
        slept.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(runtime, "_FAST_S", 0.1)
    monkeypatch.setattr(runtime.time, "sleep", sleep)
    path = tmp_path / "scheduler.json"
    writer = _write_later(path, json.dumps({"address": "tcp://127.0.0.1:1"}), 0.5)
    assert runtime.protocol_from(None, str(path), wait=True, timeout=10) == "tcp"
    writer.join()
    waits = [s for s in slept if s in (runtime._POLL_S, runtime._SLOW_POLL_S)]
    assert waits[0] == 0.01 and waits[-1] == 0.1 and waits.count(0.1) >= 2

"""What a plugin hands back is plain data before gpudask touches it (issue 40): a report-row
value or a Finding field whose ``__str__`` raises ``SystemExit`` / ``KeyboardInterrupt``, a
Finding subclass, a ``SystemExit`` whose ``repr`` raises, a ``__str__`` that never returns,
an object in a Finding's ``plugin`` field -- none of them ends, freezes or poisons the
scheduler; each is one plugin-failed finding or one left-out column, and the scheduler
still answers."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from conftest import base_env, host, third_party_plugin

TWO_GPUS = host("workstation-2gpu-pcie.json")

HOSTILE = """
    import os, pathlib, sys, time
    from gpudask.pluginapi import Finding, hookimpl

    name = "hostile"
    priority = 500
    CASE = os.environ.get("HOSTILE", "")
    MARK = pathlib.Path(os.environ.get("HOSTILE_MARK", "/nonexistent"))

    class Exits:
        def __str__(self):
            raise SystemExit(0)
        __repr__ = __str__
        __format__ = lambda self, spec: self.__str__()

    class Interrupts:
        def __str__(self):
            raise KeyboardInterrupt
        __repr__ = __str__
        __format__ = lambda self, spec: self.__str__()

    class Slow:
        def __str__(self):
            (MARK / "entered").touch()  # the test waits for this file, then asks the scheduler
            deadline = time.monotonic() + 90
            while not (MARK / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            return "slow"
        __repr__ = __str__

    class Text(str):
        # a str whose own text raises: only str's own methods read it safely
        def __str__(self):
            raise SystemExit(0)
        __repr__ = __str__

    class Poisoned:
        # pickled into scheduler_info, it breaks every client that cannot import this module
        pass

    class ExitsOnRepr:
        def __repr__(self):
            raise SystemExit(0)

    class SubFinding(Finding):
        def to_dict(self):
            raise SystemExit(0)

        def line(self):
            raise SystemExit(0)

    def value(case):
        return {"row-exit": Exits, "row-interrupt": Interrupts, "row-text": lambda: Text("t")}[case]()

    @hookimpl
    def gpudask_scheduler_check(ctx, reference, subject):
        if CASE == "message-exit":
            return [Finding("warning", "hostile", Exits())]
        if CASE == "message-interrupt":
            return [Finding("warning", "hostile", Interrupts())]
        if CASE == "message-text":
            return [Finding("warning", Text("hostile"), Text("m"))]
        if CASE == "subclass":
            return [SubFinding("warning", "hostile", "a subclass")]
        if CASE == "exit-repr":
            raise SystemExit(ExitsOnRepr())
        if CASE == "slow-str":
            return [Finding("warning", "hostile", Slow())]
        if CASE == "plugin-object":
            return [Finding("warning", "hostile", "an object as plugin", plugin=Poisoned(),
                            details={"x": Poisoned()})]
        return []

    @hookimpl
    def gpudask_report_rows(plan, published):
        if CASE.startswith("row-"):
            return [{"column": "hostile", "summary": "s", "planned": value(CASE), "actual": 1}]
        return None
    """


def _env(tmp_path, case: str) -> dict[str, str]:
    mark = tmp_path / "mark"
    mark.mkdir(exist_ok=True)
    return base_env(GPUDASK_FACTS=TWO_GPUS, HOSTILE=case, HOSTILE_MARK=str(mark),
                    **third_party_plugin(tmp_path, HOSTILE, "hostile"))


def _start(cluster, tmp_path, case: str) -> dict[str, str]:
    env = _env(tmp_path, case)
    cluster.scheduler("--preload", "gpudask", "--dashboard", "--dashboard-address", "127.0.0.1:0", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env)
    return env


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return r.read().decode()


def _alive(cluster, client) -> None:
    """The scheduler process runs and answers a client."""
    assert client.run_on_scheduler(lambda: 42) == 42
    assert cluster.procs[0].poll() is None, cluster.log("scheduler")[-3000:]


def _check_findings(client, code: str) -> list[dict]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        (w,) = client.scheduler_info(n_workers=-1)["workers"].values()
        found = [f for f in (w.get("gpudask-check") or {}).get("findings", []) if f["code"] == code]
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no {code} finding in {w.get('gpudask-check')}")


@pytest.mark.process
@pytest.mark.parametrize("case", ["row-exit", "row-interrupt", "row-text"])
def test_a_report_row_value_that_raises_on_str_is_a_left_out_column_on_one_get(cluster, tmp_path, case):
    _start(cluster, tmp_path, case)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        port = client.scheduler_info()["services"]["dashboard"]
        # before: this one unauthenticated GET ended the scheduler (SystemExit / KeyboardInterrupt
        # turned into text, its exception handed to the event loop)
        state = json.loads(_get(port, "/gpudask/json"))
        (row,) = state["workers"]
        if case == "row-text":  # a str subclass: its characters, as an exact str, no call of its methods
            assert row["rows"]["hostile"]["planned"] == "t", row["rows"]
        else:
            assert "hostile" not in row["rows"], row["rows"]
            assert "plugin hostile's report rows left out" in row["rows"]["problems"]["summary"], row["rows"]
        json.loads(_get(port, "/gpudask/json"))  # and again
        _alive(cluster, client)


@pytest.mark.process
@pytest.mark.parametrize("case", ["message-exit", "message-interrupt", "exit-repr"])
def test_a_finding_that_raises_when_made_text_is_a_plugin_failed_finding(cluster, tmp_path, case):
    _start(cluster, tmp_path, case)
    with cluster.client() as client:
        # before: the scheduler's event loop turned the finding into text and ended with SystemExit
        client.wait_for_workers(1, timeout=60)
        (finding,) = _check_findings(client, "plugin-failed")
        assert finding["plugin"] == "hostile", finding
        assert "gpudask plugin 'hostile' (from hostileplug) failed in gpudask_scheduler_check" in finding["message"]
        assert not _check_findings_now(client, "hostile")
        _alive(cluster, client)
    log = cluster.log("scheduler")
    assert "Traceback" not in log, log[-3000:]


def _check_findings_now(client, code: str) -> list[dict]:
    (w,) = client.scheduler_info(n_workers=-1)["workers"].values()
    return [f for f in (w.get("gpudask-check") or {}).get("findings", []) if f["code"] == code]


@pytest.mark.process
@pytest.mark.parametrize("case,message", [("message-text", "m"), ("subclass", "a subclass")])
def test_a_str_subclass_or_a_finding_subclass_becomes_a_plain_finding(cluster, tmp_path, case, message):
    _start(cluster, tmp_path, case)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        # before: the event loop called the subclass's own methods (to_dict, line, __str__):
        # SystemExit there; now its fields are read in the plugin's call, into a plain Finding
        (finding,) = _check_findings(client, "hostile")
        assert finding["message"] == message and finding["plugin"] == "hostile", finding
        _alive(cluster, client)
    assert "SystemExit" not in cluster.log("scheduler")


@pytest.mark.process
def test_an_object_in_a_findings_plugin_field_reaches_no_client_pickled(cluster, tmp_path):
    _start(cluster, tmp_path, "plugin-object")
    # the test's client cannot import the plugin's module (it is on the servers' PYTHONPATH only)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        # before: scheduler_info carried the pickled object and failed here for every such client
        (finding,) = _check_findings(client, "hostile")
        assert finding["plugin"] == "hostile", finding  # not a name: the plugin's own
        assert isinstance(finding["details"]["x"], str) and "Poisoned" in finding["details"]["x"], finding
        _alive(cluster, client)


@pytest.mark.process
def test_a_str_that_does_not_return_never_holds_the_event_loop(cluster, tmp_path):
    env = _start(cluster, tmp_path, "slow-str")
    mark = tmp_path / "mark"
    try:
        with cluster.client() as client:
            client.wait_for_workers(1, timeout=60)
            port = client.scheduler_info()["services"]["dashboard"]
            deadline = time.monotonic() + 60
            while not (mark / "entered").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert (mark / "entered").exists(), cluster.log("scheduler")[-3000:]
            # the plugin's __str__ is still running (it waits for "release"): the scheduler answers
            # all the same (before: its event loop was inside __str__, and /health timed out)
            assert _get(port, "/health") == "ok"
            assert client.run_on_scheduler(lambda: 42) == 42
            assert not (mark / "release").exists()
            (finding,) = _check_findings(client, "check-timeout")
            assert finding["plugin"] == "hostile", finding
    finally:
        (mark / "release").touch()
    assert env["HOSTILE"] == "slow-str"


# ---------------------------------------------------------------- in one process
class _Exits:
    def __str__(self):
        raise SystemExit(0)

    __repr__ = __str__


class _Text(str):
    def __str__(self):
        raise SystemExit(0)

    __repr__ = __str__


def test_plain_copies_into_exact_types_without_running_a_subclasses_methods():
    from gpudask.plaindata import NotPlain, plain

    class Number(int):
        def __index__(self):
            raise SystemExit(0)

    out = plain({_Text("k"): [_Text("v"), Number(3), 2**70, (1.5, None, True)]})
    assert out == {"k": ["v", 3, "<an integer of 71 bits>", [1.5, None, True]]}
    kinds = {type(out), type(next(iter(out))), *(type(v) for v in out["k"])}
    assert kinds == {dict, str, int, list}, kinds
    with pytest.raises(NotPlain, match="a _Exits"):
        plain({"x": _Exits()}, strict=True)
    deep: list = []
    node = deep
    for _ in range(100):
        node.append([])
        node = node[0]
    assert "nested deeper than" in json.dumps(plain(deep))


def test_a_plugins_exception_whose_text_raises_is_named_by_its_type():
    from gpudask.errors import PluginError

    class Loud(Exception):
        def __str__(self):
            raise SystemExit(0)

    assert str(PluginError("p", None, "h", Loud())) == "gpudask plugin 'p' failed in h: Loud (its text could not be read)"
    assert "SystemExit" in PluginError("p", None, "h", SystemExit(_Exits())).cause


def test_keyboard_interrupt_in_a_thread_is_the_plugins_failure():
    import threading

    from gpudask.errors import PluginError
    from gpudask.plugin.hookcall import call_isolated

    def interrupts():
        raise KeyboardInterrupt

    caught = []

    def run():
        try:
            call_isolated("p", None, "gpudask_scheduler_check", interrupts, ())
        except PluginError as e:
            caught.append(str(e))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    # before: the KeyboardInterrupt went through, out of the check's thread onto the event loop
    assert caught == ["gpudask plugin 'p' failed in gpudask_scheduler_check: KeyboardInterrupt: a plugin may not "
                      "end the process"]


def test_printable_escapes_what_acts_on_a_terminal_or_splits_a_line():
    from gpudask.printable import printable

    assert printable("a\x1b[2J\nb\x07\x9b\u202e\u2028\ud800 é 中 …") == \
        "a\\x1b[2J\\nb\\x07\\x9b\\u202e\\u2028\\ud800 é 中 …"

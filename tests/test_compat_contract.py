"""The contract with distributed's internals (gpudask/compat/distributed.py): each private thing
gpudask relies on still exists in the installed distributed and behaves as relied on.

A failure here means a distributed release moved something gpudask reaches into: fix the one
function in gpudask.compat.distributed (and pyproject.toml's bound), not its callers.  Real
distributed objects throughout: an in-process cluster over tcp, a Worker constructed with a
preload, distributed's own click callback.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pathlib
import re
import sys
import time

import pytest

from gpudask.compat import distributed as compat

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_preload_argv_are_the_local_value_of_distributeds_click_callback():
    from distributed.preloading import validate_preload_argv

    assert list(inspect.signature(validate_preload_argv).parameters) == ["ctx", "param", "value"]
    # it imports the preloads (gpudask among them) while it validates their arguments
    assert "process_preloads" in inspect.getsource(validate_preload_argv) or \
        "_import_module" in inspect.getsource(validate_preload_argv)

    def validate_preload_argv_stand_in(value):  # the walk matches the name, as in distributed
        return compat.preload_argv_being_validated()

    validate_preload_argv_stand_in.__code__ = validate_preload_argv_stand_in.__code__.replace(
        co_name="validate_preload_argv")
    assert validate_preload_argv_stand_in(("--x", "1")) == ("--x", "1")
    assert compat.preload_argv_being_validated() is None


PRELOAD = '''
from gpudask.compat import distributed as compat

SEEN = {}


def record():
    local = compat.worker_init_locals()
    SEEN.update(keys=sorted(k for k in ("preload_argv", "nanny", "host", "interface", "self") if k in local),
                worker=local.get("self"), by_preload=compat.imported_by_distributed_preload(1))


record()
'''


def test_a_preload_imported_by_worker_init_sees_its_arguments_and_can_set_the_interface(tmp_path):
    """distributed imports a Worker's preloads inside ``Worker.__init__`` (distributed/preloading.py),
    the frames gpudask reads; ``Worker._interface`` is what ``start_unsafe`` listens on, and
    ``Worker._instances`` holds the worker."""
    from distributed import Worker

    module = tmp_path / "gpudask_contract_preload.py"
    module.write_text(PRELOAD)
    for name in ("preload_argv", "nanny", "host", "interface"):
        assert name in Worker.__init__.__code__.co_varnames
    assert "self._interface" in inspect.getsource(Worker.start_unsafe)

    async def construct():
        return Worker("tcp://127.0.0.1:1", preload=[str(module)], nthreads=1)

    sys.path.insert(0, str(tmp_path))
    try:
        worker = asyncio.run(construct())
        seen = sys.modules["gpudask_contract_preload"].SEEN
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("gpudask_contract_preload", None)
    assert seen["keys"] == ["host", "interface", "nanny", "preload_argv", "self"]
    assert seen["worker"] is worker and seen["by_preload"] is True
    assert worker in compat.worker_instances()
    assert worker._interface is None
    compat.set_worker_interface(worker, "lo")
    assert worker._interface == "lo"
    assert compat.imported_by_distributed_preload(1) is False  # a test is not imported by distributed


def test_the_client_coroutines_run_and_gather_on_a_real_cluster():
    from distributed import Client, LocalCluster

    async def main():
        async with LocalCluster(n_workers=1, processes=False, asynchronous=True, dashboard_address=":0",
                                protocol="tcp") as cluster, Client(cluster, asynchronous=True) as client:
            worker = next(iter(cluster.scheduler.workers))
            pids = await compat.client_run(client, os.getpid, workers=[worker], on_error="return")
            on_scheduler = await compat.client_run_on_scheduler(client, os.getpid)
            future = client.submit(sum, [1, 2, 3])
            slow = client.submit(time.sleep, 0.2, pure=False)
            await compat.futures_done([slow])
            done = slow.status
            gathered = [await compat.client_gather(client, [future], direct=direct) for direct in (False, True)]
            return pids, on_scheduler, gathered, done

    pids, on_scheduler, gathered, done = asyncio.run(main())
    assert done == "finished"
    assert list(pids.values()) == [os.getpid()] and on_scheduler == os.getpid()  # in-process cluster
    assert gathered == [[6], [6]]


def test_a_metric_added_while_a_heartbeat_awaits_a_metric_leaves_the_worker_running():
    """distributed's Worker.get_metrics iterates over worker.metrics and awaits an awaitable
    metric on the way; gpudask's WorkerPlugin, registered on a running worker, adds its metrics
    meanwhile.  Before: the dict changed in place, "RuntimeError: dictionary changed size during
    iteration" in the heartbeat, and distributed closed the worker (CI, 2026-12-03)."""
    from distributed import Scheduler, Worker

    async def main():
        async with Scheduler(dashboard_address=":0", port=0) as scheduler, \
                Worker(scheduler.address, nthreads=1, dashboard=False) as worker:
            waiting, release = asyncio.Event(), asyncio.Event()

            async def slow(_worker):
                waiting.set()
                await release.wait()
                return 1

            compat.add_worker_metric(worker, "slow", slow)
            heartbeat = asyncio.create_task(worker.get_metrics())
            await waiting.wait()  # the iteration over worker.metrics is suspended in slow()
            assert compat.add_worker_metric(worker, "gpudask-test", lambda _worker: 2)
            release.set()
            during = await heartbeat
            after = await worker.get_metrics()
            kept = compat.add_worker_metric(worker, "gpudask-test", lambda _worker: 3)  # there: it stays
            replaced = compat.add_worker_metric(worker, "slow", lambda _worker: 4, replace=True)
            return during, after, kept, replaced, await worker.get_metrics()

    during, after, kept, replaced, last = asyncio.run(main())
    assert during["slow"] == 1 and after["gpudask-test"] == 2
    assert kept and replaced and last["gpudask-test"] == 2 and last["slow"] == 4
    assert compat.add_worker_metric(object(), "x", lambda _worker: 0) is False  # no metrics: a nanny


def test_the_scheduler_handlers_the_relay_wraps_exist_and_are_put_back():
    from distributed import Scheduler

    class Owner:
        pass

    owner, other = Owner(), Owner()

    async def main():
        async with Scheduler(dashboard_address=":0", port=0) as scheduler:
            assert list(inspect.signature(scheduler.report).parameters) == ["msg", "ts", "client"]
            originals = {}
            for name, stream in (("gather", False), ("subscribe-topic", True), ("update-graph", True)):
                table = scheduler.stream_handlers if stream else scheduler.handlers
                before = table[name]
                originals[name] = compat.wrap_handler(scheduler, name, lambda f: (lambda **kw: f(**kw)), owner,
                                                      stream=stream)
                assert originals[name] is before and table[name] is not before
                # wrapped once per owner
                assert compat.wrap_handler(scheduler, name, lambda f: f, owner, stream=stream) is None
                compat.unwrap_handler(scheduler, name, before, other, stream=stream)  # not its wrapper
                assert table[name] is not before
                compat.unwrap_handler(scheduler, name, before, owner, stream=stream)
                assert table[name] is before
            report = compat.wrap_report(scheduler, lambda f: (lambda msg, ts=None, client=None: f(msg, ts, client)),
                                        owner)
            assert scheduler.report is not report
            compat.unwrap_report(scheduler, report, owner)
            assert scheduler.report == report
            return originals

    assert all(asyncio.run(main()).values())


def test_the_offload_threshold_is_read_by_the_comms_at_each_message():
    import distributed.comm.utils as comm_utils

    for function in (comm_utils.to_frames, comm_utils.from_frames):
        assert "OFFLOAD_THRESHOLD" in inspect.getsource(function)
    saved = comm_utils.OFFLOAD_THRESHOLD
    try:
        compat.set_offload_threshold(12345)
        assert compat.offload_threshold() == 12345 == comm_utils.OFFLOAD_THRESHOLD
    finally:
        comm_utils.OFFLOAD_THRESHOLD = saved


def test_a_p2p_rechunk_names_its_transfer_tasks_with_the_prefix():
    import dask.array as da
    import dask.config

    x = da.ones((400, 400), chunks=(400, 1))
    with dask.config.set({"array.rechunk.method": "p2p"}):
        from distributed import Client, LocalCluster

        async def keys():
            async with LocalCluster(n_workers=1, processes=False, asynchronous=True, dashboard_address=":0",
                                    protocol="tcp") as cluster, Client(cluster, asynchronous=True):
                graph = x.rechunk((1, 400)).__dask_graph__()
                return [str(k[0] if isinstance(k, tuple) else k) for k in dict(graph)]

        names = asyncio.run(keys())
    assert any(name.startswith(compat.P2P_RECHUNK_TRANSFER_PREFIX) for name in names), sorted(set(names))[:10]


def test_the_tested_distributed_is_within_pyprojects_bounds():
    import distributed
    from packaging.specifiers import SpecifierSet

    text = (ROOT / "pyproject.toml").read_text()
    spec = re.search(r'"distributed(>=[^"]+)"', text).group(1)
    assert "<" in spec, "distributed needs an upper bound: the newest release these contracts ran on"
    assert distributed.__version__ in SpecifierSet(spec)


@pytest.mark.parametrize("folder", ["gpudask", "plugins"])
def test_no_private_name_of_distributed_is_used_outside_compat(folder):
    """Every reach into distributed's, distributed-ucxx's or click's private names is here."""
    private = re.compile(r"\b(?:distributed|distributed_ucxx|click)(?:\.\w+)*\._[a-z]\w*|"
                         r"\bfrom (?:distributed|distributed_ucxx|click)(?:\.\w+)* import \(?(?:\w+(?: as \w+)?, )*_[a-z]\w*|"
                         r"\b(?:client|worker|scheduler|module\.Worker|Client)\._(?:run|run_on_scheduler|gather|interface|"
                         r"instances|graph_to_futures|scatter)\b|_getframe|inspect\.currentframe|\bfamilies\[")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted((ROOT / folder).rglob("*.py")) if "compat" not in path.parts
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if private.search(line) and not line.lstrip().startswith("#")]
    assert found == []


# -- distributed-ucxx (gpudask/compat/distributed_ucxx.py) and multiprocessing (compat/forkserver.py) --
def test_distributed_ucxx_starts_ucx_in_init_once_and_marks_it_in_its_ucxx_global():
    """start_ucx resets the ``ucxx`` global after a failure: init_once must still set it before
    ``ucxx.init`` (or the reset is unneeded) and return at once while it is set."""
    comm = pytest.importorskip("distributed_ucxx.ucxx")
    from gpudask.compat.distributed_ucxx import ucx_started

    source = inspect.getsource(comm.init_once)
    assert "global ucxx" in source and "if ucxx is not None" in source
    assert source.index("ucxx = _ucxx") < source.index("ucxx.init(")
    assert hasattr(comm, "ucxx") and ucx_started() is (comm.ucxx is not None)


def test_the_fork_server_can_be_stopped_and_a_new_one_starts_with_the_new_environment(monkeypatch):
    import multiprocessing
    import multiprocessing.forkserver

    from gpudask.compat.forkserver import stop_forkserver

    monkeypatch.setenv("GPUDASK_CONTRACT_PROBE", "first")
    multiprocessing.forkserver.ensure_running()
    first = multiprocessing.forkserver._forkserver._forkserver_pid
    stop_forkserver()
    assert multiprocessing.forkserver._forkserver._forkserver_pid is None
    monkeypatch.setenv("GPUDASK_CONTRACT_PROBE", "second")
    context = multiprocessing.get_context("forkserver")
    with context.Pool(1) as pool:
        assert pool.apply(os.getenv, ("GPUDASK_CONTRACT_PROBE",)) == "second"
    assert multiprocessing.forkserver._forkserver._forkserver_pid not in (None, first)
    stop_forkserver()

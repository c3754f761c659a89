"""gpu-graph-data (issue 39): GPU objects in task graphs never materialise on the scheduler, and
large ones travel worker-direct.

A stand-in GPU library (``tests/standin/standin_gpu.py``) plays CuPy on this CPU machine: its
arrays pickle as a call of ``standin_gpu.to_device(host_copy)`` (CuPy's ``__reduce__`` is
``cupy._core.core.array(host_copy)``), which fails in a process started with
``STANDIN_GPU_VISIBLE=0`` -- the stand-in for a scheduler with ``CUDA_VISIBLE_DEVICES=""``.
The same tests run with CuPy on the GPU machine (``tests/test_gpu_less_scheduler_gpu.py``).
"""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import pickle
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
from conftest import base_env, host, plan_on

STANDIN = pathlib.Path(__file__).parent / "standin"
sys.path.insert(0, str(STANDIN))

import standin_gpu  # noqa: E402

from gpudask.compat import distributed as compat  # noqa: E402
from gpudask.plugins.graph_data import deferral, lifting, plugin  # noqa: E402

H200 = host("h200-single.json")
NO_GPU = host("no-gpu-ucx.json")


# ------------------------------------------------------------------ the scheduler's reader
def _read_graph(data: bytes, modules=("standin_gpu",)):
    token = deferral.READING_GRAPH.set(True)
    try:
        return deferral.DeferringUnpickler(data, modules).load()
    finally:
        deferral.READING_GRAPH.reset(token)


def test_a_graph_read_on_the_scheduler_makes_no_gpu_object_and_the_worker_makes_it(monkeypatch):
    task = ("f", standin_gpu.DeviceArray(np.arange(5)), {"meta": standin_gpu.DeviceArray(np.zeros(0))})
    data = pickle.dumps(task, protocol=5)
    monkeypatch.setenv("STANDIN_GPU_VISIBLE", "0")
    with pytest.raises(standin_gpu.NoDevice):  # what distributed's own reader meets there
        pickle.loads(data)
    made = standin_gpu.MADE[0]
    name, arg, kwargs = _read_graph(data)
    assert standin_gpu.MADE[0] == made  # nothing made on "the scheduler"
    assert isinstance(arg, deferral.DeferredCall) and (arg.module, arg.name) == ("standin_gpu", "to_device")
    assert arg.__sizeof__() >= 5 * 8  # it carries the host bytes, and says so
    again = pickle.dumps((name, arg, kwargs), protocol=5)  # the scheduler sends the task on
    monkeypatch.setenv("STANDIN_GPU_VISIBLE", "1")  # ... to a worker with a GPU
    _, out, kw = pickle.loads(again)
    assert type(out) is standin_gpu.DeviceArray and out.host.tolist() == [0, 1, 2, 3, 4]
    assert type(kw["meta"]) is standin_gpu.DeviceArray and kw["meta"].shape == (0,)


def test_the_scheduler_reads_cupy_graphs_without_cupy_installed(monkeypatch):
    """A pickle naming ``cupy._core.core.array`` (what a CuPy argument is in a graph) is read with no
    cupy importable; modules outside the deferred ones still load as pickle loads them."""
    fake = types.ModuleType("cupy._core.core")

    def array(host):
        raise AssertionError("never called while writing")

    array.__module__, array.__qualname__ = "cupy._core.core", "array"
    fake.array = array
    parents = {name: types.ModuleType(name) for name in ("cupy", "cupy._core")}

    class CupyLike:
        def __reduce__(self):
            return array, (np.arange(3),)

    for name, module in {**parents, "cupy._core.core": fake}.items():
        monkeypatch.setitem(sys.modules, name, module)
    data = pickle.dumps([CupyLike(), np.float64(2.5)], protocol=5)
    for name in ("cupy", "cupy._core", "cupy._core.core"):
        monkeypatch.delitem(sys.modules, name)
    deferred, number = _read_graph(data, deferral.DEFAULT_DEFERRED_MODULES)
    assert "cupy" not in sys.modules
    assert (deferred.module, deferred.name) == ("cupy._core.core", "array")
    assert deferred.args[0].tolist() == [0, 1, 2] and number == 2.5
    assert deferral.is_deferred("distributed.protocol.cupy", deferral.DEFAULT_DEFERRED_MODULES)
    assert not deferral.is_deferred("cupyish", deferral.DEFAULT_DEFERRED_MODULES)


def test_state_and_bare_references_survive_the_scheduler():
    """pickle's BUILD (state after the call) and a class object in the graph reach the worker intact."""
    data = pickle.dumps([standin_gpu.Stateful(7), standin_gpu.DeviceArray], protocol=5)
    stateful, cls = _read_graph(data)
    assert isinstance(stateful, deferral.DeferredCall) and isinstance(cls, deferral.DeferredGlobal)
    out, cls_out = pickle.loads(pickle.dumps([stateful, cls]))
    assert type(out) is standin_gpu.Stateful and out.value == 7 and out.extra == "set by BUILD"
    assert cls_out is standin_gpu.DeviceArray


def test_the_pickle_family_defers_only_while_a_graph_is_read(monkeypatch):
    """distributed's (de)serialize with the scheduler's loader: the same objects as before outside an
    update-graph, deferred inside one (contract: families["pickle"] is what deserialize calls)."""
    from distributed.protocol.serialize import deserialize, families, serialize

    dumps, loads, ctx = families["pickle"]
    monkeypatch.setitem(families, "pickle", (dumps, loads, ctx))  # put back after the test
    assert compat.wrap_pickle_family_loads(lambda original: deferral.deferring_pickle_loads(
        original, lambda: ("standin_gpu",)))
    assert not compat.wrap_pickle_family_loads(lambda original: original)  # once per process
    header, frames = serialize(standin_gpu.DeviceArray(np.arange(4)), serializers=["pickle"])
    assert type(deserialize(header, frames)) is standin_gpu.DeviceArray
    token = deferral.READING_GRAPH.set(True)
    try:
        assert isinstance(deserialize(header, frames), deferral.DeferredCall)
    finally:
        deferral.READING_GRAPH.reset(token)


# ------------------------------------------------------------------ the client's lift
def _scatter_recorder():
    seen = {}

    def scatter(found):
        seen.update(found)
        return {k: ("future", k) for k in found}

    return seen, scatter


def test_large_gpu_arguments_are_scattered_and_small_ones_stay():
    from dask._expr import LLGExpr
    from dask._task_spec import Task

    def f(*a, **k):
        return a

    big, small = standin_gpu.DeviceArray(np.ones(4096, "u1")), standin_gpu.DeviceArray(np.ones(16, "u1"))
    expr = LLGExpr({"k": Task("k", f, big, [small, big], nested=(big, 3), host=np.ones(10_000))})
    seen, scatter = _scatter_recorder()
    new, futures = lifting.lift(expr, scatter, 1024, (), "lift")
    task = new.operands[0]["k"]
    assert list(seen) == ["lift-0"] and seen["lift-0"] is big  # one object, one scatter, its own key
    assert task.dependencies == {"lift-0"} and futures == {"lift-0": ("future", "lift-0")}
    assert task.args[1][0] is small and type(task.kwargs["host"]) is np.ndarray  # host data is not ours
    assert expr.operands[0]["k"].dependencies == frozenset()  # the user's graph is left as it was
    unchanged, none = lifting.lift(expr, scatter, 10**9, (), "lift")
    assert unchanged is expr and none == {}


def test_from_array_source_is_scattered_and_the_names_are_kept():
    import dask.array as da
    from dask.base import collections_to_expr

    x = da.from_array(standin_gpu.DeviceArray(np.arange(4096)), chunks=1024)
    expr = collections_to_expr([x.sum()])
    seen, scatter = _scatter_recorder()
    new, _ = lifting.lift(expr, scatter, 1024, (), "lift")
    assert list(seen) == ["lift-0"] and type(seen["lift-0"]) is standin_gpu.DeviceArray
    assert new._name == expr._name and new.__dask_keys__() == expr.__dask_keys__()  # the client's futures match
    graph = dict(new.__dask_graph__())
    [alias] = [v for k, v in graph.items() if "original" in str(k)]
    assert alias.dependencies == {"lift-0"}


def test_device_size_is_read_without_importing_anything():
    assert lifting.device_nbytes(standin_gpu.DeviceArray(np.ones(8)), ()) == 64
    assert lifting.device_nbytes(np.ones(8), ()) is None and lifting.device_nbytes(3, ()) is None
    odd = types.SimpleNamespace(__cuda_array_interface__={}, nbytes=lambda: 3)
    assert lifting.device_nbytes(odd, ()) is None  # a size we cannot read: left in the graph


# ------------------------------------------------------------------ the contract with distributed
def test_distributed_still_has_what_gpu_graph_data_wraps():
    """The contract of gpudask.compat.distributed's client and serialization wrappers."""
    from distributed import Client, Scheduler
    from distributed.protocol.serialize import families, register_serialization_family

    params = list(inspect.signature(Client._graph_to_futures).parameters)
    assert params[:4] == ["self", "expr", "keys", "span_metadata"]
    assert list(inspect.signature(Client._gather).parameters)[:5] == ["self", "futures", "errors", "direct",
                                                                       "local_worker"]
    assert "direct" in inspect.signature(Client._scatter).parameters
    assert "pickle" in families and len(families["pickle"]) == 3 and callable(register_serialization_family)
    source = inspect.getsource(Scheduler.update_graph)
    assert "deserialize(expr_ser.header, expr_ser.frames)" in source  # read in the handler's own context
    assert inspect.iscoroutinefunction(Scheduler.update_graph)
    assert {"set_metadata", "get_metadata"} <= set(dir(Scheduler))


def test_the_plugin_keeps_its_settings_in_the_process_state_and_a_reset_forgets_them():
    from dask._expr import LLGExpr
    from dask._task_spec import Task

    from gpudask import session

    class Client:
        id, asynchronous = "c", False

        def scatter(self, found, **kw):
            return {k: f"future-{k}" for k in found}

    graph = LLGExpr({"k": Task("k", max, standin_gpu.DeviceArray(np.arange(1000)))})
    assert plugin._rewrite(Client(), graph) == (graph, None)  # no client plan set up: the graph as it is
    plugin._state().client = (0, ("standin_gpu",))
    assert session.current().plugin_states[plugin.name].client == (0, ("standin_gpu",))
    assert plugin._rewrite(Client(), graph)[1]  # set up: the GPU object is lifted
    session.reset()
    assert plugin._state().client is None and plugin._state().deferred == deferral.DEFAULT_DEFERRED_MODULES
    assert plugin._rewrite(Client(), graph) == (graph, None)


def test_the_plan_says_the_rule_and_the_threshold():
    h = plan_on(H200, "ucx", **{plugin.THRESHOLD: "4MiB"})
    client = [r for r in h.for_role("client").reasons if r.plugin == "gpu-graph-data"]
    assert len(client) == 1 and "4.00 MiB" in client[0].decision and "scatter-threshold=4194304" in client[0].why
    [sched] = [r for r in h.for_role("scheduler").reasons if r.plugin == "gpu-graph-data"]
    assert "stay host bytes" in sched.decision and "sees no GPU" not in sched.why
    [sched] = [r for r in plan_on(NO_GPU, "ucx").for_role("scheduler").reasons if r.plugin == "gpu-graph-data"]
    assert "sees no GPU, so gpudask clients gather and scatter worker-direct" in sched.why
    assert not [r for r in h.for_role("worker", 0).reasons if r.plugin == "gpu-graph-data"]


@pytest.mark.parametrize("bad", ["lots", -1, True, "1e400GB"])
def test_a_bad_threshold_is_one_line(bad):
    from gpudask.errors import GpudaskError

    with pytest.raises(GpudaskError) as e:
        plan_on(H200, "ucx", **{plugin.THRESHOLD: bad})
    assert plugin.THRESHOLD in str(e.value) and "a size such as" in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------ real processes
CLIENT = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import dask, dask.array as da
    from distributed import Client
    import standin_gpu
    if sys.argv[2] == "gpudask":
        import gpudask
        gpudask.initialize()
    out = {}
    with Client(scheduler_file=sys.argv[1], timeout=60) as client:
        client.wait_for_workers(1, timeout=120)
        def kind(a):
            return [type(a).__name__, float(np.asarray(a).sum())]
        def attempt(label, call):
            try:
                out[label] = call()
            except Exception as e:
                out[label] = "failed: " + type(e).__name__ + ": " + " ".join(str(e).split())[:300]
        small = standin_gpu.DeviceArray(np.arange(10.0))
        big = standin_gpu.DeviceArray(np.ones(2**21, dtype="u1"))  # 2 MiB: over the 1 MiB threshold
        attempt("submit_small", lambda: client.submit(kind, small).result(timeout=60))
        attempt("submit_big", lambda: client.submit(kind, big).result(timeout=60))
        attempt("map", lambda: client.gather(client.map(kind, [small, big, small * 2])))
        attempt("delayed", lambda: dask.delayed(kind)(big).compute())
        x = da.from_array(standin_gpu.DeviceArray(np.arange(2**18, dtype="f8")), chunks=2**16)  # 2 MiB
        attempt("from_array_sum", lambda: float(x.sum().compute()))
        p = x.persist()
        attempt("persist_slice", lambda: np.asarray(p[:4].compute()).tolist())
        attempt("scatter_gather", lambda: kind(client.gather(client.scatter(small))))
        events = client.get_events("all")
        out["scheduler_gathers"] = sum(1 for _, e in events if isinstance(e, dict) and e.get("action") == "gather")
        out["scheduler_made"] = client.run_on_scheduler(lambda: __import__("standin_gpu").MADE[0])
        out["scheduler_bytes_seen"] = client.run_on_scheduler(
            lambda dask_scheduler: sorted(str(k)[:12] for k in dask_scheduler.tasks))
    print("RESULT", json.dumps(out))
""")

EXPECTED = {"submit_small": ["DeviceArray", 45.0], "submit_big": ["DeviceArray", 2.0**21],
            "map": [["DeviceArray", 45.0], ["DeviceArray", 2.0**21], ["DeviceArray", 90.0]],
            "delayed": ["DeviceArray", 2.0**21], "from_array_sum": float(np.arange(2**18).sum()),
            "persist_slice": [0.0, 1.0, 2.0, 3.0], "scatter_gather": ["DeviceArray", 45.0]}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in base_env().items() if not k.startswith("UCX_") or k == "UCX_WARN_UNUSED_ENV_VARS"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(STANDIN), os.environ.get("PYTHONPATH")])),
               DASK_GPUDASK__GPU_GRAPH_DATA__DEFERRED_MODULES="standin_gpu", **extra)
    return env


def _run_client(cluster, tmp_path, kind: str) -> dict:
    script = tmp_path / "graph_client.py"
    script.write_text(CLIENT)
    run = subprocess.run([sys.executable, str(script), str(cluster.scheduler_file), kind], capture_output=True,
                         text=True, env=_env(UCX_TLS="tcp"), timeout=240, cwd=str(tmp_path))
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stdout + run.stderr + cluster.log("scheduler")
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.process
@pytest.mark.parametrize("kind", ["plain", "gpudask"])
def test_a_gpu_less_scheduler_runs_graphs_of_gpu_objects(cluster, tmp_path, kind):
    """A scheduler where the stand-in GPU library cannot make arrays, over UCX (TCP here), a worker where it
    can: a plain client and a gpudask client get every answer -- submit, map, delayed, from_array, persist,
    scatter and gather -- and the scheduler made no array.  The gpudask client's large arguments went
    worker-direct (the scheduler knew only their keys) and its gathers skipped the scheduler."""
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=_env(GPUDASK_FACTS=NO_GPU, STANDIN_GPU_VISIBLE="0"))
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nthreads", "2",
                   env=_env(GPUDASK_FACTS=H200, UCX_TLS="tcp", DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT="False"))
    out = _run_client(cluster, tmp_path, kind)
    for label, answer in EXPECTED.items():
        if kind == "plain" and label == "scatter_gather":
            continue  # scattered through a scheduler: it works here (no real GPU frames); the GPU test shows it
        assert out[label] == answer, (label, out)
    assert out["scheduler_made"] == 0, out
    if kind == "gpudask":
        assert out["scheduler_gathers"] == 0, out  # every gather went to the workers
    else:
        assert out["scheduler_gathers"] > 0, out


@pytest.mark.process
def test_without_the_plugin_the_same_graphs_fail_on_that_scheduler(cluster, tmp_path):
    """The control: gpu-graph-data disabled on the scheduler, the stand-in's graphs do not deserialise there."""
    cluster.scheduler("--preload", "gpudask", env=_env(STANDIN_GPU_VISIBLE="0",
                                                         DASK_GPUDASK__GPU_GRAPH_DATA__ENABLED="False"))
    cluster.worker("--preload", "gpudask", "--nthreads", "1", env=_env())
    out = _run_client(cluster, tmp_path, "plain")
    assert out["submit_small"].startswith("failed: RuntimeError: Error during deserialization"), out
    assert out["scheduler_made"] == 0

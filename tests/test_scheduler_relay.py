"""The scheduler relays GPU data (issue 25): its plan, its proof of effect, and a scheduler that cannot.

With distributed's default ``direct-to-workers: null`` every result a client gathers passes
through the scheduler; over UCX distributed-ucxx receives each GPU frame into device memory.
A scheduler with a GPU is planned for it; one without warns every client at once, and a
failed gather of GPU results raises one line instead of looping.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
import types

import pytest
from conftest import base_env, host, plan_on, real_gpu_count

from gpudask.apply import state
from gpudask.plugins import cuda_context
from gpudask.plugins.scheduler_parity import plugin as scheduler_parity
from gpudask.plugins.scheduler_parity.relay import RelayGuard, gpu_type, message

H200 = host("h200-single.json")
NO_GPU = host("no-gpu-ucx.json")  # a CPU host with distributed-ucxx, no InfiniBand


# ------------------------------------------------------------------ proof of effect
def _session(facts: str, role: str = "scheduler", **config):
    h = plan_on(facts, "ucx", **config)
    return types.SimpleNamespace(plan=h.for_role(role), ctx=h.ctx)


def _live(session, actual):
    """The live state with the CUDA context NVML would find (``actual``: its UUID, or None):
    the cuda-context plugin's read-back of it, as ``gpudask_applied_state`` returns it."""
    found = cuda_context.compare_context(session.ctx, session.plan, actual)
    return {"env": dict(session.plan.env), "config": dict(session.plan.config),
            "multiprocessing_method": session.plan.multiprocessing_method,
            "cuda_context": {"exists": actual is not None, "uuid": actual},
            **({"plugins": {"cuda-context": found}} if found else {})}


def test_scheduler_context_on_its_own_gpu_is_the_plan_not_a_mismatch():
    s = _session(H200)
    uuid = s.ctx.gpus[0].uuid
    # the plugin says in its section which GPU the context is planned on
    assert s.plan.sections["cuda-context"] == {"context_gpu": uuid}
    assert state.find_mismatches(s, _live(s, uuid)) == []
    [missing] = state.find_mismatches(s, _live(s, None))
    assert missing["key"] == "cuda_context" and missing["planned"] == uuid and missing["plugin"] == "cuda-context"
    [elsewhere] = state.find_mismatches(s, _live(s, "GPU-00000000-0000-0000-0000-000000000000"))
    assert elsewhere["planned"] == uuid


def test_nanny_context_is_still_a_mismatch_and_an_explicit_one_is_not(monkeypatch):
    s = _session(H200, "nanny")
    uuid = s.ctx.gpus[0].uuid
    assert s.plan.sections["cuda-context"] == {"context_gpu": None}
    [m] = state.find_mismatches(s, _live(s, uuid))
    assert m["planned"] is None and m["plugin"] == "cuda-context"
    s = _session(H200, "nanny", **{"distributed-ucxx.create-cuda-context": True})  # set by you
    assert state.find_mismatches(s, _live(s, uuid)) == []


def test_scheduler_with_explicit_tcp_plans_no_context(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "tcp")
    s = _session(H200)
    assert state.find_mismatches(s, _live(s, None)) == []
    [m] = state.find_mismatches(s, _live(s, s.ctx.gpus[0].uuid))
    assert m["planned"] is None


def test_a_context_on_a_mig_instance_of_the_planned_gpu_is_the_plan():
    s = _session(host("mig.json"))
    planned = s.plan.sections["cuda-context"]["context_gpu"]
    gpu = next(g for g in s.ctx.gpus if g.uuid == planned)
    instances = [i["uuid"] for i in gpu.mig.get("instances") or [] if i.get("uuid")]
    if planned.startswith("MIG-") or not instances:
        pytest.skip("the described MIG host's first visible GPU is an instance: nothing to map")
    assert state.find_mismatches(s, _live(s, instances[0])) == []


def test_no_section_on_a_described_host_without_gpus_and_no_read_back_there():
    s = _session(NO_GPU)
    assert "cuda-context" not in s.plan.sections
    assert cuda_context.compare_context(s.ctx, s.plan, None) is None
    assert cuda_context.gpudask_applied_state(s.ctx, s.plan) is None


# ------------------------------------------------------------------ who gets the guard
@pytest.mark.parametrize("facts, env, expected", [
    (NO_GPU, {}, "this scheduler sees no GPU"),
    (H200, {}, None),  # a normal scheduler is untouched
    (H200, {"UCX_TLS": "tcp"}, "this scheduler's UCX_TLS=tcp has no cuda transport"),
])
def test_relay_problem(monkeypatch, facts, env, expected):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    h = plan_on(facts, "ucx")
    assert scheduler_parity.relay_problem(h.ctx, h.scheduler) == expected
    assert scheduler_parity.relay_problem(plan_on(facts, "tcp").ctx, h.scheduler) is None


def test_gpu_types_and_worker_facts():
    assert gpu_type("cupy.ndarray") and gpu_type("cudf.core.dataframe.DataFrame") and gpu_type("rmm.DeviceBuffer")
    assert gpu_type("numba.cuda.cudadrv.devicearray.DeviceNDArray")
    assert not gpu_type("numpy.ndarray") and not gpu_type("pandas.core.frame.DataFrame") and not gpu_type(None)
    gpu = json.loads(open(H200).read())
    assert scheduler_parity.worker_has_gpus({"gpudask": {"facts": gpu}})
    assert not scheduler_parity.worker_has_gpus({"gpudask": {"facts": json.loads(open(NO_GPU).read())}})
    assert not scheduler_parity.worker_has_gpus({}) and not scheduler_parity.worker_has_gpus({"gpudask": "junk"})
    line = message("this scheduler sees no GPU", "ucx", ["ucx://10.0.0.1:1"])
    assert "\n" not in line and "direct=True" in line and "gpudask.initialize()" in line
    # what works and what does not, said precisely: gathers relay as host bytes, scatters cannot arrive
    assert "start the scheduler with a GPU visible" in line and "as host bytes" in line
    assert "cannot receive GPU data scattered through it" in line
    graph = message("this scheduler sees no GPU", "ucx", [], "reading failed", graph=True)
    assert "gpudask.gpu-graph-data.deferred-modules" in graph and "scattered" not in graph
    assert "gpudask: gathering failed: this scheduler" in message("this scheduler sees no GPU", "ucx", [], "gathering failed")


# ------------------------------------------------------------------ the gather handler
class _Result:
    """A task result; its class's module names the library (the scheduler sees ``TaskState.type``)."""


def _make(module: str):
    return type("Result", (_Result,), {"__module__": module})()


async def _get_data_fails(comm, keys=None, who=None, serializers=None):
    # what a GPU-less scheduler meets when a GPU frame arrives: the transfer fails
    raise RuntimeError("the transfer failed")


@pytest.mark.process
def test_failed_gather_of_gpu_results_raises_one_line_and_others_do_not():
    """In-process scheduler and worker (tcp); the scheduler's own gather handler is called over rpc, as a
    client's gather through the scheduler is."""
    from distributed import Client, Scheduler, Worker, wait
    from distributed.core import rpc

    async def main():
        async with Scheduler(dashboard_address=":0", port=0) as s:
            guard = RelayGuard("this scheduler sees no GPU", "ucx", lambda extra: True)
            s.add_plugin(guard, name="gpudask-relay")
            await guard.start(s)
            async with Worker(s.address, nthreads=1) as w, Client(s.address, asynchronous=True) as c:
                gpu = c.submit(_make, "cuspatial", pure=False)  # no serializer of distributed registers it
                host_side = c.submit(_make, "mylib", pure=False)
                ok = c.submit(sum, [1, 2], pure=False)
                await wait([gpu, host_side, ok])
                assert s.tasks[gpu.key].type.startswith("cuspatial.")
                async with rpc(s.address) as r:
                    assert (await r.gather(keys=[ok.key]))["status"] == "OK"
                w.handlers["get_data"] = _get_data_fails  # from now on every transfer from this worker fails
                async with rpc(s.address) as r:
                    with pytest.raises(RuntimeError, match="gathering GPU results through this scheduler failed: "
                                                           "this scheduler sees no GPU.*direct=True"):
                        await r.gather(keys=[gpu.key])
                    other = await r.gather(keys=[host_side.key])  # distributed's own answer: the client retries
                    assert other["status"] == "error" and list(other["keys"]) == [host_side.key]
            await guard.close()
            assert getattr(s.handlers["gather"], "__gpudask_relay__", None) is None

    asyncio.run(main())


# ------------------------------------------------------------------ real processes
PLAIN_CLIENT = textwrap.dedent("""
    import sys, time, warnings
    import numpy as np
    from distributed import Client
    assert "gpudask" not in sys.modules
    seen = []
    def wait_for_warning(n):
        deadline = time.time() + 60
        while len(seen) < n and time.time() < deadline:
            time.sleep(0.05)
        return len(seen) >= n
    warnings.simplefilter("always")  # the same text twice is two warnings here
    warnings.showwarning = lambda msg, *a, **k: seen.append(str(msg))
    with Client(scheduler_file=sys.argv[1], timeout=60) as client:   # connects before any worker
        print("connected", flush=True)
        client.wait_for_workers(1, timeout=120)
        assert wait_for_warning(1), "no warning when the GPU worker joined"
        assert client.submit(np.add, np.arange(3), 1).result(timeout=60).tolist() == [1, 2, 3]  # NumPy works
    with Client(scheduler_file=sys.argv[1], timeout=60) as client:   # connects with the GPU worker there
        assert wait_for_warning(2), "no warning at connect"
    assert "gpudask" not in sys.modules
    print("WARNINGS", len(seen))
    for line in seen:
        print("WARNING", line)
""")


def _ucx_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in base_env().items() if not k.startswith("UCX_") or k == "UCX_WARN_UNUSED_ENV_VARS"}
    env.update(extra)
    return env


@pytest.mark.process
def test_gpu_less_scheduler_warns_a_plain_client_once_per_connection(cluster, tmp_path):
    """A GPU-less UCX scheduler, a worker on a described H200 (UCX over TCP here: this machine has no CUDA),
    and a client that does not import gpudask: it gets one warning when the GPU worker joins, one at its next
    connect, each naming cause and fix; NumPy work passes through."""
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=_ucx_env(GPUDASK_FACTS=NO_GPU))
    script = tmp_path / "plain_client.py"
    script.write_text(PLAIN_CLIENT)
    client = subprocess.Popen([sys.executable, str(script), str(cluster.scheduler_file)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=_ucx_env(UCX_TLS="tcp"), cwd=str(tmp_path))
    assert client.stdout is not None
    assert client.stdout.readline().strip() == "connected"
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nthreads", "1",
                   env=_ucx_env(GPUDASK_FACTS=H200, UCX_TLS="tcp", DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT="False"))
    out, _ = client.communicate(timeout=240)
    assert client.returncode == 0, out + cluster.log("scheduler")
    lines = [line for line in out.splitlines() if line.startswith("WARNING ")]
    assert "WARNINGS 2" in out and len(lines) == 2, out
    for line in lines:
        assert "this scheduler sees no GPU, the workers have GPUs" in line and "protocol is ucx" in line
        assert "direct=True" in line and "start the scheduler with a GPU visible" in line
    assert "told client" in cluster.log("scheduler")


@pytest.mark.process
def test_explicit_scheduler_settings_are_its_plan_and_the_check_agrees(cluster):
    """UCX_TLS and create-cuda-context given to a scheduler on a described H200: its plan (set by you), no 'did
    not take effect' line, no not-applied finding, gpudask status clean.  (The RMM pool key is not given here:
    honoured, distributed-ucxx would build the pool on this machine, which has no GPU; plan tests cover it.)"""
    env = _ucx_env(GPUDASK_FACTS=H200, UCX_TLS="tcp", DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT="False")
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nthreads", "1",
                   env=_ucx_env(GPUDASK_FACTS=H200, UCX_TLS="tcp", DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT="False"))
    cli_env = _ucx_env(UCX_TLS="tcp")
    deadline = time.time() + 180
    while True:
        status = subprocess.run([sys.executable, "-m", "gpudask.cli", "status", "--json", "--scheduler-file",
                                 str(cluster.scheduler_file)], capture_output=True, text=True, env=cli_env, timeout=120)
        rows = json.loads(status.stdout).get("workers") if status.stdout.strip().startswith("{") else None
        if rows or time.time() > deadline:
            break
        time.sleep(0.5)
    assert status.returncode == 0, status.stdout + status.stderr + cluster.log("scheduler")
    check = subprocess.run([sys.executable, "-m", "gpudask.cli", "check", "--json", "--scheduler-file",
                            str(cluster.scheduler_file)], capture_output=True, text=True, env=cli_env, timeout=120)
    assert "not-applied" not in check.stdout, check.stdout
    log = cluster.log("scheduler")
    assert "did not take effect" not in log, log
    # UCX_TLS=tcp on a scheduler with a GPU cannot relay GPU frames: said at planning and to every client
    assert "the scheduler has GPU 0 but no CUDA transport" in log
    assert "this scheduler's UCX_TLS=tcp has no cuda transport" in log and "told client" in log
    info = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--json", "--protocol", "ucx"],
                          capture_output=True, text=True, env=env, timeout=120)
    scheduler = json.loads(info.stdout)["scheduler"]
    assert scheduler["env"]["UCX_TLS"] == "tcp"
    assert scheduler["config"]["distributed-ucxx.create-cuda-context"] is False
    assert sum("set by you" in r["why"] for r in scheduler["reasons"]) >= 2


# ------------------------------------------------------------------ graphs the scheduler cannot read
UNREADABLE_CLIENT = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from distributed import Client
    assert "gpudask" not in sys.modules

    def _rebuild(value):
        # stands in for a CuPy array: it unpickles anywhere but where GPUDASK_TEST_UNREADABLE is set
        if os.environ.get("GPUDASK_TEST_UNREADABLE"):
            raise RuntimeError("no GPU here to hold this object")
        return value

    class Unreadable:
        def __reduce__(self):
            return _rebuild, (1,)

    def outcome(label, future):
        t0 = time.time()
        try:
            print(label, "ok", future.result(timeout=30), flush=True)
        except Exception as e:
            text = " | ".join(str(e).splitlines())
            print(label, "failed", type(e).__name__, type(e).__module__, round(time.time() - t0, 2), text, flush=True)

    with Client(scheduler_file=sys.argv[1], timeout=60) as client:
        client.wait_for_workers(1, timeout=120)
        outcome("SUBMIT", client.submit(lambda a: a, Unreadable()))
        first = client.submit(lambda a: a, Unreadable(), key="unreadable-first")
        outcome("FIRST", first)
        outcome("DEPENDENT", client.submit(lambda a: a + 1, first, key="after-unreadable"))
        outcome("NUMPY", client.submit(np.add, np.arange(3), 1))
    assert "gpudask" not in sys.modules
""")


@pytest.mark.process
@pytest.mark.parametrize("gpu_less", [True, False], ids=["gpu-less-scheduler", "scheduler-with-gpu"])
def test_a_graph_the_scheduler_cannot_read_errs_with_the_line_only_where_it_sees_no_gpu(cluster, tmp_path,
                                                                                         gpu_less):
    """A plain client sends a graph holding an object that fails to unpickle on the scheduler process only
    (as CuPy objects do on a scheduler without a GPU).  On a GPU-less UCX scheduler with a GPU worker every key
    errs with a builtin RuntimeError carrying gpudask's line and the unpickling error's own; a graph depending
    on those futures is cancelled with the line as its message; NumPy work passes.  On a scheduler that sees a
    GPU (a described H200; UCX_TLS=tcp, so the relay guard is there too) distributed's own error is untouched."""
    unreadable = {"GPUDASK_TEST_UNREADABLE": "1"}
    if gpu_less:
        cluster.scheduler("--preload", "gpudask", protocol="ucx", env=_ucx_env(GPUDASK_FACTS=NO_GPU, **unreadable))
    else:
        cluster.scheduler("--preload", "gpudask", protocol="ucx",
                          env=_ucx_env(GPUDASK_FACTS=H200, UCX_TLS="tcp", **unreadable,
                                       DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT="False"))
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nthreads", "1",
                   env=_ucx_env(GPUDASK_FACTS=H200, UCX_TLS="tcp", DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT="False"))
    script = tmp_path / "unreadable_client.py"
    script.write_text(UNREADABLE_CLIENT)
    run = subprocess.run([sys.executable, str(script), str(cluster.scheduler_file)], capture_output=True, text=True,
                         env=_ucx_env(UCX_TLS="tcp"), timeout=240, cwd=str(tmp_path))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out + cluster.log("scheduler")
    got = {line.split()[0]: line for line in run.stdout.splitlines() if line.split()[:1] != []}
    assert got["NUMPY"] == "NUMPY ok [1 2 3]", out
    for label in ("SUBMIT", "FIRST"):
        line = got[label]
        assert line.startswith(f"{label} failed RuntimeError builtins "), out  # a builtin: any client loads it
        assert float(line.split()[4]) < 10, line
        if gpu_less:
            assert "gpudask: this scheduler could not read a task graph (RuntimeError: no GPU here to hold this " \
                   "object): this scheduler sees no GPU, the workers have GPUs" in line, line
            assert "start the scheduler with a GPU visible" in line and "Error during deserialization" not in line
        else:
            assert "Error during deserialization of the task graph" in line and "gpudask" not in line, line
    dependent = got["DEPENDENT"]
    assert dependent.startswith("DEPENDENT failed FutureCancelledError") and "lost dependencies" in dependent, out
    assert ("an earlier graph of this client could not be read on this scheduler" in dependent) is gpu_less, out
    log = cluster.log("scheduler")
    assert ("could not read a task graph" in log) is gpu_less, log


# ------------------------------------------------------------------ the GPU machine
GPU_CLIENT = textwrap.dedent("""
    import sys, time, warnings
    import cupy, dask.array as da
    from distributed import Client, futures_of, wait
    assert "gpudask" not in sys.modules
    seen = []
    warnings.simplefilter("always")
    warnings.showwarning = lambda msg, *a, **k: seen.append(str(msg))

    def flat(e):
        return " | ".join(str(e).splitlines())

    def attempt(label, call):
        t0 = time.time()
        try:
            out = call()
            print(label, "ok", type(out).__module__, getattr(out, "tolist", lambda: out)(), round(time.time() - t0, 2),
                  flush=True)
        except Exception as e:
            print(label, "failed", type(e).__name__, round(time.time() - t0, 2), flat(e), flush=True)

    def make_cupy():
        import cupy
        return cupy.arange(10) * 2

    def cupy_sum(a):
        return int(a.sum())

    with Client(scheduler_file=sys.argv[1], timeout=60) as client:
        client.wait_for_workers(2, timeout=120)
        ours = lambda: [flat(w) for w in seen if w.startswith("gpudask:")]
        deadline = time.time() + (30 if sys.argv[2] == "warned" else 0)
        while not ours() and time.time() < deadline:  # the connect-time warning comes on the client's stream
            time.sleep(0.05)
        print("WARNINGS", len(ours()), *ours()[:1], flush=True)
        z = (da.arange(1000, like=cupy.arange(10)) * 2).persist()
        wait(z, timeout=60)
        attempt("COMPUTE", lambda: client.compute(z[:10]).result(timeout=30))
        errors = {type(f.exception()).__name__ + " " + flat(f.exception()) for f in futures_of(z) if f.status == "error"}
        print("PERSISTED", len(errors), *sorted(errors)[:1], flush=True)
        attempt("SUBMIT", lambda: client.submit(lambda a: a * 2, cupy.ones(10)).result(timeout=30))
        f = client.submit(make_cupy)  # no CuPy object in the graph: made and consumed in the workers
        wait(f, timeout=60)
        attempt("INSIDE", lambda: client.submit(cupy_sum, f).result(timeout=30))
        attempt("RESULT", lambda: f.result(timeout=30))
        attempt("DIRECT", lambda: client.gather(f, direct=True))
        attempt("DIRECT-COMPUTE", lambda: client.gather(client.compute(z[:10]), direct=True))
""")


def _outcomes(out: str) -> dict[str, str]:
    return {line.split()[0]: line for line in out.splitlines() if line.split()[:1] and line.split()[0].isupper()}


@pytest.mark.gpu
@pytest.mark.process
@pytest.mark.parametrize("scheduler_gpu", [True, False], ids=["gpu-scheduler", "gpu-less-scheduler"])
def test_cupy_result_through_the_scheduler(cluster, tmp_path, scheduler_gpu):
    """On the GPU machine: a plain client computes a CuPy-backed array through a gpudask UCX cluster.  With a GPU
    scheduler and with CUDA_VISIBLE_DEVICES="" on it, everything works: the persist and a CuPy argument to submit
    (gpu-graph-data: the scheduler reads the graph without making the CuPy objects), a CuPy result gathered
    through the scheduler (relayed as host frames) and direct.  The GPU-less scheduler tells the client once, at
    connect, what it cannot do (scatter through it) and what to add, and holds no CUDA context."""
    if real_gpu_count() < 1:
        pytest.skip("needs a GPU")
    pytest.importorskip("cupy")
    env = _ucx_env()
    sched_env = dict(env) if scheduler_gpu else _ucx_env(CUDA_VISIBLE_DEVICES="")
    proc = cluster.scheduler("--preload", "gpudask", protocol="ucx", env=sched_env)
    cluster.worker("--protocol", "ucx", "--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    script = tmp_path / "gpu_client.py"
    script.write_text(GPU_CLIENT)
    run = subprocess.run([sys.executable, str(script), str(cluster.scheduler_file),
                          "none" if scheduler_gpu else "warned"], capture_output=True,
                         text=True, env=env, timeout=300, cwd=str(tmp_path))
    out = run.stdout + run.stderr
    print(out)
    got = _outcomes(run.stdout)
    why = out + cluster.log("scheduler")
    assert run.returncode == 0 and "DIRECT" in got, why
    assert got["DIRECT"].startswith("DIRECT ok cupy [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]"), why
    assert got["INSIDE"].startswith("INSIDE ok builtins 90 "), why
    for label in ("COMPUTE", "SUBMIT", "RESULT", "DIRECT-COMPUTE"):
        assert got[label].startswith(f"{label} ok cupy"), why
    assert got["PERSISTED"] == "PERSISTED 0", why
    if scheduler_gpu:
        assert got["WARNINGS"] == "WARNINGS 0", why
        assert "did not take effect" not in cluster.log("scheduler")
        return
    assert got["WARNINGS"].startswith("WARNINGS 1 gpudask: this scheduler sees no GPU, the workers have GPUs"), why
    assert "direct=True" in got["WARNINGS"] and "gpudask.initialize()" in got["WARNINGS"], why
    from distributed.diagnostics.nvml import has_cuda_context  # noqa: F401 - NVML is there: the process list
    smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30)
    assert str(proc.pid) not in smi.stdout.split(), smi.stdout  # no CUDA context, 0 MiB of GPU memory

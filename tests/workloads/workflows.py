"""The workflows of the workload suite: plain dask / distributed user code.

Nothing here imports gpudask (the one exception, :func:`register_plugin`, imports it
inside the function: registering gpudask's plugins is the user's own import there).
Every workflow takes ``(client, xp, ctx)`` -- ``xp`` is the array module of the data
(``numpy``, or ``cupy`` on a GPU) -- and returns ``(value, expected, detail)``: ``value``
summarises what the cluster computed, ``expected`` the same summary of a local NumPy
computation; the runner compares them for equality, and across cluster forms.
Integer data only, so every value is exact whatever the chunking or the device.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from typing import Any, Callable

import cloudpickle
import numpy as np

# the functions below run in the workers, which cannot import this module
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 100_000  # elements of the 1-d arrays
CHUNK = 10_000


class Ctx:
    """What a workflow may need besides the client: its time limit, the number of workers."""

    def __init__(self, timeout: float, nworkers: int = 2):
        self.timeout = timeout
        self.nworkers = nworkers


def host(a: Any) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array (or scalar)."""
    if hasattr(a, "get"):
        a = a.get()
    return np.asarray(a)


def summary(a: Any) -> dict[str, Any]:
    """An exact, JSON-able summary of an array: dtype, shape, sum, sha256 of its bytes."""
    h = np.ascontiguousarray(host(a))
    return {"dtype": str(h.dtype), "shape": list(h.shape), "sum": int(h.sum()),
            "sha256": hashlib.sha256(h.tobytes()).hexdigest()[:16]}


def module_of(a: Any) -> str:
    return type(a).__module__.partition(".")[0]


def _like(xp: Any) -> Any:
    return xp.empty(0, dtype="int64")


def _arange(xp: Any, n: int = N, chunks: int = CHUNK) -> Any:
    import dask.array as da

    return da.arange(n, chunks=chunks, dtype="int64", like=_like(xp))


def _workers(client: Any) -> list[str]:
    return sorted(client.scheduler_info()["workers"])


# ------------------------------------------------------------------------ workflows
def compute(client, xp, ctx):
    """``compute()`` of an array to the client (through the scheduler: distributed's default)."""
    x = _arange(xp) * 2
    r = client.compute(x).result(timeout=ctx.timeout)
    return summary(r), summary(np.arange(N, dtype="int64") * 2), {"type": module_of(r)}


def persist_slice(client, xp, ctx):
    """persist + wait + a slice brought back (the first example of docs/scheduler-check.md)."""
    from distributed import wait

    z = (_arange(xp, 1000, 100) * 2).persist()
    wait(z, timeout=ctx.timeout)
    r = client.compute(z[:10]).result(timeout=ctx.timeout)
    return summary(r), summary(np.arange(10, dtype="int64") * 2), {"type": module_of(r)}


def _double(a):
    return a * 2


def submit_arg(client, xp, ctx):
    """``submit`` with an array argument (it travels in the graph, through the scheduler)."""
    r = client.submit(_double, xp.arange(1000, dtype="int64")).result(timeout=ctx.timeout)
    return summary(r), summary(np.arange(1000, dtype="int64") * 2), {"type": module_of(r)}


def _total(a):
    return int(a.sum()), module_of(a)


def scatter(client, xp, ctx):
    """``scatter`` of an array, used by a task."""
    [f] = client.scatter([xp.arange(5000, dtype="int64")])
    total, where = client.submit(_total, f).result(timeout=ctx.timeout)
    return {"sum": total}, {"sum": int(np.arange(5000).sum())}, {"type_on_worker": where}


def _make(n, module):
    import importlib

    return importlib.import_module(module).arange(n, dtype="int64")


def _plus_one(a):
    return a + 1


def other_worker(client, xp, ctx):
    """A task result consumed by a task pinned to another worker (worker -> worker)."""
    w = _workers(client)
    if len(w) < 2:
        return None, None, {"skipped": f"needs 2 workers, has {len(w)}"}
    a = client.submit(_make, 3000, xp.__name__, workers=[w[0]], allow_other_workers=False, pure=False)
    b = client.submit(_plus_one, a, workers=[w[1]], allow_other_workers=False)
    r = b.result(timeout=ctx.timeout)
    where = client.who_has([a, b])
    return (summary(r), summary(np.arange(3000, dtype="int64") + 1),
            {"type": module_of(r), "a_on": list(where[a.key]), "b_on": list(where[b.key])})


def _three(b):
    out = b.copy()
    out[1:-1] = b[:-2] + b[1:-1] + b[2:]
    return out


def map_overlap(client, xp, ctx):
    """``map_overlap``: each element plus its two neighbours, across chunk edges."""
    x = _arange(xp).map_overlap(_three, depth=1, boundary=0)
    r = client.compute(x).result(timeout=ctx.timeout)
    n = np.pad(np.arange(N, dtype="int64"), 1)
    return summary(r), summary(n[:-2] + n[1:-1] + n[2:]), {"type": module_of(r)}


def reduction(client, xp, ctx):
    """Reductions: sum, max, and a count of a condition."""
    x = _arange(xp) % 7
    got = client.compute([x.sum(), x.max(), (x == 3).sum()])
    values = [int(host(v)) for v in client.gather(got)]
    n = np.arange(N, dtype="int64") % 7
    return values, [int(n.sum()), int(n.max()), int((n == 3).sum())], {}


def _columns_to_rows(client, xp, ctx):
    """A 2-d array persisted in column blocks, rechunked to row blocks: chunks move between workers."""
    from distributed import wait

    side = 400
    x = _arange(xp, side * side, side * side // 8).reshape(side, side).rechunk((side, side // 8)).persist()
    wait(x, timeout=ctx.timeout)
    on = {w for ws in client.who_has(x).values() for w in ws}
    y = x.rechunk((side // 8, side))  # the method is chosen here, in the client
    method = {"merge": "tasks"}.get(y.name.split("-")[1], y.name.split("-")[1])  # rechunk-merge / rechunk-p2p
    detail = {"input_on_workers": len(on), "method": method}
    try:
        r = client.compute(y.T).result(timeout=ctx.timeout)
    except Exception as e:
        e.workload_detail = detail
        raise
    n = np.arange(side * side, dtype="int64").reshape(side, side)
    return summary(r), summary(n.T), {"type": module_of(r), **detail}


def rechunk(client, xp, ctx):
    """``rechunk`` with ``array.rechunk.method="tasks"`` set in the client, as gpudask's warning tells a
    plain client to (P2P rechunk fails on CuPy chunks: see ``rechunk_p2p_default``)."""
    import dask

    with dask.config.set({"array.rechunk.method": "tasks"}):
        return _columns_to_rows(client, xp, ctx)


def rechunk_p2p_default(client, xp, ctx):
    """The same ``rechunk`` as a plain user writes it: dask's default method, P2P for this size with a
    distributed client, unless gpudask runs in the client.  On CuPy P2P fails in distributed (shards read
    through ``memoryview``) on every plain-client form, dask-cuda's included: the known limitation
    compare.py accepts.  ``gpudask_warning``: did the scheduler's warning reach this client."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            value, expected, detail = _columns_to_rows(client, xp, ctx)
        except Exception as e:
            e.workload_detail = {**getattr(e, "workload_detail", {}), "gpudask_warning": _warned(seen)}
            raise
    return value, expected, {**detail, "gpudask_warning": _warned(seen)}


def _warned(seen: list[Any]) -> bool:
    return any(str(w.message).startswith("gpudask:") and "P2P rechunk" in str(w.message) for w in seen)


def restart(client, xp, ctx):
    """``client.restart()``, then compute."""
    n = len(_workers(client))
    client.restart(timeout=ctx.timeout)
    client.wait_for_workers(n, timeout=ctx.timeout)
    r = client.compute(_arange(xp).sum()).result(timeout=ctx.timeout)
    return int(host(r)), int(np.arange(N).sum()), {"workers_after": len(_workers(client))}


def _slow(b):
    time.sleep(0.05)
    return b * 3


def kill_worker(client, xp, ctx):
    """A worker process killed (SIGKILL) mid-computation: the result is still right."""
    w = _workers(client)
    if len(w) < 2:
        return None, None, {"skipped": f"needs 2 workers, has {len(w)}"}
    pids = client.run(os.getpid)
    victim = w[-1]
    x = _arange(xp, N, 1000).map_blocks(_slow)  # 100 tasks of 50 ms on 2 workers
    fut = client.compute(x.sum())
    deadline = time.monotonic() + ctx.timeout
    # kill once the victim has done some of the work (it holds results others need)
    while not client.run(lambda dask_worker: len(dask_worker.data), workers=[victim]).get(victim):
        if fut.done() or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    killed = not fut.done()
    if killed:
        os.kill(pids[victim], signal.SIGKILL)
    r = fut.result(timeout=ctx.timeout)
    client.wait_for_workers(len(w), timeout=ctx.timeout)  # its nanny starts a new one
    return int(host(r)), int(np.arange(N).sum() * 3), {"killed": killed, "victim_pid": pids[victim]}


def _spill_state(dask_worker):
    data = dask_worker.data
    limit = getattr(data, "device_memory_limit", None)
    metrics = data.metrics() if hasattr(data, "metrics") else {}
    return {"store": type(data).__name__, "limit": limit,
            "spilled_count": metrics.get("spilled_count"), "unspilled_count": metrics.get("unspilled_count")}


def spill(client, xp, ctx):
    """A working set 2.5x each worker's device memory limit, persisted, then reduced."""
    from distributed import wait

    state = client.run(_spill_state)
    limits = [s["limit"] for s in state.values() if isinstance(s["limit"], int)]
    if not limits:
        return None, None, {"skipped": "no device memory limit on the workers (no gpudask spill store): "
                            + ", ".join(sorted({s["store"] for s in state.values()}))}
    limit = min(limits)
    chunk = max(limit // 8, 8) // 8  # elements of 8 bytes: a chunk is 1/8 of the limit
    n = int(2.5 * limit * len(state)) // 8 // chunk * chunk
    x = _arange(xp, n, chunk).persist()
    wait(x, timeout=ctx.timeout)
    total = client.compute(x.sum()).result(timeout=ctx.timeout)
    after = client.run(_spill_state)
    spilled = sum(s["spilled_count"] or 0 for s in after.values())
    detail = {"limit": limit, "working_set": n * 8, "spilled_count": spilled,
              "unspilled_count": sum(s["unspilled_count"] or 0 for s in after.values())}
    if xp.__name__ == "cupy" and not spilled:
        raise AssertionError(f"nothing was spilled with a working set of {n * 8} bytes over limits of {limit}")
    if xp.__name__ == "numpy":
        detail["note"] = ("NumPy objects are host objects: they go to the host tier (distributed's own store); "
                          "the device tier moves only GPU objects, shown with CuPy")
    return int(host(total)), n * (n - 1) // 2, detail


def register_plugin(client, xp, ctx):
    """gpudask's plugins registered on a running stock cluster (no --preload), then compute."""
    import gpudask
    from gpudask.apply.server_plugins import register

    n = len(_workers(client))
    status = register(client, restart=True)
    client.wait_for_workers(n, timeout=ctx.timeout)
    x = _arange(xp) * 5
    r = client.compute(x).result(timeout=ctx.timeout)
    after = gpudask.apply.server_plugins.status(client)
    return (summary(r), summary(np.arange(N, dtype="int64") * 5),
            {"type": module_of(r), "registered_on": len(status),
             "preloaded_after_restart": sorted(bool(s["preloaded"]) for s in after.values())})


WORKFLOWS: dict[str, Callable[..., Any]] = {f.__name__: f for f in (
    compute, persist_slice, submit_arg, scatter, other_worker, map_overlap, reduction, rechunk,
    rechunk_p2p_default, spill,
    kill_worker, restart, register_plugin)}
# run on a stock cluster (no --preload gpudask), in a client that imports gpudask
STOCK_ONLY = ("register_plugin",)


# ------------------------------------------------------------------------- driving
def run(client: Any, xp: Any, names: list[str], timeout: float, emit: Callable[[dict[str, Any]], None]) -> int:
    """Run the named workflows in order, one JSON-able line each through ``emit`` (a
    ``{"event": "start"}`` line before each, so a watchdog knows which one hung).
    Returns the number that did not pass."""
    import json
    import traceback

    ctx = Ctx(timeout, len(_workers(client)))
    bad = 0
    for name in names:
        emit({"event": "start", "workflow": name})
        start = time.monotonic()
        line: dict[str, Any] = {"workflow": name}
        try:
            value, expected, detail = WORKFLOWS[name](client, xp, ctx)
        except Exception as e:  # noqa: BLE001 - one workflow's failure is its line, the next one runs
            status = "timeout" if isinstance(e, TimeoutError) else "error"
            last = traceback.extract_tb(e.__traceback__)[-1:]
            where = f" (at {last[0].name}:{last[0].lineno})" if last else ""
            line.update(status=status, error=f"{type(e).__name__}: {e}"[:500] + where)
            if isinstance(getattr(e, "workload_detail", None), dict):  # what the workflow saw before failing
                line["detail"] = e.workload_detail
        else:
            if isinstance(detail, dict) and "skipped" in detail:
                line.update(status="skipped", detail=detail)
            else:
                value, expected = json.loads(json.dumps(value)), json.loads(json.dumps(expected))
                line.update(status="ok" if value == expected else "wrong", value=value, expected=expected,
                            detail=detail)
        line["seconds"] = round(time.monotonic() - start, 3)
        bad += line["status"] not in ("ok", "skipped")
        emit(line)
    return bad


def arguments(*extra: tuple[str, dict[str, Any]]) -> Any:
    """The arguments every client script of the suite takes (array, workflows, timeout,
    nworkers), plus the script's own ``(flag, keywords)`` pairs, parsed from ``sys.argv``."""
    import argparse

    p = argparse.ArgumentParser()
    for flag, kwargs in extra:
        p.add_argument(flag, **kwargs)
    p.add_argument("--array", default="numpy")
    p.add_argument("--workflows", required=True)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--nworkers", type=int, default=2)
    return p.parse_args()


def array_module(name: str) -> Any:
    import importlib

    if name not in ("numpy", "cupy"):
        raise SystemExit(f"--array {name!r}: accepted: numpy, cupy")
    return importlib.import_module(name)


def emitter(stream: Any = None) -> Callable[[dict[str, Any]], None]:
    import json

    out = stream or sys.stdout

    def emit(line: dict[str, Any]) -> None:
        out.write(json.dumps(line, default=str) + "\n")
        out.flush()

    return emit

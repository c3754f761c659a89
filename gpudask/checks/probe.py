"""``gpudask check --probe``: an array (CuPy when the workers have a GPU) through each path data
takes in a dask cluster, each within its own time limit (docs/scheduler-check.md).  The report is
also a ``gpudask-probe`` event on the scheduler, which the ``/gpudask`` page shows.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import textwrap
import time
import warnings
from collections.abc import Callable
from typing import Any

from gpudask.compat.distributed import client_gather, client_run, client_run_on_scheduler, futures_done

TOPIC = "gpudask-probe"  # the scheduler's event topic holding the probes' reports
PATHS = ("client -> worker", "worker -> worker", "worker -> client via scheduler", "worker -> client direct")
SIZE = 1 << 23  # int64 elements: 64 MiB, enough for a rate to tell a staged path from a direct one
RATE_REPEATS = 3  # transfers per data path; the best one gives the rate (the first maps IPC handles)
# a GPU path over UCX below this many GB/s (of payload) is staged through host memory: CUDA IPC on
# one H200 moved 64 MiB at 45 GB/s between workers and 11-16 GB/s to the client; TCP through host
# memory 0.5 GB/s.  The submit argument travels pickled in the graph (0.3 GB/s under dask-cuda
# too): no bar for it.
SLOW_GBPS = 2.0


def _worker_array_module() -> str:
    """``cupy`` when CuPy imports and sees a GPU in this process, else ``numpy``."""
    try:
        import cupy

        return "cupy" if cupy.cuda.runtime.getDeviceCount() > 0 else "numpy"
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no GPU: NumPy
        return "numpy"


def _make(n: int, module: str) -> Any:
    return importlib.import_module(module).arange(n, dtype="int64")


def _receive(x: Any, module: str) -> int:
    return int(importlib.import_module(module).asarray(x).sum())


def _sum_plus_one(x: Any) -> int:
    return int((x + 1).sum())


def _scheduler_gpus() -> int:
    """GPUs the scheduler process can use (NVML; creates no CUDA context)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return min(n, len([v for v in visible.split(",") if v.strip()])) if visible else n


def _host(a: Any) -> Any:
    import numpy as np

    return np.asarray(a.get() if hasattr(a, "get") else a)


def _one_line(e: BaseException) -> str:
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        return "no answer"
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:300] if text else type(e).__name__


def run_probe(client: Any, timeout: float = 10.0, workers: list[str] | None = None,
              nbytes: int = SIZE * 8) -> dict[str, Any]:
    """Probe every path within ``timeout`` seconds each; ``workers``: ``[source, destination]``
    (default: the first two by address); the report's ``status``: ``ok``, ``slow`` or ``failed``."""
    n = max(1, int(nbytes) // 8)
    from distributed.comm.addressing import parse_address

    def within(make: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return await asyncio.wait_for(make(), timeout)

        return client.sync(run)

    known = sorted(client.scheduler_info().get("workers") or {})
    address = client.scheduler.address
    protocol = parse_address(address)[0]
    report: dict[str, Any] = {"time": time.time(), "scheduler": address, "protocol": protocol,
                              "timeout": timeout, "workers": [], "array": None, "paths": [], "status": "failed"}

    def path(name: str, status: str, seconds: float | None = None, error: str | None = None,
             fix: str | None = None, detail: str | None = None) -> None:
        report["paths"].append({"path": name, "status": status, "seconds": None if seconds is None else
                                round(seconds, 4), "error": error, "fix": fix, "detail": detail})

    if workers:
        missing = [w for w in workers if w not in known]
        if missing:
            report["problem"] = (f"not a worker of this scheduler: {', '.join(missing)}; its workers: "
                                 f"{', '.join(known) or 'none'}")
            return report
        chosen = list(workers)[:2]
    else:
        chosen = known[:2]
    if not chosen:
        report["problem"] = "no workers connected: start workers, then probe again"
        return report
    report["workers"] = chosen
    a = chosen[0]
    b = chosen[1] if len(chosen) > 1 else None
    try:
        # the scheduler calls each worker at its address: one it cannot reach answers an error
        modules = within(lambda: client_run(client, _worker_array_module, workers=chosen, on_error="return"))
        scheduler_gpus = within(lambda: client_run_on_scheduler(client, _scheduler_gpus))
    except Exception as e:  # noqa: BLE001
        report["problem"] = f"the workers (or the scheduler) did not run a function: {_one_line(e)}"
        return report
    report["notes"] = [f"the scheduler could not call {w}: {_one_line(m)}" for w, m in sorted(modules.items())
                       if isinstance(m, BaseException)]
    answers = [m for m in modules.values() if isinstance(m, str)]
    module = "cupy" if answers and all(m == "cupy" for m in answers) else "numpy"
    report["array"] = module
    report["scheduler_gpus"] = scheduler_gpus
    relay_gpu_less = protocol.startswith("ucx") and module == "cupy" and not scheduler_gpus
    why_relay = ("the scheduler sees no GPU, the workers have one and the protocol is UCX: GPU data relayed "
                 "through the scheduler cannot be received there")
    fix_relay = ("give the scheduler a GPU (CUDA_VISIBLE_DEVICES on the scheduler), or send data directly: "
                 "distributed.client.direct-to-workers: true")

    # the data of the paths from the workers, made on the source worker: no client data involved
    try:
        source = client.submit(_make, n, module, workers=[a], allow_other_workers=False, pure=False)
        within(lambda: futures_done([source]))  # waits for the task only: the data stays on the worker
        if source.status != "finished":
            raise RuntimeError(f"the task on {a} ended {source.status}: {source.exception(timeout=timeout)!r}")
    except Exception as e:  # noqa: BLE001
        report["problem"] = f"worker {a} did not run a task within {timeout:g} s: {_one_line(e)}"
        return report
    expected = n * (n - 1) // 2

    # client -> worker: a submit argument, in the graph through the scheduler
    try:
        client_module = module
        try:
            data = _make(n, module)
        except Exception:  # noqa: BLE001 - the workers have CuPy, this client cannot make CuPy arrays
            client_module, data = "numpy", _make(n, "numpy")
        start = time.perf_counter()
        with warnings.catch_warnings():  # "Sending large graph": 64 MiB in the graph is the point here
            warnings.filterwarnings("ignore", "Sending large graph", UserWarning)
            future = client.submit(_receive, data, module, workers=[a], allow_other_workers=False, pure=False)
        got = future.result(timeout=timeout)
        seconds = time.perf_counter() - start
        if got != expected:
            path(PATHS[0], "failed", seconds, f"wrong value {got}, expected {expected}",
                 "see the worker's log; the data was corrupted on the way")
        else:
            path(PATHS[0], "ok", seconds, detail=f"{client_module} from the client"
                 + (" (this client has no CuPy / GPU)" if client_module != module else ""))
    except Exception as e:  # noqa: BLE001
        if relay_gpu_less and client_module == "cupy":
            path(PATHS[0], "failed", None, f"{_one_line(e)}: {why_relay}", fix_relay)
        else:
            path(PATHS[0], "failed", None, f"{_one_line(e)} within {timeout:g} s",
                 "the argument travels in the task graph through the scheduler: look in the scheduler's log for "
                 "'Error during deserialization'; the scheduler needs the client's packages")

    # worker -> worker
    if b is None:
        path(PATHS[1], "skipped", detail="one worker: no other worker to fetch from")
    else:
        try:
            start = time.perf_counter()
            got = client.submit(_sum_plus_one, source, workers=[b], allow_other_workers=False, pure=False).result(timeout=timeout)
            seconds = time.perf_counter() - start
            if got != expected + n:
                path(PATHS[1], "failed", seconds, f"wrong value {got}, expected {expected + n}",
                     "see the workers' logs; the data was corrupted on the way")
            else:
                try:
                    best = within(lambda: client_run(client, _pull, a, source.key, RATE_REPEATS, workers=[b]))[b]
                except Exception:  # noqa: BLE001 - a busy sender: the task's own fetch still times the path
                    best = seconds
                path(PATHS[1], "ok", min(seconds, best), detail=f"{b} fetched from {a}")
        except Exception as e:  # noqa: BLE001
            path(PATHS[1], "failed", None, f"{b} could not get data from {a}: {_one_line(e)} within {timeout:g} s",
                 f"the workers must reach each other at their addresses ({a}): check --interface / "
                 f"--contact-address, firewalls and UCX_TLS; see the workers' logs")

    # worker -> client, through the scheduler and directly
    for name, direct in ((PATHS[2], False), (PATHS[3], True)):
        try:
            seconds = float("inf")
            for _ in range(RATE_REPEATS):  # each gather moves the data again (the client keeps no copy)
                start = time.perf_counter()
                (got,) = within(lambda d=direct: client_gather(client, [source], direct=d))
                seconds = min(seconds, time.perf_counter() - start)
            total = int(_host(got).sum())
            if total != expected:
                path(name, "failed", seconds, f"wrong value {total}, expected {expected}",
                     "the data was corrupted on the way")
            else:
                path(name, "ok", seconds, detail=f"{type(got).__module__.partition('.')[0]} from {a}")
        except Exception as e:  # noqa: BLE001
            if not direct and relay_gpu_less:
                path(name, "failed", None, f"{_one_line(e)} within {timeout:g} s: {why_relay}", fix_relay)
            elif not direct:
                path(name, "failed", None, f"{_one_line(e)} within {timeout:g} s",
                     f"the scheduler fetches from {a} on the client's behalf: it must reach the workers' "
                     "addresses; see the scheduler's log ('Couldn't gather keys')")
            else:
                path(name, "failed", None, f"this client could not fetch from {a}: {_one_line(e)} within "
                     f"{timeout:g} s", f"this client must reach {a} (another network? --contact-address?); "
                     "results still come through the scheduler when distributed.client.direct-to-workers "
                     "is not true")
    source.release()
    report["payload_bytes"] = n * 8
    _rates(report, protocol, module, n * 8)
    statuses = {x["status"] for x in report["paths"]}
    report["status"] = "failed" if statuses - {"ok", "skipped", "slow"} else ("slow" if "slow" in statuses else "ok")
    try:
        client.log_event(TOPIC, report)  # the /gpudask page shows the last one
        report["stored"] = True
    except Exception as e:  # noqa: BLE001 - a probe result is still a result
        report["stored"] = False
        report["store_error"] = _one_line(e)
    return report


async def _pull(address: str, key: Any, repeats: int, dask_worker: Any = None) -> float:
    """Best seconds of ``repeats`` fetches of ``key`` from ``address``, the way ``gather_dep`` fetches."""
    from distributed.worker import get_data_from_worker

    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        response = await get_data_from_worker(dask_worker.rpc, [key], address, who=dask_worker.address)
        data = dict(response)["data"][key]  # an "OK" answer (a busy one raises below on the key)
        if type(data).__module__.startswith("cupy"):  # the copy is done when the stream is
            import cupy

            cupy.cuda.get_current_stream().synchronize()
        best = min(best, time.perf_counter() - start)
        del response, data
    return best


def _rates(report: dict[str, Any], protocol: str, module: str, nbytes: int = SIZE * 8) -> None:
    """Each ok path's rate; a GPU data path over UCX far below one host's hardware is ``slow``
    (judged for payloads of 64 MiB and up: smaller ones measure latency, not the link)."""
    for x in report["paths"]:
        if x["status"] != "ok" or not x["seconds"]:
            continue
        x["gbps"] = round(nbytes / x["seconds"] / 1e9, 2)
        if (protocol.startswith("ucx") and module == "cupy" and x["path"] != PATHS[0]
                and nbytes >= SIZE * 8 and x["gbps"] < SLOW_GBPS):
            x["status"] = "slow"
            x["fix"] = (f"{x['gbps']:g} GB/s for {nbytes >> 20} MiB: far below what GPUs of one host allow over CUDA IPC (45 GB/s "
                        "on an H200 between workers); the data is staged through host memory -- see the check's "
                        "staged-through-host finding: allow cuda_ipc in UCX_TLS (unset it: gpudask chooses)")


def format_probe(report: dict[str, Any], width: int | None = -1) -> str:
    """One line per path: ``ok`` with its time, or what failed and the fix; wrapped to ``width``
    (-1: the terminal's)."""
    from gpudask.textwidth import terminal_width, wrap_text

    if width == -1:
        width = terminal_width()
    head = (f"probe of {report.get('scheduler')} ({report.get('protocol')}): {report.get('array') or '?'} arrays, "
            f"workers {', '.join(report.get('workers') or []) or 'none'}, {report.get('timeout'):g} s per path")
    lines = [wrap_text(head, width)]
    if report.get("problem"):
        lines.append(wrap_text(f"failed: {report['problem']}", width))
    lines += [wrap_text(f"note: {n}", width) for n in report.get("notes") or []]
    column = max(len(p) for p in PATHS)
    for p in report.get("paths") or []:
        rate = f"{p['gbps']:7.2f} GB/s" if p.get("gbps") is not None else " " * 12
        if p["status"] == "ok":
            line = f"{p['path']:<{column}}  ok      {p['seconds'] * 1000:8.1f} ms {rate}  {p.get('detail') or ''}"
        elif p["status"] == "slow":
            line = f"{p['path']:<{column}}  SLOW    {p['seconds'] * 1000:8.1f} ms {rate}  fix: {p.get('fix')}"
        elif p["status"] == "skipped":
            line = f"{p['path']:<{column}}  skipped  {p.get('detail') or ''}"
        else:
            line = f"{p['path']:<{column}}  FAILED  {p.get('error')}; fix: {p.get('fix')}"
        line = line.rstrip()
        # continuations under the detail when the terminal leaves it room, else under the path
        detail_at = column + 2 + 8 + (9 + 3 + 12 + 2 if p["status"] in ("ok", "slow") else 0)
        indent = " " * (detail_at if width and width - detail_at >= 40 else 4)
        lines.append(_wrap_keeping_columns(line, width, indent, detail_at))
    lines.append(f"probe: {report.get('status')}")
    return "\n".join(lines)


def _wrap_keeping_columns(line: str, width: int | None, indent: str, fixed: int) -> str:
    """``line`` wrapped between words after its first ``fixed`` characters (the columns)."""
    if width is None or len(line) <= width:
        return line
    wrapped = textwrap.wrap(line[fixed:], width - fixed, break_on_hyphens=False, break_long_words=False)
    first, rest = (wrapped[0], wrapped[1:]) if wrapped else ("", [])
    if len(first) > width - fixed:  # its first word (an address) does not fit there: all of it below
        first, rest = "", wrapped
    tail = " ".join(rest)
    out = [(line[:fixed] + first).rstrip()]
    if tail:
        out += textwrap.wrap(tail, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False,
                             break_long_words=False)
    return "\n".join(out)

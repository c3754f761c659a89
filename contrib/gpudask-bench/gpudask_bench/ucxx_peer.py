"""One of the two plain processes of the ``raw-ucxx`` bench column: ucxx send/recv, no dask.

Run by path, never as ``-m gpudask...``, so the process imports neither gpudask nor dask (only the
standard library at the top): what it measures is ucxx alone.  ``serve`` (worker A) answers each
request with the buffer of the requested size; ``fetch`` (worker B) times ``send(request) ->
recv(nbytes)`` per size, as distributed times a fetch, and writes the times to ``--out``.  The
buffers are allocated once, outside the timed path: the figure is the transport's ceiling.  The
receiver checks the bytes against the sender's checksum after the timed runs.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
import time
from typing import Any

_PING = -1  # request index: the handshake, answered with the checksums
_STOP = -2  # request index: the receiver is done


def _init_ucxx(backend: str) -> tuple[Any, Any]:
    """ucxx, initialised, and the array module of ``backend``."""
    if backend == "cupy":
        # the CUDA context exists before UCX starts, on the first visible GPU, as
        # distributed-ucxx's init_once and ucxx's own send_recv benchmark make it
        from ucxx._cuda_context import ensure_cuda_context

        ensure_cuda_context(0)
    import ucxx

    # distributed-ucxx initialises ucxx in blocking progress mode unless UCXPY_PROGRESS_MODE
    # is set (distributed_ucxx.ucxx.init_once): the same here, so only the dask layer differs
    mode = None if "UCXPY_PROGRESS_MODE" in os.environ else "blocking"
    ucxx.init(env_takes_precedence=True, progress_mode=mode)
    return ucxx, importlib.import_module(backend)  # --backend is numpy or cupy: the array module's name


def _describe(ucxx: Any, backend: str) -> dict[str, Any]:
    """What this process runs with: the UCX transports, its GPU."""
    info: dict[str, Any] = {"pid": os.getpid(), "backend": backend,
                            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                            "cpus": sorted(os.sched_getaffinity(0))}
    for key, read in (("ucx_tls", lambda: ucxx.get_config().get("TLS")),
                      ("active_transports", lambda: sorted(ucxx.get_active_transports()))):
        try:
            info[key] = read()
        except Exception as e:  # reported, never fatal
            info[key] = f"error: {e}"
    if backend == "cupy":
        import cupy

        dev = cupy.cuda.Device()
        info["cuda_device"] = {"id": dev.id, "pci_bus_id": dev.pci_bus_id}
    return info


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)  # the bench polls for the file: it must never see half of it


def _checksum(xp: Any, buf: Any) -> int:
    return int(buf.sum(dtype=xp.uint64))


def _sync(xp: Any) -> None:
    if xp.__name__ == "cupy":
        xp.cuda.runtime.deviceSynchronize()


async def serve(args: argparse.Namespace) -> None:
    import numpy

    ucxx, xp = _init_ucxx(args.backend)
    # random bytes, so a transport cannot take a shortcut on constant data; the same
    # generator the bench's dask workers use for their arrays
    buffers = [xp.random.default_rng(i).random(n // 8).view(xp.uint8) for i, n in enumerate(args.sizes)]
    _sync(xp)  # the buffers exist before the first request is timed
    sums = numpy.array([_checksum(xp, b) for b in buffers], dtype=numpy.uint64)
    done = asyncio.Event()

    async def handler(ep: Any) -> None:
        request = numpy.empty(1, dtype=numpy.int64)
        try:
            while True:
                await ep.recv(request)
                index = int(request[0])
                if index == _STOP:
                    break
                await ep.send(sums if index == _PING else buffers[index])
        finally:
            await ep.close()
            done.set()

    listener = ucxx.create_listener(handler, port=0)
    _write_json(args.ready_file, {"port": listener.port, **_describe(ucxx, args.backend)})
    await done.wait()  # one receiver, one connection: serve it, then exit
    for _ in range(500):  # the handler's task retires a loop turn after it returns: close after it
        if not listener.active_clients:
            break
        await asyncio.sleep(0.01)
    listener.close()


async def fetch(args: argparse.Namespace) -> None:
    import numpy

    ucxx, xp = _init_ucxx(args.backend)
    deadline = time.monotonic() + args.max_seconds
    ep = await ucxx.create_endpoint(args.host, args.port)
    request = numpy.empty(1, dtype=numpy.int64)
    # handshake outside the timing: the connection is up and the checksums are known
    sums = numpy.empty(len(args.sizes), dtype=numpy.uint64)
    request[0] = _PING
    await ep.send(request)
    await ep.recv(sums)
    out: dict[str, Any] = {**_describe(ucxx, args.backend), "sizes": []}
    for index, nbytes in enumerate(args.sizes):
        buf = xp.zeros(nbytes, dtype=xp.uint8)
        _sync(xp)
        row: dict[str, Any] = {"nbytes": nbytes, "warmup": [], "runs": [], "note": None}
        out["sizes"].append(row)
        total = args.repeat + args.warmup
        for i in range(total):
            done = row["runs"] or row["warmup"]
            estimate = done[-1] if done else nbytes / 1e9  # 1 GB/s before the first run
            # the bench's own time-box rule (runner.Runner._loop): never start a run that won't fit
            if time.monotonic() + estimate * 1.2 + 0.5 > deadline:
                row["note"] = f"time box: {len(row['runs'])} of {args.repeat} runs"
                break
            request[0] = index
            t0 = time.perf_counter()
            await ep.send(request)
            # the recv completes once UCX has written all nbytes into buf (for CUDA transports
            # after its own stream work is done), which is where the transfer ends
            await ep.recv(buf)
            elapsed = time.perf_counter() - t0
            (row["warmup"] if i < args.warmup else row["runs"]).append(elapsed)
        if row["runs"] or row["warmup"]:
            row["verified"] = _checksum(xp, buf) == int(sums[index])
        if row["note"]:
            break  # the time box is spent: larger sizes would not fit either
    request[0] = _STOP
    await ep.send(request)
    await ep.close()
    _write_json(args.out, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ucxx_peer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("serve", "fetch"):
        p = sub.add_parser(role)
        p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], required=True)
        p.add_argument("--backend", choices=("numpy", "cupy"), required=True)
        p.add_argument("--cpus", default=None, help="comma-separated CPUs to bind to (the worker's)")
    serve_p, fetch_p = sub.choices["serve"], sub.choices["fetch"]
    serve_p.add_argument("--ready-file", required=True)
    fetch_p.add_argument("--host", required=True)
    fetch_p.add_argument("--port", type=int, required=True)
    fetch_p.add_argument("--repeat", type=int, required=True)
    fetch_p.add_argument("--warmup", type=int, default=1)
    fetch_p.add_argument("--max-seconds", type=float, required=True)
    fetch_p.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.cpus:
        # before ucxx and CUDA start threads, which inherit the binding (as in a gpudask worker)
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    asyncio.run(serve(args) if args.role == "serve" else fetch(args))


if __name__ == "__main__":
    main()

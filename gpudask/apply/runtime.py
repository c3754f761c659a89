"""This process: which role it plays and its command line, read cheaply and without CUDA
(it runs while ``dask worker``'s CLI imports the preload).  A nanny's worker process is a
``worker``; ``dask scheduler`` a ``scheduler``; ``dask worker`` a ``nanny`` (``worker`` with
``--no-nanny``); anything else a ``client``, where gpudask waits for :func:`gpudask.initialize`.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import sys
import time
from dataclasses import dataclass
from typing import Any

WORKER_PROCESS_NAME = "Dask Worker process (from Nanny)"


@dataclass
class CliArgs:
    command: str  # "scheduler" | "worker"
    nanny: bool = True
    nworkers: int | None = None  # resolved as distributed does (resolve_nworkers); 0: distributed refuses it
    protocol: str | None = None
    scheduler_address: str | None = None
    scheduler_file: str | None = None
    interface: str | None = None
    death_timeout: float | None = None  # seconds; None: wait for the scheduler without end
    preload: tuple[str, ...] = ()  # the --preload modules, gpudask among them
    preload_argv: tuple[str, ...] = ()  # what distributed passes a click-configurable preload

    def scheduler_protocol(self) -> str | None:
        """The protocol of the scheduler this command serves or joins, if known: ``dask worker
        --scheduler-file F`` waits for F (up to ``--death-timeout``); ``dask scheduler`` writes F."""
        if self.protocol or self.command != "worker":
            return self.protocol
        return protocol_from(self.scheduler_address, self.scheduler_file, wait=True, timeout=self.death_timeout)


def cli_args(command: str, ctx: Any) -> CliArgs:
    """The ``dask worker`` / ``dask scheduler`` options the plan depends on.  The preload is
    imported while click still parses, so ``ctx.params`` may be incomplete: ``sys.argv`` is
    parsed again by the same command without callbacks (``resilient_parsing``)."""
    argv = sys.argv[1:]
    if command in argv:
        argv = argv[argv.index(command) + 1:]
    try:
        params = ctx.command.make_context(ctx.info_name, list(argv), resilient_parsing=True).params
    except Exception:  # noqa: BLE001 - an unparsable command line: distributed reports it itself
        params = dict(ctx.params)
    nworkers = resolve_nworkers(params.get("n_workers") or params.get("nworkers") or params.get("nprocs"))
    from gpudask.compat.distributed import preload_argv_being_validated

    # what validate_preload_argv is validating: the re-parse cannot give them (that callback
    # refuses them while gpudask has no click command yet)
    preload_argv = tuple(str(a) for a in preload_argv_being_validated() or params.get("preload_argv") or ())
    address = params.get("scheduler") or None
    if isinstance(address, str) and address.startswith("-"):
        # `dask worker --scheduler-file F --preload gpudask --rmm-pool-size 1GB`: click took the
        # first preload option for the optional scheduler address: give it back to the preload
        preload_argv, address = (address, *preload_argv), None
        if "scheduler" in ctx.params:
            ctx.params["scheduler"] = None  # distributed then reads the scheduler file
    return CliArgs(command, nanny=bool(params.get("nanny", True)), nworkers=nworkers,
                   protocol=params.get("protocol") or None, scheduler_address=address,
                   scheduler_file=params.get("scheduler_file") or None, interface=params.get("interface") or None,
                   death_timeout=_seconds(params.get("death_timeout")),
                   preload=tuple(str(p) for p in params.get("preload") or ()),
                   preload_argv=preload_argv)


def resolve_nworkers(value: Any) -> int | None:
    """``dask worker --nworkers`` as distributed resolves it (``auto``, a negative n: CPU_COUNT
    + 1 + n); None when not given or not a number (click refuses it); 0 when distributed
    refuses it (it starts nothing)."""
    if value in (None, ""):
        return None
    if value == "auto":
        from distributed.deploy.utils import nprocesses_nthreads

        return int(nprocesses_nthreads()[0])
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    if n < 0:
        from dask.system import CPU_COUNT

        n = CPU_COUNT + 1 + n
    return max(n, 0)


def _seconds(value: Any) -> float | None:
    from dask.utils import parse_timedelta

    try:
        return None if value in (None, "") else float(parse_timedelta(value, default="seconds"))
    except (TypeError, ValueError, KeyError):
        return None  # distributed rejects it itself


def _click_command() -> tuple[str, Any] | None:
    click = sys.modules.get("click")
    if click is None:
        return None
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    name = (ctx.command.name or ctx.info_name or "").replace("dask-", "")
    for command in ("scheduler", "worker"):
        if name.endswith(command):
            return command, ctx
    return None


def detect_role() -> tuple[str, CliArgs | None]:
    if multiprocessing.current_process().name == WORKER_PROCESS_NAME:
        return "worker", None
    found = _click_command()
    if found is not None:
        command, ctx = found
        args = cli_args(command, ctx)
        if command == "scheduler":
            return "scheduler", args
        return ("nanny" if args.nanny else "worker"), args
    return "client", None


def set_listen_interface(interface: str) -> str:
    """Make the Worker being constructed listen on ``interface`` (it reads it before its
    preloads, uses it at ``listen()``).  A user's ``--host``/``--interface`` wins."""
    from gpudask.compat.distributed import set_worker_interface, worker_init_locals

    locals_ = worker_init_locals()
    worker = locals_.get("self")
    if worker is None:
        return "not applied: no Worker under construction in this process"
    given = locals_.get("host") or locals_.get("interface")
    if given:
        return f"not applied: --host/--interface given ({given})"
    set_worker_interface(worker, interface)
    return "applied"


def set_cli_interface(interface: str) -> str:
    """Make ``dask scheduler`` / ``dask worker`` (its nannies) listen on ``interface``, through
    click's ``default_map`` or the parameter it filled in.  A user's ``--host``/``--interface`` wins."""
    found = _click_command()
    if found is None:
        return "not applied: not inside dask scheduler / dask worker"
    _command, ctx = found
    on_argv = [a.split("=", 1)[0] for a in sys.argv if a.startswith(("--host", "--interface"))]
    if on_argv:  # on the command line, maybe after --preload (click has not parsed it yet)
        return f"not applied: {on_argv[0]} given"
    given = ctx.params.get("host") or ctx.params.get("interface")
    if given:
        return f"not applied: --host/--interface given ({given})"
    if "interface" in ctx.params:
        ctx.params["interface"] = interface
    else:
        ctx.default_map = {**(ctx.default_map or {}), "interface": interface}
    return "applied"


def protocol_from(address: str | None, scheduler_file: str | None, wait: bool = False,
                  timeout: float | None = None) -> str | None:
    """The scheme of ``address``, or of the address in ``scheduler_file``; with ``wait``, a file
    not written yet is waited for, up to ``timeout`` seconds (None: no end)."""
    if scheduler_file and not address:
        address = _address_in(scheduler_file, wait, timeout)
    from gpudask.checks import scheme

    return scheme(address)


# how often a file not written yet is looked for: distributed's 0.1 s made a worker find its
# scheduler's file 50 ms late on average (issue 41); after _FAST_S as distributed does (on a
# shared file system each look of every node is a metadata server's request)
_POLL_S, _FAST_S, _SLOW_POLL_S = 0.01, 2.0, 0.1


def _address_in(scheduler_file: str, wait: bool, timeout: float | None) -> str | None:
    """The address a scheduler file holds; None when it holds none (or ``timeout`` passed)."""
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    while True:
        try:
            if os.path.exists(scheduler_file) and not os.path.isfile(scheduler_file):
                return None  # a FIFO would block the read for ever
            address = json.loads(pathlib.Path(scheduler_file).read_text()).get("address")
            return address if isinstance(address, str) else None
        except (FileNotFoundError, ValueError):
            pass  # not written yet, or being written: read it again
        except (OSError, AttributeError, RecursionError):
            return None
        if not wait or (deadline is not None and time.monotonic() >= deadline):
            return None
        time.sleep(_POLL_S if time.monotonic() - start < _FAST_S else _SLOW_POLL_S)

"""This process: which role it plays, its plan, and the state gpudask keeps in it.

Role detection must be cheap and must never touch CUDA: it runs when ``dask worker``'s
CLI imports the preload.  It looks at

* the multiprocessing process name distributed gives worker processes spawned by a
  nanny (``"Dask Worker process (from Nanny)"``) -> ``worker``;
* the click command being run (``dask scheduler`` -> ``scheduler``; ``dask worker``
  -> ``nanny``, or ``worker`` with ``--no-nanny``);
* otherwise the process is a user's (``client``): importing gpudask there does nothing
  until :func:`gpudask.initialize` is called.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import multiprocessing
import os
import pathlib
import sys
from dataclasses import dataclass
from typing import Any

from gpudask.errors import ConfigError, GpudaskError

logger = logging.getLogger("distributed.gpudask")

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
        """The protocol of the scheduler this command serves or joins, if it can be known.

        ``dask worker --scheduler-file F`` started beside the scheduler (the usual job
        script) may find F not written yet: distributed waits for it (up to
        ``--death-timeout``) and then takes the scheduler's protocol, so gpudask waits the
        same way rather than plan for tcp.  ``dask scheduler --scheduler-file F`` writes F:
        an old F says nothing about the new scheduler."""
        if self.protocol:
            return self.protocol
        if self.command != "worker":
            return None
        return protocol_from(self.scheduler_address, self.scheduler_file, wait=True, timeout=self.death_timeout)


def cli_args(command: str, ctx: Any) -> CliArgs:
    """The ``dask worker`` / ``dask scheduler`` options the plan depends on, parsed by the
    command's own click parameters.

    The preload is imported from a click callback while the command line is still being
    parsed, so ``ctx.params`` may be incomplete: parse ``sys.argv`` again with the same
    command, without callbacks (``resilient_parsing``), which never imports the preload."""
    argv = sys.argv[1:]
    if command in argv:
        argv = argv[argv.index(command) + 1:]
    try:
        params = ctx.command.make_context(ctx.info_name, list(argv), resilient_parsing=True).params
    except Exception:  # noqa: BLE001 - an unparsable command line: distributed reports it itself
        params = dict(ctx.params)
    nworkers = resolve_nworkers(params.get("n_workers") or params.get("nworkers") or params.get("nprocs"))
    preload_argv = tuple(str(a) for a in _preload_argv_validated() or params.get("preload_argv") or ())
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


def _preload_argv_validated() -> Any:
    """The preload arguments distributed's ``validate_preload_argv`` is validating: it imports
    the preloads (gpudask among them) before it hands the arguments to their click command.
    (The re-parse above cannot give them: that callback refuses them while gpudask, half
    imported, has no click command yet.)"""
    from gpudask.compat.distributed import preload_argv_being_validated

    return preload_argv_being_validated()


def resolve_nworkers(value: Any) -> int | None:
    """``dask worker --nworkers`` as distributed resolves it (``distributed.cli.dask_worker``):
    ``auto`` -> ``nprocesses_nthreads()``'s process count, a negative n -> CPU_COUNT + 1 + n
    (this machine's CPU count, as distributed uses, even on a described host).  None when
    not given (or not a number: click refuses it); 0 when distributed refuses the value
    itself (fewer than one worker: it then starts nothing)."""
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


def worker_init_locals() -> dict[str, Any]:
    """Arguments of the ``Worker.__init__`` that is importing us, if any.

    The preload is imported from inside ``Worker.__init__``; its arguments say which
    scheduler (hence protocol) and which nanny this worker belongs to, before the
    worker has parsed them itself.
    """
    from gpudask.compat.distributed import worker_init_locals as locals_of_worker_init

    return locals_of_worker_init()


def set_listen_interface(interface: str) -> str:
    """Make the Worker being constructed listen on ``interface`` (before its listen()).

    The worker reads ``host``/``interface`` in ``Worker.__init__`` before importing its
    preloads and only uses them at ``listen()``; the nanny passes them through from the
    ``dask worker`` flags.  A user's ``--host``/``--interface`` wins.
    """
    locals_ = worker_init_locals()
    worker = locals_.get("self")
    if worker is None:
        return "not applied: no Worker under construction in this process"
    if locals_.get("host") or locals_.get("interface"):
        return f"not applied: --host/--interface given ({locals_.get('host') or locals_.get('interface')})"
    from gpudask.compat.distributed import set_worker_interface

    set_worker_interface(worker, interface)
    return "applied"


def set_cli_interface(interface: str) -> str:
    """Make ``dask scheduler`` / ``dask worker`` (its nannies) listen on ``interface``.

    The preload is imported while click parses the command line: options given on the
    command line are parsed already (a user's ``--host``/``--interface`` wins), the others
    not yet -- the value becomes the default click gives ``--interface`` (its
    ``default_map``), or the parameter itself when click has already filled in the default."""
    found = _click_command()
    if found is None:
        return "not applied: not inside dask scheduler / dask worker"
    _command, ctx = found
    given = [a.split("=", 1)[0] for a in sys.argv if a.startswith(("--host", "--interface"))]
    if given:  # on the command line, maybe after --preload (click has not parsed it yet)
        return f"not applied: {given[0]} given"
    if ctx.params.get("interface") or ctx.params.get("host"):
        return f"not applied: --host/--interface given ({ctx.params.get('host') or ctx.params.get('interface')})"
    if "interface" in ctx.params:
        ctx.params["interface"] = interface
    else:
        ctx.default_map = {**(ctx.default_map or {}), "interface": interface}
    return "applied"


def protocol_from(address: str | None, scheduler_file: str | None, wait: bool = False,
                  timeout: float | None = None) -> str | None:
    """The scheme of ``address``, or of the address in ``scheduler_file``.  With ``wait``, a
    file not written yet is waited for as distributed's own ``json_load_robust`` does
    (``timeout`` seconds; None: no end, distributed's default)."""
    if scheduler_file and not address:
        try:
            if wait:
                from distributed.utils import json_load_robust

                address = json_load_robust(scheduler_file, timeout=timeout).get("address")
            else:
                address = json.loads(pathlib.Path(scheduler_file).read_text()).get("address")
        except (OSError, ValueError, TimeoutError):
            address = None
    from gpudask.checks import scheme

    return scheme(address)


# -- which worker of the host am I ---------------------------------------------------
_held_slot: list[Any] = []  # what holds this process's slot: a locked file, a bound socket


def _slot_socket(group: str, i: int) -> Any:
    """A second hold on slot ``i`` that no file operation can take away (Linux): a Unix
    socket bound to an abstract name (no file; freed when the process dies).  Another
    process holding it: None.  Elsewhere, or no socket: True (the file lock alone)."""
    import hashlib
    import socket

    if not sys.platform.startswith("linux"):
        return True
    digest = hashlib.sha256(group.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(f"\0gpudask-{os.getuid()}-{digest}-slot-{i}")
    except OSError as e:
        sock.close()
        return None if e.errno == errno.EADDRINUSE else True
    return sock


def claim_worker_slot(group: str, owner: str | None = None, limit: int = 4096) -> int:
    """The lowest free worker number of ``group`` on this host, held until exit.

    A file lock per number: the OS frees it when the process dies, so a worker that
    exits (scale down, restart, crash) frees its number and its GPU, and the next worker
    process takes the lowest free one -- the number its nanny (``owner``) held before
    first, so a restarted worker keeps its GPU.  On Linux each number is also held by an
    abstract socket name: a state directory removed under a running cluster (tmpfiles
    cleaning ``/tmp``), full or read-only does not hand a live worker's number, and its GPU,
    to a second worker."""
    from gpudask.facts import statedir

    # a private folder of the private state directory: nobody else can take or fake a slot
    base: pathlib.Path | None = None
    try:
        base = statedir.subdir(statedir.state_dir(), group)
    except (OSError, GpudaskError) as e:
        logger.warning("gpudask: worker numbers claimed without the state directory (%s)", _one_line(e))
    order = list(range(limit))
    if owner and base is not None:
        for mark in base.glob("slot-*.owner"):
            number = mark.name[len("slot-"):-len(".owner")]
            if not number.isdigit() or int(number) >= limit:
                continue
            if statedir.read_private(mark, "worker slot owner file") == owner:
                i = int(number)
                order.remove(i)
                order.insert(0, i)
                break
    without_files = base is None
    for i in order:
        f = None
        if base is not None:
            try:
                f = os.fdopen(statedir.open_private(base / f"slot-{i}.lock", os.O_RDWR), "a+")
            except OSError as e:  # ENOSPC, EROFS, the directory removed meanwhile: the socket holds it
                if not without_files:
                    logger.warning("gpudask: worker number %d claimed without its lock file (%s)", i, _one_line(e))
                without_files = True
            if f is not None:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    f.close()
                    continue
        sock = _slot_socket(group, i)
        if sock is None or (sock is True and f is None):  # held by a live worker / no hold at all
            if f is not None:
                f.close()
            continue
        if owner and base is not None:
            try:
                statedir.write_atomic(base / f"slot-{i}.owner", owner)
            except OSError:
                pass  # only a preference for the next start
        _held_slot[:] = [f, sock]  # kept (and the lock and the name held) for the life of the process
        return i
    raise ConfigError(f"no free gpudask worker slot in {base} (more than {limit} workers?)")


def _one_line(e: BaseException) -> str:
    return " ".join(str(getattr(e, "strerror", None) or e).split())[:300]


def worker_index(owner: str | None = None) -> int:
    """This worker process's number: ``$GPUDASK_WORKER_INDEX``, or the lowest free slot of
    the workers started by the same planning process (``$GPUDASK_GROUP``; siblings of the
    same parent otherwise), preferring the one ``owner`` (its nanny's address) held."""
    explicit = os.environ.get("GPUDASK_WORKER_INDEX")
    if explicit:
        from gpudask.plan.planner import MAX_NWORKERS

        text = explicit.strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 6 and int(text) < MAX_NWORKERS):
            raise ConfigError(f"GPUDASK_WORKER_INDEX={explicit[:40]!r} is not valid; accepted: an integer from 0 "
                              f"to {MAX_NWORKERS - 1}")
        return int(text)
    from gpudask.apply.hostfile import GROUP_ENV

    return claim_worker_slot(os.environ.get(GROUP_ENV) or f"ppid-{os.getppid()}", owner)


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

import fcntl
import inspect
import json
import multiprocessing
import os
import pathlib
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from gpudask.errors import ConfigError

WORKER_PROCESS_NAME = "Dask Worker process (from Nanny)"
SHADOW_ENV = "GPUDASK_SHADOWED"  # JSON {"env": {name: original}, "config": {key: original}}


@dataclass
class CliArgs:
    command: str  # "scheduler" | "worker"
    nanny: bool = True
    nworkers: int | None = None
    protocol: str | None = None
    scheduler_address: str | None = None
    scheduler_file: str | None = None
    interface: str | None = None


def parse_cli_args(command: str, argv: list[str]) -> CliArgs:
    """The few ``dask worker`` / ``dask scheduler`` flags the plan depends on.

    Read from ``sys.argv`` because the preload is imported by a click callback, when
    the other parameters may not be parsed yet.
    """
    args = CliArgs(command)
    takes_value = {"--nworkers", "--nprocs", "--protocol", "--scheduler-file", "--host", "--port",
                   "--interface", "--nthreads", "--name", "--memory-limit", "--resources", "--preload",
                   "--preload-nanny", "--local-directory", "--dashboard-address", "--worker-port",
                   "--nanny-port", "--contact-address", "--listen-address", "--death-timeout",
                   "--lifetime", "--lifetime-stagger", "--pid-file", "--tls-ca-file", "--tls-cert",
                   "--tls-key", "--scheduler-sni", "--dashboard-prefix", "--nanny-contact-address",
                   "--worker-class", "--preload-argv", "--idle-timeout", "--jupyter-port", "--bokeh-port"}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, _, inline = arg.partition("=")
        value = inline if inline else (argv[i + 1] if name in takes_value and i + 1 < len(argv) else None)
        if name in takes_value and not inline:
            i += 1
        if name in ("--nworkers", "--nprocs") and value:
            try:
                args.nworkers = int(value)
            except ValueError:
                args.nworkers = None  # "auto": decided by distributed from the CPU count
        elif name == "--no-nanny":
            args.nanny = False
        elif name == "--nanny":
            args.nanny = True
        elif name == "--protocol":
            args.protocol = value
        elif name == "--scheduler-file":
            args.scheduler_file = value
        elif name == "--interface":
            args.interface = value
        elif not arg.startswith("-") and args.scheduler_address is None and command == "worker":
            args.scheduler_address = arg
        i += 1
    return args


def _click_command() -> tuple[str, list[str]] | None:
    click = sys.modules.get("click")
    if click is None:
        return None
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    name = (ctx.command.name or ctx.info_name or "").replace("dask-", "")
    for command in ("scheduler", "worker"):
        if name.endswith(command):
            # `dask worker ...` -> argv after "worker"; `dask-worker ...` -> argv[1:]
            argv = sys.argv[1:]
            if command in argv:
                argv = argv[argv.index(command) + 1:]
            return command, argv
    return None


def detect_role() -> tuple[str, CliArgs | None]:
    if multiprocessing.current_process().name == WORKER_PROCESS_NAME:
        return "worker", None
    found = _click_command()
    if found is not None:
        command, argv = found
        args = parse_cli_args(command, argv)
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
    frame = inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__init__" and "preload_argv" in code.co_varnames and "nanny" in code.co_varnames:
            return dict(frame.f_locals)
        frame = frame.f_back
    return {}


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
    worker._interface = interface
    return "applied"


def protocol_from(address: str | None, scheduler_file: str | None) -> str | None:
    if scheduler_file and not address:
        try:
            address = json.loads(pathlib.Path(scheduler_file).read_text()).get("address")
        except (OSError, ValueError):
            address = None
    if address and "://" in address:
        return address.split("://", 1)[0]
    return None


# -- undoing what gpudask did to a parent process ------------------------------------
def load_shadow() -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(os.environ.get(SHADOW_ENV) or "{}")
    except ValueError:
        data = {}
    return {"env": dict(data.get("env", {})), "config": dict(data.get("config", {}))}


def user_environ() -> dict[str, str]:
    """os.environ as the user set it: gpudask's changes in parent processes taken out."""
    env = dict(os.environ)
    for name, original in load_shadow()["env"].items():
        if original is None:
            env.pop(name, None)
        else:
            env[name] = original
    return env


def user_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of dask's config with gpudask's changes to this process taken out."""
    import copy

    import dask.config

    shadowed = load_shadow()["config"]
    if not shadowed:
        return config
    out = copy.deepcopy(config)
    for key, original in shadowed.items():
        dask.config.set({key: original}, config=out)
    return out


def restore_parent_changes() -> None:
    """In a child of a process gpudask configured (a nanny's worker), put the user's
    environment and config back before planning: the parent's plan was not ours."""
    shadow = load_shadow()
    if not shadow["env"] and not shadow["config"]:
        return
    import dask.config

    for name, original in shadow["env"].items():
        if original is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = original
    for key, original in shadow["config"].items():
        dask.config.set({key: original})
    os.environ.pop(SHADOW_ENV, None)


# -- which worker of the host am I ---------------------------------------------------
_held_slot: Any = None


def claim_worker_slot(group: str, preferred_owner: str | None, limit: int = 4096) -> int:
    """The lowest free worker number of ``group`` on this host, held until exit.

    A file lock per number: the OS frees it when the process dies, so a killed worker
    frees its GPU, and a restarted one (the nanny spawns a new process) takes a free
    number again -- its previous one first, found by the nanny address it recorded.
    """
    global _held_slot
    base = pathlib.Path(tempfile.gettempdir()) / f"gpudask-{os.getuid()}" / group.replace("/", "_")
    base.mkdir(parents=True, exist_ok=True)
    order = list(range(limit))
    if preferred_owner:
        for owner in base.glob("slot-*.owner"):
            i = int(owner.name[len("slot-"):-len(".owner")])
            if i < limit and owner.read_text() == preferred_owner:
                order.remove(i)
                order.insert(0, i)
                break
    for i in order:
        f = open(base / f"slot-{i}.lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        if preferred_owner:
            (base / f"slot-{i}.owner").write_text(preferred_owner)
        _held_slot = f  # keep the descriptor (and the lock) for the life of the process
        return i
    raise ConfigError(f"no free gpudask worker slot in {base} (more than {limit} workers?)")


def worker_index(locals_: dict[str, Any]) -> int:
    explicit = os.environ.get("GPUDASK_WORKER_INDEX")
    if explicit:
        try:
            return int(explicit)
        except ValueError:
            raise ConfigError(f"GPUDASK_WORKER_INDEX={explicit!r} is not valid; accepted: an integer >= 0") from None
    group = os.environ.get("GPUDASK_GROUP") or "host"
    nanny = locals_.get("nanny")
    return claim_worker_slot(group, str(nanny) if nanny else None)


def int_env(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not valid; accepted: an integer") from None


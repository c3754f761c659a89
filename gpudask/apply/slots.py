"""Which worker of the host this process is: the lowest free worker number of its group, held
for the life of the process (a lock file per number in the private state directory and, on
Linux, an abstract Unix socket name), so a restarted worker gets its number -- and its GPU --
back, and two workers never share one.  Abstract names have no owner: a holder listens, and a
name found taken is asked who holds it (``SO_PEERCRED``; docs/security.md, "Long-lived hosts").
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import pathlib
import sys
from typing import Any

from gpudask.errors import ConfigError, GpudaskError

logger = logging.getLogger("distributed.gpudask")

_held_slot: list[Any] = []  # what holds this process's slot: a locked file, a bound socket
_SQUATTED = "squatted"  # _bind_slot: the name is bound by another user's process


def _slot_name(group: str, i: int, alternate: bool = False) -> str:
    import hashlib

    digest = hashlib.sha256(group.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return f"\0gpudask-{os.getuid()}-{digest}-slot-{i}" + ("-alt" if alternate else "")


def _holder_uid(name: str) -> int | None:
    """The uid of the process listening on the abstract socket ``name`` (``SO_PEERCRED``), or
    None when nobody listens there (bound and not listening: not a gpudask worker's)."""
    import socket
    import struct

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(name)
        _pid, uid, _gid = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                               struct.calcsize("3i")))
        return int(uid)
    except OSError:
        return None
    finally:
        probe.close()


def _serve_probes(sock: Any) -> None:
    """Accept (and close) the connections of other workers asking who holds this slot, so
    that the listen queue never fills: a full queue would look like a slot nobody holds."""
    import threading

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed: the process is exiting
            conn.close()

    threading.Thread(target=serve, name="gpudask-worker-slot", daemon=True).start()


def _bind_slot(name: str) -> Any:
    """Bind and listen on the abstract ``name``: the socket; None when a worker of this user
    holds it; :data:`_SQUATTED` when a process of another user does; True without sockets."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(name)
        sock.listen(16)
    except OSError as e:
        sock.close()
        if e.errno != errno.EADDRINUSE:
            return True
        # abstract names have no owner: anyone may bind a freed one first (they are listed in
        # /proc/net/unix).  Ours listen and answer; whatever else holds it is not a worker of ours
        holder = _holder_uid(name)
        return None if holder == os.getuid() else _SQUATTED
    _serve_probes(sock)
    return sock


def _slot_socket(group: str, i: int) -> Any:
    """A second hold on slot ``i`` (Linux): an abstract socket name, freed when the process
    dies; the ``-alt`` name where another user bound the first.  None: a worker of this user
    holds it; True: no socket (the file lock alone)."""
    if not sys.platform.startswith("linux"):
        return True
    primary = _bind_slot(_slot_name(group, i))
    if primary is None or primary is True:
        return primary
    alternate = _slot_name(group, i, alternate=True)
    if primary is not _SQUATTED:
        # a worker of ours may hold this slot by its alternate name (the primary was taken by
        # another user then, and has been freed since)
        if _holder_uid(alternate) == os.getuid():
            primary.close()
            return None
        return primary
    held = _bind_slot(alternate)
    if held is None:
        return None  # a worker of ours holds the slot by its alternate name
    # both names taken by another user: no worker of ours holds them (a name has one holder)
    lock_only = held is _SQUATTED or held is True
    logger.warning("gpudask: worker number %d: its socket name is bound by a process of another user (%s); "
                   "held by %s instead, never shared with a worker of yours", i,
                   _holder_text(_holder_uid(_slot_name(group, i))),
                   "its lock file" if lock_only else "its alternate name and lock file")
    return True if lock_only else held


def _holder_text(uid: int | None) -> str:
    if uid is None:
        return "not listening"
    try:
        import pwd

        return f"uid {uid}, {pwd.getpwuid(uid).pw_name}"
    except (ImportError, KeyError):
        return f"uid {uid}"


def claim_worker_slot(group: str, owner: str | None = None, limit: int = 4096) -> int:
    """The lowest free worker number of ``group`` on this host, held until exit, preferring the
    one its nanny (``owner``) held before.  The socket name also holds it where the state
    directory was removed, is full or read-only."""
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
            if (number.isdigit() and int(number) < limit
                    and statedir.read_private(mark, "worker slot owner file") == owner):
                order.remove(int(number))
                order.insert(0, int(number))
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


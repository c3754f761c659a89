"""The per-user state directory (host plans, worker slots, the plugins' probe caches), which
only its owner may write, as ssh requires of its own: ``$XDG_RUNTIME_DIR/gpudask`` when that is
private to this user, else ``<tempdir>/gpudask-<uid>``.  Standard library only: this runs on
every worker's start-up path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import stat
import tempfile
import time
from collections.abc import Iterator

from gpudask.errors import ConfigError

logger = logging.getLogger("distributed.gpudask")

# a state file larger than this is not one gpudask wrote
MAX_STATE_FILE = 64 * 2**20


class StateDirError(ConfigError):
    """The state directory (or a folder in it) is not safe to use."""


def owner(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def unsafe_reason(st: os.stat_result, uid: int | None = None) -> str | None:
    """Why a directory with this ``lstat`` is not private to ``uid``, or None."""
    uid = os.getuid() if uid is None else uid
    if stat.S_ISLNK(st.st_mode):
        return "it is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != uid:
        return f"it is owned by {owner(st.st_uid)}, not by you ({owner(uid)})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "other users can write it"
    return None


def ensure_private(path: pathlib.Path) -> pathlib.Path:
    """Create ``path`` (mode 0700) or check the one there; raises :class:`StateDirError`."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise StateDirError(f"gpudask state directory {path}: cannot create it: {e.strerror or e}; set TMPDIR to a "
                            "directory of yours") from None
    try:
        st = os.lstat(path)
    except OSError as e:
        raise StateDirError(f"gpudask state directory {path}: cannot read it: {e.strerror or e}") from None
    reason = unsafe_reason(st)
    if reason is not None:
        kind = "symlink" if stat.S_ISLNK(st.st_mode) else ("directory" if stat.S_ISDIR(st.st_mode) else "file")
        raise StateDirError(
            f"gpudask state directory {path} is refused: {reason} (a {kind} owned by {owner(st.st_uid)}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}); it must be a directory only you can write: remove it "
            f"(rm -rf {path}) and let gpudask create it (mode 0700), or set TMPDIR to a directory of yours")
    return path


def _usable_runtime_dir() -> pathlib.Path | None:
    value = os.environ.get("XDG_RUNTIME_DIR")
    if not value or not os.path.isabs(value):
        return None
    try:
        st = os.lstat(value)
    except OSError:
        return None
    if unsafe_reason(st) is not None or not os.access(value, os.W_OK | os.X_OK):
        return None
    return pathlib.Path(value) / "gpudask"


def location() -> pathlib.Path:
    """Where the state directory is (nothing created or checked)."""
    return _usable_runtime_dir() or pathlib.Path(tempfile.gettempdir()) / f"gpudask-{os.getuid()}"


def state_dir() -> pathlib.Path:
    """This user's state directory, created 0700 and checked; raises :class:`StateDirError`."""
    return ensure_private(location())


def subdir(base: pathlib.Path, name: str) -> pathlib.Path:
    """A private folder ``name`` in ``base`` (created 0700, checked like the state directory)."""
    return ensure_private(base / name.replace("/", "_"))


def write_atomic(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path``: a 0600 temporary file in the same directory, then os.replace."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_private(path: str | os.PathLike[str], what: str = "gpudask state file") -> str | None:
    """The text of ``path`` if it is a regular file only this user can write, in a directory of
    the same kind; None if it does not exist; else None with a warning (never trusted)."""
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.warning("gpudask: ignoring %s %s: cannot open it safely (%s)", what, path, e.strerror or e)
        return None
    try:
        st = os.fstat(fd)
        problem = None
        if not stat.S_ISREG(st.st_mode):
            problem = "not a regular file"
        elif st.st_uid != os.getuid():
            problem = f"owned by {owner(st.st_uid)}, not by you"
        elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            problem = f"other users can write it (mode {stat.S_IMODE(st.st_mode):04o})"
        elif st.st_size > MAX_STATE_FILE:
            problem = f"{st.st_size} bytes, more than {MAX_STATE_FILE}"
        else:
            try:
                dir_reason = unsafe_reason(os.lstat(parent))
            except OSError as e:
                dir_reason = f"cannot read it ({e.strerror or e})"
            if dir_reason is not None:
                problem = f"its directory {parent} is not private: {dir_reason}"
        if problem is not None:
            logger.warning("gpudask: ignoring %s %s: %s; it is not trusted", what, path, problem)
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_STATE_FILE + 1)
    except OSError as e:
        logger.warning("gpudask: ignoring %s %s: %s", what, path, e.strerror or e)
        return None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        logger.warning("gpudask: ignoring %s %s: not UTF-8 text", what, path)
        return None


def open_private(path: pathlib.Path, flags: int) -> int:
    """``os.open`` of a state file of this user (created 0600, never through a symlink)."""
    return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)


@contextlib.contextmanager
def host_lock(name: str, timeout: float = 120.0) -> Iterator[bool]:
    """Hold the exclusive lock ``name`` of this user's gpudask processes on this host (``flock``
    in the state directory): True when held; False, after a warning, when the state directory
    is unusable or the lock stays taken ``timeout`` s (go on unlocked)."""
    import fcntl

    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120]
    fd = -1
    try:
        fd = open_private(subdir(state_dir(), "locks") / f"{safe}.lock", os.O_RDWR)
    except (OSError, StateDirError) as e:
        logger.warning("gpudask: no lock %s (%s): going on without it", safe, e)
        yield False
        return
    try:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    logger.warning("gpudask: lock %s still taken after %.0f s: going on without it", safe, timeout)
                    yield False
                    return
                time.sleep(0.05)
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock

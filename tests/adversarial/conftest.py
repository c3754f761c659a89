"""Fixtures of the adversarial tests: a second Unix user, and a shared temporary folder
(``/tmp``-like: world-writable, sticky) that both users can reach."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

OTHER_USER = "gpudask-adversary"


@pytest.fixture(scope="session")
def other_user() -> tuple[int, int]:
    """``(uid, gid)`` of a second Unix user, created when the tests run as root (CI does)."""
    if os.getuid() != 0:
        pytest.skip("needs root to create a second Unix user (CI runs as root)")
    import pwd

    try:
        entry = pwd.getpwnam(OTHER_USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        if not os.path.exists(useradd):
            pytest.skip("useradd is not installed")
        out = subprocess.run([useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                             capture_output=True, text=True)
        if out.returncode not in (0, 9):  # 9: created meanwhile by a parallel run
            pytest.skip(f"useradd failed: {out.stderr.strip()}")
        entry = pwd.getpwnam(OTHER_USER)
    user = (entry.pw_uid, entry.pw_gid)
    try:
        as_user(user, "pass")
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot run Python as {OTHER_USER}: {e}")
    return user


def as_user(user: tuple[int, int], code: str) -> None:
    """Run Python ``code`` as ``user`` (the adversary's own process)."""
    import sys

    # the system interpreter: the test's own may live under a folder only root can read
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    subprocess.run([python, "-I", "-c", code], user=user[0], group=user[1], extra_groups=[],
                   check=True, timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin"})


@pytest.fixture
def shared_tmp() -> pathlib.Path:
    """A private ``$TMPDIR`` for the test that behaves like ``/tmp``: mode 1777."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="gpudask-adv-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

"""Another local user binds a freed worker-slot name (issue 40, security).

Worker numbers, and with them the GPUs, are held by a lock file and an abstract Unix socket
name per number.  Abstract names have no owner and are listed in ``/proc/net/unix``: when a
worker dies, another user can bind its name before the nanny restarts it.  Before, the
restarted worker then skipped its number and took the next free one, number 2, which on a
2-GPU host is GPU 0 -- already in use by worker 0 (two workers on GPU 0, contrary to
docs/security.md).  Now a name held by another user's process is known for what it is
(``SO_PEERCRED``): the worker keeps its number, held by the lock file and an alternate name."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from .test_state_dir import _indexes, _two_gpu_workers

SQUAT = r"""
import socket, sys, time
name = "\0" + sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        s.bind(name)
        break
    except OSError:
        time.sleep(0.0005)
else:
    sys.exit("never bound")
s.listen(1)  # it even answers, as a worker of root's would
print("bound", flush=True)
time.sleep(300)
"""


def _slot_names() -> list[str]:
    """The abstract socket names gpudask's worker slots hold (anyone can list them)."""
    with open("/proc/net/unix") as f:
        return sorted({line.split()[-1].lstrip("@") for line in f if "-slot-" in line and "gpudask-" in line})


@pytest.mark.process
def test_a_slot_name_bound_by_another_user_never_puts_two_workers_on_one_gpu(cluster, tmp_path, other_user):
    if not sys.platform.startswith("linux"):
        pytest.skip("abstract Unix socket names are Linux's")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    _two_gpu_workers(cluster, tmpdir)
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    squatter = None
    try:
        with cluster.client() as client:
            client.wait_for_workers(2, timeout=60)
            before = _indexes(client)
            assert sorted(before.values()) == [(0, 0), (1, 1)], before
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and set(client.run(lambda dask_worker: dask_worker.status.name,
                                                                 nanny=True).values()) != {"running"}:
                time.sleep(0.2)
            # the name an adversary sees in /proc/net/unix (other tests' workers may be there too:
            # pick this cluster's by its group)
            from gpudask.apply.hostfile import GROUP_ENV
            from gpudask.apply.slots import _slot_name

            (group,) = set(client.run(os.getenv, GROUP_ENV).values())
            names = [_slot_name(group, 1)[1:]]
            assert names[0] in _slot_names(), _slot_names()
            # the other user waits for worker 1's name to be freed, and takes it
            squatter = subprocess.Popen([python, "-I", "-c", SQUAT, names[0]], user=other_user[0],
                                        group=other_user[1], extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin"},
                                        stdout=subprocess.PIPE, text=True)
            time.sleep(0.5)  # its interpreter is up and polling
            pids = client.run(os.getpid)
            (victim,) = [a for a, (index, _) in before.items() if index == 1]
            os.kill(pids[victim], signal.SIGKILL)
            assert squatter.stdout.readline().strip() == "bound"
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                now = _indexes(client)
                if len(now) == 2 and victim not in now and all(v[0] is not None for v in now.values()):
                    break
                time.sleep(0.3)
            now = _indexes(client)
    finally:
        if squatter is not None:
            squatter.kill()
            squatter.wait()
    log = cluster.log("worker")
    # before: the restarted worker was number 2 on GPU 0, beside worker 0
    assert sorted(now.values()) == [(0, 0), (1, 1)], (now, log[-3000:])
    lines = [x for x in log.splitlines() if "its socket name is bound by a process of another user" in x]
    assert len(lines) == 1 and "gpudask-adversary" in lines[0] and "worker number 1" in lines[0], log[-3000:]
    assert "Traceback" not in log, log[-3000:]

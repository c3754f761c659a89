"""The state directory another local user could hijack (issue 24, Security).

A second Unix user creates ``$TMPDIR/gpudask-<uid>`` (mode 777, or their own with a plan
file in it) before root's ``dask worker --preload gpudask`` starts: root's worker refuses
it with one line; with a private ``$XDG_RUNTIME_DIR`` it uses that, and nothing the other
user planted reaches a worker.  Files gpudask did not write (another owner, writable by
others, not a regular file) are never read."""

from __future__ import annotations

import json
import os
import pathlib
import stat
import subprocess

import pytest
from conftest import base_env, host

from gpudask.facts import statedir

from .conftest import as_user

TWO_GPUS = host("workstation-2gpu-pcie.json")

PLANTED_PLAN = {"env": {"INJECTED_BY_OTHER_USER": "yes", "CUDA_VISIBLE_DEVICES": "1"}}


def _plant(user, base: pathlib.Path, mode: int) -> None:
    """As the other user: create the directory root's gpudask would use, with a plan file in it."""
    as_user(user, f"""
import json, os
os.mkdir({str(base)!r})
os.chmod({str(base)!r}, {mode})
for pid in range(1, 4):
    p = os.path.join({str(base)!r}, f"plan-{{pid}}.json")
    open(p, "w").write({json.dumps(json.dumps(PLANTED_PLAN))})
    os.chmod(p, 0o666)
""")


# -- the directory itself -----------------------------------------------------------
def test_the_state_directory_is_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    path = statedir.state_dir()
    assert path == tmp_path / f"gpudask-{os.getuid()}"
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_xdg_runtime_dir_is_preferred_when_private(tmp_path, monkeypatch):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert statedir.state_dir() == runtime / "gpudask"
    runtime.chmod(0o777)  # not private: not used
    assert statedir.location() != runtime / "gpudask"


@pytest.mark.parametrize("kind", ["world-writable", "group-writable", "symlink"])
def test_an_unsafe_directory_is_refused_in_one_line(tmp_path, kind):
    path = tmp_path / "state"
    if kind == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.mkdir()
        path.chmod(0o777 if kind == "world-writable" else 0o770)
    with pytest.raises(statedir.StateDirError) as e:
        statedir.ensure_private(path)
    text = str(e.value)
    assert "\n" not in text and str(path) in text and "rm -rf" in text and "TMPDIR" in text
    assert ("symlink" in text) if kind == "symlink" else ("other users can write it" in text and "mode 07" in text)


def test_a_directory_of_another_user_is_refused(tmp_path, other_user):
    path = tmp_path / "state"
    path.mkdir(mode=0o700)
    os.chown(path, *other_user)
    with pytest.raises(statedir.StateDirError, match=r"owned by uid \d+ \(gpudask-adversary\), not by you"):
        statedir.ensure_private(path)


# -- files in it --------------------------------------------------------------------
def test_files_are_written_atomically_and_private(tmp_path):
    base = statedir.ensure_private(tmp_path / "state")
    statedir.write_atomic(base / "a.json", "[1]")
    assert stat.S_IMODE((base / "a.json").stat().st_mode) == 0o600
    assert [p.name for p in base.iterdir()] == ["a.json"]  # no temporary file left
    assert statedir.read_private(base / "a.json") == "[1]"


def test_files_gpudask_did_not_write_are_never_read(tmp_path, other_user, caplog):
    base = statedir.ensure_private(tmp_path / "state")
    theirs = base / "theirs.json"
    theirs.write_text("[1]")
    os.chown(theirs, *other_user)
    writable = base / "writable.json"
    writable.write_text("[2]")
    writable.chmod(0o666)
    (base / "link.json").symlink_to(writable)
    os.mkfifo(base / "fifo.json", 0o600)  # never opened for a blocking read
    for name, why in [("theirs.json", "owned by uid"), ("writable.json", "other users can write it"),
                      ("link.json", "cannot open it safely"), ("fifo.json", "not a regular file")]:
        caplog.clear()
        assert statedir.read_private(base / name) is None, name
        assert why in caplog.text, (name, caplog.text)
    assert statedir.read_private(base / "missing.json") is None


def test_a_host_plan_in_a_directory_others_can_write_is_not_loaded(tmp_path, monkeypatch, caplog):
    from gpudask.apply import hostfile

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    plan = shared / "plan-1.json"
    plan.write_text(json.dumps(PLANTED_PLAN))
    plan.chmod(0o600)
    monkeypatch.setenv(hostfile.PLAN_ENV, str(plan))
    assert hostfile.load() is None
    assert "is not private" in caplog.text


# -- real processes -----------------------------------------------------------------
@pytest.mark.process
@pytest.mark.parametrize("planted", ["mode-777", "theirs-with-plan"])
def test_root_worker_refuses_a_state_directory_another_user_made(cluster, tmp_path, shared_tmp, other_user,
                                                                  planted):
    """The issue's attack: the other user makes /tmp/gpudask-0 first.  Root's dask worker
    stops with one line naming the directory, its owner and mode, and writes nothing there."""
    base = shared_tmp / f"gpudask-{os.getuid()}"
    _plant(other_user, base, 0o777 if planted == "mode-777" else 0o755)
    before = sorted(p.name for p in base.iterdir())
    cluster.scheduler(env=base_env(GPUDASK_FACTS=TWO_GPUS))
    env = base_env(GPUDASK_FACTS=TWO_GPUS, TMPDIR=str(shared_tmp))
    env.pop("XDG_RUNTIME_DIR", None)
    proc = cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)
    assert proc.wait(timeout=90) != 0
    log = cluster.log("worker")
    errors = [line for line in log.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, log
    assert f"gpudask state directory {base} is refused" in errors[0]
    assert "owned by uid" in errors[0] and "gpudask-adversary" in errors[0] and "rm -rf" in errors[0]
    assert "Traceback" not in log
    assert sorted(p.name for p in base.iterdir()) == before  # root wrote nothing into it
    with cluster.client() as client:
        assert client.scheduler_info()["workers"] == {}


@pytest.mark.process
def test_with_a_private_runtime_dir_nothing_planted_reaches_the_workers(cluster, tmp_path, shared_tmp, other_user):
    """The other user's /tmp/gpudask-0 (777, plan files in it) is not used at all when
    $XDG_RUNTIME_DIR is private: root's state goes there, 0700 and 0600."""
    base = shared_tmp / f"gpudask-{os.getuid()}"
    _plant(other_user, base, 0o777)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = base_env(GPUDASK_FACTS=TWO_GPUS, TMPDIR=str(shared_tmp), XDG_RUNTIME_DIR=str(runtime))
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        injected = client.run(os.getenv, "INJECTED_BY_OTHER_USER")
        cvd = sorted(map(str, client.run(os.getenv, "CUDA_VISIBLE_DEVICES").values()))
        plan_files = client.run(os.getenv, "GPUDASK_HOST_PLAN")
    assert set(injected.values()) == {None}
    assert cvd == ["0,1", "1,0"]  # gpudask's own plan, one GPU each
    state = runtime / "gpudask"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for path in set(plan_files.values()):
        assert pathlib.Path(path).parent == state
        assert stat.S_IMODE(pathlib.Path(path).stat().st_mode) == 0o600
    groups = [p for p in state.iterdir() if p.is_dir()]
    assert groups and all(stat.S_IMODE(g.stat().st_mode) == 0o700 for g in groups)
    assert all(p.stat().st_uid == os.getuid() for p in state.rglob("*"))


def test_as_user_really_is_another_user(tmp_path, shared_tmp, other_user):
    """The fixture's adversary is a different uid (else the tests above prove nothing)."""
    as_user(other_user, f"open({str(shared_tmp / 'mine')!r}, 'w').write('x')")
    assert (shared_tmp / "mine").stat().st_uid == other_user[0] != os.getuid()
    with pytest.raises(subprocess.CalledProcessError):
        as_user(other_user, f"open({str(tmp_path / 'no')!r}, 'w')")  # root's private folder: no


# -- a long-lived cluster whose state directory goes away (issue 32) -------------------
def _indexes(client) -> dict[str, tuple[int, int]]:
    """worker address -> (its worker number, its GPU index), as each worker published them."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    out = {}
    for address, w in workers.items():
        plan = (w.get("gpudask") or {}).get("plan") or {}
        out[address] = (plan.get("index"), plan.get("gpu_index"))
    return out


def _mount_tmpfs(path, *options: str) -> None:
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(["size=1m", "mode=1777", *options]), "tmpfs",
                          str(path)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): {out.stderr.strip()}")


@pytest.mark.process
@pytest.mark.parametrize("how", ["removed", "read-only", "full"])
def test_a_restarted_worker_never_shares_a_gpu_when_the_state_directory_is_gone(cluster, tmp_path, how):
    import shutil
    import signal
    import time

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    if how != "removed":  # read-only from the start: a worker with no state directory at all
        _mount_tmpfs(tmpdir, *(["ro"] if how == "read-only" else []))
    try:
        now = _restart_worker_one(cluster, tmpdir, how)
    finally:
        if how != "removed":
            subprocess.run(["umount", "-l", str(tmpdir)], capture_output=True)
    # before: the restarted worker took number 0 / GPU 0 again (removed) or died on a
    # 60-line traceback (full, read-only)
    assert sorted(now.values()) == [(0, 0), (1, 1)], (now, cluster.log("worker")[-3000:])
    assert "Traceback" not in cluster.log("worker"), cluster.log("worker")[-3000:]


def _two_gpu_workers(cluster, tmpdir) -> None:
    """A scheduler and ``dask worker --nworkers 2`` on the described 2-GPU host, with ``tmpdir``
    as their TMPDIR (so their state directory) and no XDG_RUNTIME_DIR to prefer over it."""
    env = base_env(GPUDASK_FACTS=TWO_GPUS, TMPDIR=str(tmpdir))
    env.pop("XDG_RUNTIME_DIR", None)
    cluster.scheduler(env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "2", env=env)


def _restart_worker_one(cluster, tmpdir, how):
    import shutil
    import signal
    import time

    _two_gpu_workers(cluster, tmpdir)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        before = _indexes(client)
        assert sorted(before.values()) == [(0, 0), (1, 1)], before
        # a worker registers before its nanny has finished starting: a worker killed in between
        # is "Nanny failed to start" and ends the whole dask worker command (distributed's rule,
        # seen under load); kill only once every nanny is running
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and set(client.run(lambda dask_worker: dask_worker.status.name,
                                                             nanny=True).values()) != {"running"}:
            time.sleep(0.2)
        pids = client.run(os.getpid)
        state = tmpdir / f"gpudask-{os.getuid()}"
        if how == "removed":  # what systemd-tmpfiles does to /tmp on a long-lived host
            shutil.rmtree(state)
        elif how == "full":  # ENOSPC
            with open(tmpdir / "filler", "wb") as f:
                try:
                    while True:
                        f.write(b"x" * 65536)
                        f.flush()
                except OSError:
                    pass
        (victim,) = [a for a, (index, _) in before.items() if index == 1]
        os.kill(pids[victim], signal.SIGKILL)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            now = _indexes(client)
            if len(now) == 2 and victim not in now and all(v[0] is not None for v in now.values()):
                break
            time.sleep(0.3)
        return _indexes(client)


@pytest.mark.process
def test_a_tmpdir_too_long_for_a_unix_socket_still_starts_forkserver_workers(cluster, tmp_path):
    """A deep TMPDIR (a job's scratch folder): the fork server's socket path went over the
    kernel's 107 bytes and ``dask worker`` ended on ``OSError: AF_UNIX path too long``."""
    deep = tmp_path / ("scratch-" + "d" * 100)
    deep.mkdir()
    _two_gpu_workers(cluster, deep)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=90)
        methods = client.run(lambda: __import__("multiprocessing").get_start_method(allow_none=True))
        assert client.submit(sum, [1, 2, 3]).result() == 6
    assert set(methods.values()) == {"forkserver"}, methods
    log = cluster.log("worker")
    assert "Traceback" not in log and "fork server's Unix socket: it listens in /tmp/pymp-" in log, log[-3000:]

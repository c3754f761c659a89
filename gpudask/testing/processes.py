"""Real dask processes on this host: ``python -m dask scheduler`` / ``dask worker`` started
as separate process groups (on Linux dying with their starter, even a SIGKILLed one), waited
for, and stopped with everything they started.  For gpudask's tests, third-party plugins'
tests (:mod:`gpudask.testing.plugin`) and ``gpudask bench``.  Imports neither pytest nor
anything heavy.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Mapping
from typing import Any

LOOPBACK = "127.0.0.1"

_LIVE: list[subprocess.Popen[bytes]] = []  # every process started here and not yet stopped
_PRCTL: Any = None
# each process started here -> its start time: a reaped leader's pid may come back to another process
_STARTED: weakref.WeakKeyDictionary[subprocess.Popen[bytes], float | None] = weakref.WeakKeyDictionary()


def dask_command(*args: str) -> list[str]:
    """``python -m dask ...``: the ``dask`` script need not be on PATH (pip --target installs)."""
    return [sys.executable, "-m", "dask", *args]


# which installed plugins load: the test session's choice carries to the processes it starts
# (gpudask's own tests turn autoload off and load only the plugins a test installs)
KEPT_VARIABLES = ("GPUDASK_DISABLE_PLUGIN_AUTOLOAD", "GPUDASK_LOAD_PLUGINS")


def clean_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``base`` (default: this process's environment) without ``GPUDASK_*`` (but
    :data:`KEPT_VARIABLES`) and ``DASK_GPUDASK__*``, with unbuffered output, UCX quiet about
    unused variables and non-daemon worker processes; then ``extra``."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items()
           if not k.startswith(("GPUDASK_", "DASK_GPUDASK__")) or k in KEPT_VARIABLES}
    env.update(PYTHONUNBUFFERED="1", UCX_WARN_UNUSED_ENV_VARS="n", DASK_DISTRIBUTED__WORKER__DAEMON="False")
    env.update(extra)
    return env


def _set_pdeathsig() -> None:  # runs in the child between fork and exec: keep it trivial
    if _PRCTL:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent, even if it is SIGKILLed


def spawn(argv: list[str], env: Mapping[str, str], log_path: str | os.PathLike[str], cwd: str | os.PathLike[str]
          ) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own process group, stdout and stderr appended to ``log_path``."""
    global _PRCTL
    if _PRCTL is None:
        _PRCTL = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
            except (OSError, AttributeError):
                pass
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, env=dict(env), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(cwd), start_new_session=True,
                                preexec_fn=_set_pdeathsig if _PRCTL else None)
    _LIVE.append(proc)
    _STARTED[proc] = _start_time(proc.pid)
    return proc


def _start_time(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _ours(p: subprocess.Popen[bytes]) -> Any:
    """``p``'s process (psutil), or None when it is gone or its pid is another process's now
    (on a busy machine soon, pid_max 32768: signalling it hit another xdist worker's test)."""
    import psutil

    try:
        proc = psutil.Process(p.pid)
        started = proc.create_time()
    except psutil.Error:
        return None
    if p in _STARTED:
        # start times tick in 10 ms; a pid comes back only after the pid space has wrapped
        return proc if started == _STARTED[p] else None
    return proc if p.returncode is None else None  # not started by spawn(): ours until Popen reaped it


def _our_group(p: subprocess.Popen[bytes]) -> bool:
    """May ``os.killpg(p.pid)`` be sent?  Its leader ours, or gone (a group's id is not given
    again while members are left)."""
    return _ours(p) is not None or _start_time(p.pid) is None


def stop(popens: list[subprocess.Popen[bytes]], grace: float = 1.0) -> list[int]:
    """SIGTERM every process group (and every descendant, wherever it went), SIGKILL what
    is left after ``grace`` seconds.  Returns the pids that survived (should be none)."""
    import psutil

    procs: dict[int, Any] = {}
    for p in popens:
        root = _ours(p)
        if root is None:
            continue
        try:
            procs[root.pid] = root
            for c in root.children(recursive=True):
                procs[c.pid] = c
        except psutil.Error:
            pass
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        # asked again each round: waiting may have reaped a leader, whose pid is then free
        for pgid in {p.pid for p in popens if _our_group(p)}:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in procs.values():
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(list(procs.values()), timeout=wait)
        procs = {p.pid: p for p in alive}
        for p in popens:
            try:
                p.wait(timeout=0.1)  # reap it
            except subprocess.TimeoutExpired:
                pass
        if not procs:
            break
    _LIVE[:] = [p for p in _LIVE if p not in popens]
    return sorted(pid for pid, proc in procs.items() if _running(proc))


def _running(proc: Any) -> bool:
    """Not gone and not a zombie (in a container whose init reaps nothing, every killed
    grandchild stays one)."""
    import psutil

    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def stop_all(grace: float = 1.0) -> list[int]:
    """Stop every process this helper started and has not stopped yet."""
    return stop(list(_LIVE), grace) if _LIVE else []


def read_address(scheduler_file: str | os.PathLike[str]) -> str | None:
    """The address in a scheduler file, or None while it is missing or half written."""
    try:
        with open(scheduler_file) as f:
            return json.load(f).get("address") or None
    except (OSError, ValueError, AttributeError):
        return None


def wait_for_scheduler_file(scheduler_file: str | os.PathLike[str], procs: list[subprocess.Popen[bytes]],
                            timeout: float) -> str:
    """The scheduler's address once its file is complete.

    :raises RuntimeError: when one of ``procs`` exits first, or after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        address = read_address(scheduler_file)
        if address:
            return address
        for p in procs:
            if p.poll() is not None:
                argv = list(p.args) if isinstance(p.args, (list, tuple)) else [p.args]
                what = " ".join(str(a) for a in argv[2:4])  # [python, -m, dask, scheduler, ...]
                raise RuntimeError(f"{what} exited with {p.returncode} before the scheduler file was written")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no scheduler file after {timeout:.0f} s")
        time.sleep(0.02)


class ProcessCluster:
    """A ``dask scheduler`` and ``dask worker`` processes in ``workdir``, each logging to
    ``<label>.log`` there; the scheduler writes ``scheduler.json``.

    :param env: the environment of every process (default: this one's); ``env=`` of
        :meth:`scheduler` / :meth:`worker` replaces it for one process.
    :param grace: seconds :meth:`stop` waits after SIGTERM before SIGKILL.
    """

    def __init__(self, workdir: str | os.PathLike[str], env: Mapping[str, str] | None = None, grace: float = 15.0):
        self.workdir = pathlib.Path(workdir)
        self.env = dict(os.environ if env is None else env)
        self.grace = grace
        self.procs: list[subprocess.Popen[bytes]] = []
        self.scheduler_file = str(self.workdir / "scheduler.json")
        self.logs: dict[str, pathlib.Path] = {}

    def spawn(self, label: str, argv: list[str], env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike[str] | None = None) -> subprocess.Popen[bytes]:
        log = self.workdir / f"{label}.log"
        self.logs[label] = log
        proc = spawn(argv, self.env if env is None else env, log, cwd or self.workdir)
        self.procs.append(proc)
        return proc

    def scheduler(self, *extra: str, env: Mapping[str, str] | None = None, protocol: str = "tcp",
                  cwd: str | os.PathLike[str] | None = None, timeout: float = 60) -> subprocess.Popen[bytes]:
        """Start the scheduler on loopback and wait for its file."""
        argv = dask_command("scheduler", "--host", LOOPBACK, "--port", "0", "--no-dashboard", "--protocol", protocol,
                            "--scheduler-file", self.scheduler_file, *extra)
        proc = self.spawn("scheduler", argv, env, cwd)
        try:
            wait_for_scheduler_file(self.scheduler_file, [proc], timeout)
        except RuntimeError as e:
            raise RuntimeError(f"scheduler did not start ({e}):\n{self.log('scheduler')}") from None
        return proc

    def worker(self, *extra: str, env: Mapping[str, str] | None = None, label: str = "worker",
               cwd: str | os.PathLike[str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``dask worker`` for this scheduler, on loopback unless ``--interface`` is given
        (dask refuses both)."""
        where = [] if "--interface" in extra else ["--host", LOOPBACK]
        argv = dask_command("worker", "--scheduler-file", self.scheduler_file, *where, "--no-dashboard",
                            "--death-timeout", "60", *extra)
        return self.spawn(label, argv, env, cwd)

    def client(self, timeout: float = 30, **kwargs: Any) -> Any:
        """A ``distributed.Client`` of this cluster's scheduler (``kwargs`` go to it)."""
        from distributed import Client

        make: Any = Client  # distributed is not annotated
        return make(scheduler_file=self.scheduler_file, timeout=timeout, **kwargs)

    @property
    def address(self) -> str:
        address = read_address(self.scheduler_file)
        if address is None:
            raise RuntimeError(f"no address in {self.scheduler_file}")
        return address

    def log(self, label: str) -> str:
        path = self.logs.get(label)
        return path.read_text(errors="replace") if path and path.exists() else ""

    def stop(self) -> list[int]:
        """Stop every process of the cluster; returns the pids that survived SIGKILL."""
        return stop(self.procs, self.grace)

"""One launch of a configuration: its processes, a client, and which process is which."""

from __future__ import annotations

import time
from typing import Any

from gpudask_bench.configs import Host, Options, Spec, base_env
from gpudask.testing.processes import ProcessCluster, wait_for_scheduler_file
from gpudask_bench.workers import detached, getpid


def read_lines(path: str) -> list[str] | None:
    """The lines of a log file; None when it cannot be read (not written yet, removed)."""
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return None


class Cluster:
    """The processes of one configuration (a scheduler, one or more worker CLIs) and a client."""

    def __init__(self, spec: Spec, host: Host, opts: Options, workdir: str):
        self.spec, self.opts = spec, opts
        self.processes = ProcessCluster(workdir, env=base_env(host, opts, spec.protocol), grace=1.0)
        self.sched_file = self.processes.scheduler_file
        self.popens = self.processes.procs  # the scheduler, then the worker CLIs
        self.client: Any = None
        self.t_launch = 0.0  # time.time() at launch
        self.ready_s: float | None = None
        self.workers: list[str] = []
        self.worker_pids: dict[str, int] = {}
        self.nanny_pids: dict[str, int] = {}

    def logs(self) -> list[str]:
        return sorted(str(path) for path in self.processes.logs.values())

    def log_tail(self, lines: int = 12) -> str:
        return "\n".join(f"--- {label}.log\n" + "\n".join(self.processes.log(label).splitlines()[-lines:])
                         for label in sorted(self.processes.logs))

    def start(self, timeout: float) -> None:
        """Launch everything, wait for all workers; ``ready_s``: how long that took."""
        env = self.processes.env
        t0 = time.perf_counter()
        self.t_launch = time.time()
        self.processes.spawn("scheduler", self.spec.scheduler_argv, {**env, **self.spec.scheduler_env})
        for i, (argv, wenv) in enumerate(self.spec.workers):
            self.processes.spawn(f"workers-{i}", argv, {**env, **wenv})
        deadline = t0 + timeout
        # workers wait for the file themselves; the client needs it complete
        wait_for_scheduler_file(self.sched_file, self.popens, timeout)
        self.client = self.processes.client(max(5.0, deadline - time.perf_counter()), set_as_default=False)
        while True:
            try:
                step = min(2.0, max(0.1, deadline - time.perf_counter()))
                self.client.wait_for_workers(self.opts.nworkers, timeout=step)
                break
            except TimeoutError:
                for i, p in enumerate(self.popens):
                    if p.poll() is not None:
                        raise RuntimeError(f"{'worker CLI' if i else 'scheduler'} exited with {p.returncode}")
                if time.perf_counter() > deadline:
                    have = len(self.client.scheduler_info(n_workers=-1)["workers"])
                    raise TimeoutError(f"{have} of {self.opts.nworkers} workers after {timeout:.0f} s") from None
        self.ready_s = time.perf_counter() - t0
        self.workers = sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def collect_pids(self) -> None:
        pid_of = detached(getpid)
        self.worker_pids = dict(self.client.run(pid_of))
        try:
            self.nanny_pids = dict(self.client.run(pid_of, nanny=True))
        except Exception:
            self.nanny_pids = {}

    def stop(self) -> list[int]:
        if self.client is not None:
            try:
                self.client.close(timeout=5)
            except Exception:
                pass
            self.client = None
        return self.processes.stop()

    # -- process roles (for NVML accounting and the profile) --------------------------
    def roles(self) -> dict[int, str]:
        import psutil

        roles: dict[int, str] = {}
        for i, p in enumerate(self.popens):
            try:
                roles.update((c.pid, "helper") for c in psutil.Process(p.pid).children(recursive=True))
            except psutil.Error:
                pass
            roles[p.pid] = "nanny" if i else "scheduler"
        roles.update((pid, "nanny") for pid in self.nanny_pids.values())
        roles.update((pid, "worker") for pid in self.worker_pids.values())
        return roles

"""Measuring one configuration within its time box: its launches, the workloads on the last
one (:mod:`gpudask_bench.workloads`), the spill launch."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any, Callable

from gpudask_bench.cluster import Cluster
from gpudask_bench.configs import SPILLING, Host, Options, Spec, build_spec
from gpudask_bench.measures import profile_launch, summarize_profiles
from gpudask_bench.report import LOWER, argv_text, figure, finish, size_label
from gpudask_bench.workloads import Interrupted, Measuring, TimeBox

__all__ = ["Interrupted", "Runner", "TimeBox", "finish"]


class Runner(Measuring):
    def __init__(self, spec: Spec, host: Host, opts: Options, workdir: str, deadline: float,
                 echo: Callable[[str], None], log_dir: str | None = None):
        self.spec, self.host, self.opts, self.workdir = spec, host, opts, workdir
        self.log_dir, self.deadline, self.echo = log_dir, deadline, echo
        self.figures: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = list(spec.notes)
        self.result: dict[str, Any] = {"name": spec.name, "protocol": spec.protocol, "status": "ok",
                                       "commands": {"scheduler": argv_text(spec.scheduler_argv),
                                                    "workers": [argv_text(a) for a, _ in spec.workers]},
                                       "env": {"scheduler": spec.scheduler_env,
                                               "workers": [e for _, e in spec.workers]}}
        self.launches = 0
        self.profiles: list[dict[str, Any]] = []
        self.strays: list[int] = []

    # -- the configuration -------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        ready = self.figures["ready_s"] = figure("ready", "s", LOWER)
        launches = 1 if self.opts.quick else self.opts.repeat + 1
        launch_budget = self.left() * (0.5 if launches > 1 else 1.0)
        t_start = time.perf_counter()
        for i in range(launches):
            last = i == launches - 1
            if i > 0 and (time.perf_counter() - t_start + (ready["runs"] or ready["warmup"])[-1] * 1.5 > launch_budget
                          or self.left() < 30):
                ready["note"] = f"time box: {len(ready['runs'])} of {self.opts.repeat} launches"
                last = True
            cluster = self._launch(i)
            if cluster is None:
                break  # failed, noted
            try:
                warm = i == 0 and not self.opts.quick
                (ready["warmup"] if warm else ready["runs"]).append(cluster.ready_s)
                self.echo(f"[{self.spec.name}] launch {i + 1}: ready in {cluster.ready_s:.2f} s"
                          + (" (warm-up)" if warm else ""))
                if self.opts.profile:
                    try:
                        cluster.collect_pids()
                        self.profiles.append(profile_launch(cluster))
                    except Exception as e:
                        self.notes.append(f"profile of launch {i + 1} failed: {type(e).__name__}: {e}")
                if last:
                    if not ready["runs"]:  # only the warm-up launch fitted: report it, say so
                        ready["runs"] = list(ready["warmup"])
                        ready["note"] = "time box: warm-up launch only"
                    try:
                        if self.opts.workloads:
                            self._workloads(cluster)
                    except (Interrupted, TimeBox):
                        raise
                    except Exception as e:
                        self._failed("workloads", e)
            finally:
                t_stop = time.perf_counter()
                self._stop(cluster, i)
                self.echo(f"[{self.spec.name}] teardown {time.perf_counter() - t_stop:.1f} s")
            if last:
                break
        if self.spec.name in SPILLING and self.opts.spill_limit and self.launches:
            if self.host.backend == "cupy":
                self._spill()
            else:
                self.notes.append("no spill figure: it needs CuPy arrays on a GPU")
        finish(*self.figures.values())  # ready_s among them
        self.result["figures"] = self.figures
        self.result["notes"] = self.notes
        if self.opts.profile:
            self.result["profile"] = summarize_profiles(self.profiles)
        if self.strays:
            self.notes.append(f"processes that survived SIGKILL: {self.strays}")
        return self.result

    def _launch(self, i: int | str, spill: bool = False) -> Cluster | None:
        """Launch ``i`` (a number, or ``"spill"`` for the spill launch); None when it failed (noted)."""
        workdir = os.path.join(self.workdir, f"launch-{i}")
        os.makedirs(workdir, exist_ok=True)
        # the scheduler file and local directory are per launch: rebuild the commands
        spec = build_spec(self.spec.name, self.host, self.opts, os.path.join(workdir, "scheduler.json"),
                          os.path.join(workdir, "local"), spill=spill)
        assert isinstance(spec, Spec)
        cluster = Cluster(spec, self.host, self.opts, workdir)
        timeout = min(self.opts.launch_timeout, max(20.0, self.left()))
        try:
            cluster.start(timeout)
            self.launches += 1
            return cluster
        except Exception as e:
            self._stop(cluster, i)
            if isinstance(e, Interrupted):
                raise
            self.result["status"] = "failed" if i == 0 else "partial"
            label = f"launch {i + 1}" if isinstance(i, int) else f"the {i} launch"
            self.notes.append(f"{label} failed: {type(e).__name__}: {e}")
            self.result["log_tail"] = cluster.log_tail()
            self.echo(f"[{self.spec.name}] {label} failed: {e}\n{cluster.log_tail()}")
            return None

    def _spill(self) -> None:
        """The spill launch (:func:`gpudask_bench.spill.spill_figure`), ``--repeat`` times after a
        warm-up: a launch of its own, so the small limit changes none of the other figures."""
        from gpudask_bench.spill import spill_figure

        limit = self.opts.spill_limit
        if self.left() < 60:
            self.notes.append("time box: no spill launch")
            return
        cluster = self._launch("spill", spill=True)
        if cluster is None:
            return
        fig = self.figures["spill_s"] = figure(f"spill: 2.5x a {size_label(limit)} device limit", "s", LOWER)
        details: list[dict[str, Any]] = []

        def once() -> float:
            details.append(spill_figure(cluster.client, limit))
            return float(details[-1]["spill_s"])

        try:
            with cluster.client.as_current():
                self._loop(fig, once, estimate=30.0)
        except TimeBox:
            self.notes.append("time box: no spill run")
        except Interrupted:
            raise
        except Exception as e:  # e.g. CUDA out of memory: the workers did not spill
            self._failed("spill", e)
        finally:
            self._stop(cluster, "spill")
        peaks = [d["peak_worker_gpu_bytes"] for d in details if d.get("peak_worker_gpu_bytes")]
        if peaks:
            peak = self.figures["spill_peak_worker_gpu_MiB"] = figure("spill: peak worker GPU memory", "MiB", LOWER)
            peak["runs"] = [round(max(peaks) / 2**20)]
            peak["note"] = f"the largest over {len(peaks)} run(s), NVML per worker process"
        if details:
            self.result["spill"] = details[-1]

    def _stop(self, cluster: Cluster, i: int | str) -> None:
        """Stop launch ``i``'s processes; keep its logs in --log-dir."""
        self.strays += cluster.stop()
        if not self.log_dir:
            return
        dest = os.path.join(self.log_dir, self.spec.name, f"launch-{i}")
        os.makedirs(dest, exist_ok=True)
        for path in cluster.logs():
            shutil.copy(path, dest)

"""Measuring one configuration within its time box: its launches, the workloads on the last
one, the spill launch."""

from __future__ import annotations

import functools
import os
import shutil
import time
import uuid
from typing import Any, Callable

from gpudask_bench import workers as remote  # functions sent to the workers
from gpudask_bench.cluster import Cluster
from gpudask_bench.configs import SPILLING, Host, Options, Spec, build_spec
from gpudask_bench.measures import gpu_memory, profile_launch, proto_info, summarize_profiles
from gpudask_bench.report import LOWER, argv_text, brief, figure, finish, size_label, timed_pair


class TimeBox(Exception):
    """The configuration's share of --max-seconds is spent."""


class Interrupted(BaseException):
    """SIGTERM / SIGINT: stop measuring, tear down, report what was measured.  Not an
    ``Exception`` (as KeyboardInterrupt), so that no ``except Exception`` takes it for a failure."""


class Column:
    """What every column keeps, measured within its share of the time box: figures, notes, result."""

    def __init__(self, name: str, protocol: str, host: Host, opts: Options, workdir: str, deadline: float,
                 echo: Callable[[str], None], log_dir: str | None):
        self.name, self.host, self.opts, self.workdir = name, host, opts, workdir
        self.log_dir, self.deadline, self.echo = log_dir, deadline, echo
        self.figures: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []
        self.result: dict[str, Any] = {"name": name, "protocol": protocol, "status": "ok"}
        self.strays: list[int] = []  # pids that survived SIGKILL

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def report(self) -> dict[str, Any]:
        """The result, with the figures (their best and median) and the notes."""
        finish(*self.figures.values())
        if self.strays:
            self.notes.append(f"processes that survived SIGKILL: {self.strays}")
        self.result.update({"figures": self.figures, "notes": self.notes})
        return self.result

    def keep_logs(self, paths: list[str], *where: str) -> None:
        """Copy ``paths`` to ``log_dir/<column>/<where...>`` (with --log-dir only)."""
        if not self.log_dir:
            return
        dest = os.path.join(self.log_dir, self.name, *where)
        os.makedirs(dest, exist_ok=True)
        for path in paths:
            if os.path.exists(path):
                shutil.copy(path, dest)


class Runner(Column):
    def __init__(self, spec: Spec, host: Host, opts: Options, workdir: str, deadline: float,
                 echo: Callable[[str], None], log_dir: str | None = None):
        super().__init__(spec.name, spec.protocol, host, opts, workdir, deadline, echo, log_dir)
        self.spec = spec
        self.notes += spec.notes
        self.result["commands"] = {"scheduler": argv_text(spec.scheduler_argv),
                                   "workers": [argv_text(a) for a, _ in spec.workers]}
        self.result["env"] = {"scheduler": spec.scheduler_env, "workers": [e for _, e in spec.workers]}
        self.launches = 0
        self.profiles: list[dict[str, Any]] = []

    def timeout(self, at_least: float) -> float:
        return min(600.0, max(at_least, self.left() + 10.0))

    def _failed(self, what: str, e: Exception) -> None:
        self.result["status"] = "partial"
        self.notes.append(f"{what} failed: {type(e).__name__}: {e}")
        self.echo(f"[{self.name}] {what} failed: {type(e).__name__}: {e}")

    def _loop(self, fig: dict[str, Any], run: Callable[[], float | None], estimate: float = 0.0) -> None:
        """Warm-up (unless --quick) then --repeat runs, each only if time is left."""
        warmup = not self.opts.quick
        for i in range(self.opts.repeat + warmup):
            last = (fig["runs"] or fig["warmup"] or [estimate])[-1]
            if self.left() < (last or 0.0) * 1.2 + 0.5:
                fig["note"] = f"time box: {len(fig['runs'])} of {self.opts.repeat} runs"
                if not fig["runs"]:
                    raise TimeBox(fig["label"])
                return
            value = run()
            (fig["warmup"] if warmup and i == 0 else fig["runs"]).append(value)

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
                self.echo(f"[{self.name}] launch {i + 1}: ready in {cluster.ready_s:.2f} s"
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
                    except Exception as e:
                        self._failed("workloads", e)
            finally:
                t_stop = time.perf_counter()
                self._stop(cluster, i)
                self.echo(f"[{self.name}] teardown {time.perf_counter() - t_stop:.1f} s")
            if last:
                break
        if self.name in SPILLING and self.opts.spill_limit and self.launches:
            if self.host.backend == "cupy":
                self._spill()
            else:
                self.notes.append("no spill figure: it needs CuPy arrays on a GPU")
        result = self.report()
        if self.opts.profile:
            result["profile"] = summarize_profiles(self.profiles)
        return result

    def _launch(self, i: int | str, spill: bool = False) -> Cluster | None:
        """Launch ``i`` (a number, or ``"spill"`` for the spill launch); None when it failed (noted)."""
        workdir = os.path.join(self.workdir, f"launch-{i}")
        os.makedirs(workdir, exist_ok=True)
        # the scheduler file and local directory are per launch: rebuild the commands
        spec = build_spec(self.name, self.host, self.opts, os.path.join(workdir, "scheduler.json"),
                          os.path.join(workdir, "local"), spill=spill)
        assert isinstance(spec, Spec)
        cluster = Cluster(spec, self.host, self.opts, workdir)
        try:
            cluster.start(min(self.opts.launch_timeout, max(20.0, self.left())))
            self.launches += 1
            return cluster
        except BaseException as e:
            self._stop(cluster, i)
            if not isinstance(e, Exception):
                raise
            self.result["status"] = "failed" if i == 0 else "partial"
            label = f"launch {i + 1}" if isinstance(i, int) else f"the {i} launch"
            self.notes.append(f"{label} failed: {type(e).__name__}: {e}")
            self.result["log_tail"] = cluster.log_tail()
            self.echo(f"[{self.name}] {label} failed: {e}\n{cluster.log_tail()}")
            return None

    def _stop(self, cluster: Cluster, i: int | str) -> None:
        """Stop launch ``i``'s processes; keep its logs in --log-dir."""
        self.strays += cluster.stop()
        self.keep_logs(cluster.logs(), f"launch-{i}")

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

    # -- the workloads of the last launch -----------------------------------------------
    def _workloads(self, cluster: Cluster) -> None:
        cluster.collect_pids()
        self.result["workers"] = {addr: {"pid": pid} for addr, pid in cluster.worker_pids.items()}
        self._transports(cluster)
        mem_ready = gpu_memory(cluster, self.host)
        steps: list[tuple[str, Callable[[], None]]] = []
        sizes, side, chunk = self.opts.sizes
        if len(cluster.workers) < 2:
            self.notes.append("fewer than 2 workers: no transfers")
        else:
            steps += [(f"pull {size_label(n)}", functools.partial(self._pull, cluster, n)) for n in sizes]
            steps += [(f"transfer {size_label(n)}", functools.partial(self._transfer, cluster, n)) for n in sizes]
        steps.append((f"transpose-sum {side}^2", lambda: self._transpose_sum(cluster, side, chunk)))
        if self.name in ("gpudask", "dask-cuda") and self.host.backend == "cupy":
            steps.append(("dask-cuda local_cupy", lambda: self._dc_local_cupy(cluster)))
        for i, (label, step) in enumerate(steps):
            try:
                with cluster.client.as_current():  # distributed.wait() looks for the default client
                    step()
            except TimeBox:
                skipped = ", ".join(s for s, _ in steps[i:])
                self.notes.append(f"time box: skipped {skipped}")
                self.echo(f"[{self.name}] time box: skipped {skipped}")
                break
            except Exception as e:
                self._failed(label, e)
        mem_end = gpu_memory(cluster, self.host)
        if self.opts.proto_info:
            self.result["proto_info"] = proto_info(cluster.logs(), cluster.worker_pids)
        mems = [m for m in (mem_ready, mem_end) if m is not None]
        if mems:
            # GPU memory outside the workers, split: the nanny process(es) should hold none; a scheduler that
            # relays GPU frames over UCX holds its CUDA context and UCX (about 520 MiB on an H200)
            for role in ("nanny", "scheduler"):
                fig = self.figures[f"gpu_mem_{role}_MiB"] = figure(f"GPU memory outside workers: {role}", "MiB",
                                                                   LOWER)
                field = f"{role}_MiB"
                worst = max(mems, key=lambda m: float(m[field]) if m.get(field) is not None else -1.0)
                if worst.get(field) is not None:
                    fig["runs"] = [worst[field]]
                fig["note"] = worst.get("note")
            self.result["gpu_memory"] = {"at_ready": mem_ready, "after_workloads": mem_end}

    def _transports(self, cluster: Cluster) -> None:
        info = cluster.client.run(remote.detached(remote.worker_info))
        self.result["transports"] = info
        loaded = [a for a, i in info.items() if i.get("gpudask_loaded")]
        if self.name != "gpudask" and loaded:
            self.notes.append(f"gpudask was imported in stock workers {loaded}: results are not stock")

    def _pull(self, cluster: Cluster, nbytes: int) -> None:
        """Worker B pulls a key of worker A, timed inside B (:func:`gpudask_bench.workers.pull_times`);
        3 warm-ups (1 with --quick), then ``--pulls`` pulls of one array (5 with --quick)."""
        a, b = cluster.workers[0], cluster.workers[1]
        label = size_label(nbytes)
        t_fig, bw_fig = timed_pair(self.figures, "pull", nbytes, "in the receiving worker", "bandwidth")
        if self.left() < 5 + nbytes / 1e9:
            raise TimeBox(t_fig["label"])
        timeout = self.timeout(max(30.0, nbytes / 1e8))
        src = self._source(cluster, nbytes, 0, f"bench-pull-{label}-{uuid.uuid4().hex[:8]}", timeout)
        try:
            warm, n = (1, min(5, self.opts.pulls)) if self.opts.quick else (3, self.opts.pulls)
            times = cluster.client.run(remote.detached(remote.pull_times), a, src.key, warm + n, self.host.backend,
                                       workers=[b])[b]
        finally:
            del src
        for fig, values in ((t_fig, times), (bw_fig, [nbytes / t / 1e9 for t in times])):
            fig["warmup"], fig["runs"] = values[:warm], values[warm:]
        self.echo(f"[{self.name}] pull {label}: {brief(t_fig, 's')}, {brief(bw_fig, 'GB/s')}")

    def _source(self, cluster: Cluster, nbytes: int, seed: int, key: str, timeout: float) -> Any:
        """An array of ``nbytes`` made on the first worker, once it is there."""
        from distributed import wait

        src = cluster.client.submit(remote.detached(remote.make_array), nbytes, self.host.backend, seed, key=key,
                                    workers=[cluster.workers[0]], allow_other_workers=False, pure=False)
        wait(src, timeout=timeout)
        if src.status != "finished":
            src.result()  # raises the worker's error
        return src

    def _transfer(self, cluster: Cluster, nbytes: int) -> None:
        client = cluster.client
        b = cluster.workers[1]
        label = size_label(nbytes)
        t_fig, bw_fig = timed_pair(self.figures, "transfer", nbytes, "end to end", "distributed's log")
        consume, incoming = remote.detached(remote.consume), remote.detached(remote.incoming)
        timeout = self.timeout(max(30.0, nbytes / 1e8))  # 10 s per GB at worst

        def once() -> float:
            i = len(t_fig["warmup"]) + len(t_fig["runs"])  # the array's seed; 0: the warm-up (unless --quick)
            tag = uuid.uuid4().hex[:8]
            src = self._source(cluster, nbytes, i, f"bench-src-{label}-{tag}", timeout)
            t0 = time.perf_counter()
            dst = client.submit(consume, src, key=f"bench-dst-{label}-{tag}", workers=[b],
                                allow_other_workers=False, pure=False)
            dst.result(timeout=timeout)
            elapsed = time.perf_counter() - t0
            entries = client.run(incoming, src.key, workers=[b]).get(b, [])
            duration = sum(e["duration"] for e in entries)
            bw = sum(e["total"] for e in entries) / duration / 1e9 if duration > 0 else None
            (bw_fig["warmup"] if i == 0 and not self.opts.quick else bw_fig["runs"]).append(bw)
            return elapsed

        self._loop(t_fig, once, estimate=nbytes / 1e9)
        if all(v is None for v in bw_fig["runs"]):
            bw_fig["note"] = "no transfer_incoming_log entry for the key"
        else:
            bw_fig["note"] = ("bytes over the duration distributed logs in transfer_incoming_log, which is not the "
                              "transfer's own time (it spans gather_dep's whole request); the pull rows time the "
                              "transfer itself")
        self.echo(f"[{self.name}] transfer {label}: {brief(t_fig, 's')}, {brief(bw_fig, 'GB/s')}")

    def _dc_local_cupy(self, cluster: Cluster) -> None:
        """dask-cuda's own benchmark, a client gpudask did not write, against this cluster."""
        from gpudask_bench import dask_cuda_client as dc

        if not dc.available():
            self.notes.append("dask-cuda (with nvtx) not installed: no dc_local_cupy figures")
            return
        sizes = dc.QUICK_SIZES if self.opts.quick else dc.SIZES
        runs = max(3, self.opts.repeat)
        for op in dc.OPERATIONS:
            if self.left() < 20:
                raise TimeBox()
            size, chunk = sizes[op]
            fig = self.figures[f"dc_local_cupy_{op}_s"] = figure(
                f"dask-cuda local_cupy {op} {size}^2 chunks {chunk}", "s", LOWER)
            # local_cupy asserts that it sees a worker: never start it on a cluster that lost one
            cluster.client.wait_for_workers(self.opts.nworkers, timeout=self.timeout(30.0))
            log = os.path.join(self.workdir, f"local_cupy-{op}.txt")
            out = dc.run(cluster.sched_file, self.spec.protocol, op, size, chunk, runs, self.timeout(60.0), log=log)
            self.keep_logs([log])
            fig["runs"] = out["runs"]
            if out.get("error"):
                fig["note"] = f"local_cupy {op} failed: {out['error']}"
            elif out["p2p"]:
                fig["note"] = f"local_cupy's p2p 25/50/75%: {'; '.join(out['p2p'])}"
            finish(fig)
            self.echo(f"[{self.name}] dask-cuda local_cupy {op}: {brief(fig, 's')}"
                      + (f" ({out['error']})" if out.get("error") else ""))
            self.notes.append(f"local_cupy {op}: -p {self.spec.protocol} -t gpu -s {size} -c {chunk} "
                              f"--runs {runs} --disable-rmm (each side keeps its own memory "
                              f"setup), on this cluster's {len(cluster.workers)} worker(s)")

    def _transpose_sum(self, cluster: Cluster, side: int, chunk: int) -> None:
        import operator

        import dask
        import dask.array as da
        import numpy as np
        from distributed import wait

        client = cluster.client
        fig = self.figures["transpose_sum_s"] = figure(f"(x + x.T).sum() {side}^2 chunks {chunk}", "s", LOWER)
        meta = np.empty((0, 0))
        x = da.empty((side, side), chunks=chunk, dtype="f8").map_blocks(
            remote.detached(remote.random_block), self.host.backend, dtype="f8", meta=meta)
        x = client.persist(x)
        wait(x, timeout=self.timeout(60.0))
        to_float = remote.detached(remote.to_float)

        def once() -> float:
            y = da.blockwise(operator.add, "ij", x, "ij", x.T, "ij", dtype="f8", meta=meta,
                             name=f"bench-xpxt-{uuid.uuid4().hex[:8]}")
            total = dask.delayed(to_float, pure=False)(y.sum())
            t0 = time.perf_counter()
            fut = client.compute(total)
            fut.result(timeout=self.timeout(60.0))
            return time.perf_counter() - t0  # fut released after the clock stops

        try:
            self._loop(fig, once, estimate=1.0)
        finally:
            del x
        self.echo(f"[{self.name}] transpose-sum: {brief(fig, 's')}")

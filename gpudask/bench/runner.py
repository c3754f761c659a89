"""Measuring one configuration within its time box: launches, transfers, (x + x.T).sum()."""

from __future__ import annotations

import functools
import os
import shutil
import time
import uuid
from typing import Any, Callable

from gpudask.bench.cluster import Cluster
from gpudask.bench.configs import SPILLING, Host, Options, Spec, build_spec
from gpudask.bench.measures import gpu_memory, profile_launch, proto_info, summarize_profiles
from gpudask.bench.report import HIGHER, LOWER, argv_text, brief, figure, finish, size_label
from gpudask.bench import workers as remote  # functions sent to the workers


class TimeBox(Exception):
    """The configuration's share of --max-seconds is spent."""


class Interrupted(Exception):
    """SIGTERM / SIGINT: stop measuring, tear down, report what was measured."""


class Runner:
    """Measures one configuration within its time box."""

    def __init__(self, spec: Spec, host: Host, opts: Options, workdir: str, deadline: float,
                 echo: Callable[[str], None], log_dir: str | None = None):
        self.spec, self.host, self.opts, self.workdir = spec, host, opts, workdir
        self.log_dir = log_dir
        self.deadline = deadline
        self.echo = echo
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

    # -- time box ----------------------------------------------------------------------
    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def timeout(self, at_least: float) -> float:
        """A timeout for one step: what the time box leaves (plus a margin), never below
        ``at_least``, never more than 10 minutes."""
        return min(600.0, max(at_least, self.left() + 10.0))

    def _loop(self, fig: dict[str, Any], run: Callable[[], float | None], warmup: bool = True,
              estimate: float = 0.0) -> None:
        """Warm-up (unless --quick) then --repeat runs, each only if time is left."""
        total = self.opts.repeat + (1 if warmup and not self.opts.quick else 0)
        for i in range(total):
            last = fig["runs"][-1] if fig["runs"] else (fig["warmup"][-1] if fig["warmup"] else estimate)
            if self.left() < (last or 0.0) * 1.2 + 0.5:
                done = len(fig["runs"])
                fig["note"] = f"time box: {done} of {self.opts.repeat} runs"
                if not fig["runs"]:
                    raise TimeBox(fig["label"])
                return
            value = run()
            (fig["warmup"] if warmup and not self.opts.quick and i == 0 else fig["runs"]).append(value)

    # -- the configuration -------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        ready = self.figures["ready_s"] = figure("ready", "s", LOWER)
        launches = 1 if self.opts.quick else self.opts.repeat + 1
        launch_budget = self.left() * (0.5 if launches > 1 else 1.0)
        t_start = time.perf_counter()
        for i in range(launches):
            if i > 0 and (time.perf_counter() - t_start + (ready["runs"] or ready["warmup"])[-1] * 1.5 > launch_budget
                          or self.left() < 30):
                ready["note"] = f"time box: {len(ready['runs'])} of {self.opts.repeat} launches"
                last = True
            else:
                last = i == launches - 1
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
                        self._workloads(cluster)
                    except (Interrupted, TimeBox):
                        raise
                    except Exception as e:
                        self.result["status"] = "partial"
                        self.notes.append(f"workloads failed: {type(e).__name__}: {e}")
                        self.echo(f"[{self.spec.name}] workloads failed: {type(e).__name__}: {e}")
            finally:
                t_stop = time.perf_counter()
                self.strays += cluster.stop()
                self.keep_logs(cluster, i)
                self.echo(f"[{self.spec.name}] teardown {time.perf_counter() - t_stop:.1f} s")
            if last:
                break
        if self.spec.name in SPILLING and self.opts.spill_limit and self.launches:
            if self.host.backend == "cupy":
                self._spill()
            else:
                self.notes.append("no spill figure: it needs CuPy arrays on a GPU")
        finish(ready)
        for fig in self.figures.values():
            finish(fig)
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
        except Interrupted:
            self.strays += cluster.stop()
            self.keep_logs(cluster, i)
            raise
        except Exception as e:
            self.strays += cluster.stop()
            self.keep_logs(cluster, i)
            self.result["status"] = "failed" if i == 0 else "partial"
            label = f"launch {i + 1}" if isinstance(i, int) else f"the {i} launch"
            self.notes.append(f"{label} failed: {type(e).__name__}: {e}")
            self.result["log_tail"] = cluster.log_tail()
            self.echo(f"[{self.spec.name}] {label} failed: {e}\n{cluster.log_tail()}")
            return None

    def _spill(self) -> None:
        """The spill launch: workers whose device memory limit is ``--spill-limit``, a CuPy
        working set of 2.5x that limit per worker filled, reduced and checked
        (:func:`gpudask.bench.spill.spill_figure`), ``--repeat`` times after a warm-up.

        A launch of its own, so the small limit changes none of the other figures."""
        from gpudask.bench.spill import spill_figure

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
            self.result["status"] = "partial"
            self.notes.append(f"spill failed: {type(e).__name__}: {e}")
            self.echo(f"[{self.spec.name}] spill failed: {type(e).__name__}: {e}")
        finally:
            self.strays += cluster.stop()
            self.keep_logs(cluster, "spill")
        peaks = [d["peak_worker_gpu_bytes"] for d in details if d.get("peak_worker_gpu_bytes")]
        if peaks:
            peak = self.figures["spill_peak_worker_gpu_MiB"] = figure("spill: peak worker GPU memory", "MiB", LOWER)
            peak["runs"] = [round(max(peaks) / 2**20)]
            peak["note"] = f"the largest over {len(peaks)} run(s), NVML per worker process"
        if details:
            self.result["spill"] = details[-1]

    def keep_logs(self, cluster: Cluster, i: int | str) -> None:
        if not self.log_dir:
            return
        dest = os.path.join(self.log_dir, self.spec.name, f"launch-{i}")
        os.makedirs(dest, exist_ok=True)
        for path in cluster.logs():
            shutil.copy(path, dest)

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
            for nbytes in sizes:
                steps.append((f"pull {size_label(nbytes)}", functools.partial(self._pull, cluster, nbytes)))
            for nbytes in sizes:
                steps.append((f"transfer {size_label(nbytes)}", functools.partial(self._transfer, cluster, nbytes)))
        steps.append((f"transpose-sum {side}^2", lambda: self._transpose_sum(cluster, side, chunk)))
        if self.spec.name in ("gpudask", "dask-cuda") and self.host.backend == "cupy":
            steps.append(("dask-cuda local_cupy", lambda: self._dc_local_cupy(cluster)))
        for i, (label, step) in enumerate(steps):
            try:
                with cluster.client.as_current():  # distributed.wait() looks for the default client
                    step()
            except TimeBox:
                skipped = [s for s, _ in steps[i:]]
                self.notes.append("time box: skipped " + ", ".join(skipped))
                self.echo(f"[{self.spec.name}] time box: skipped {', '.join(skipped)}")
                break
            except Interrupted:
                raise
            except Exception as e:
                self.result["status"] = "partial"
                self.notes.append(f"{label} failed: {type(e).__name__}: {e}")
                self.echo(f"[{self.spec.name}] {label} failed: {type(e).__name__}: {e}")
        mem_end = gpu_memory(cluster, self.host)
        if self.opts.proto_info:
            self.result["proto_info"] = proto_info(cluster.logs(), cluster.worker_pids)
        mems = [m for m in (mem_ready, mem_end) if m is not None]
        if mems:
            # GPU memory outside the workers, split: the nanny process(es) should hold none; a scheduler that
            # relays GPU frames over UCX holds its CUDA context and UCX (about 520 MiB on an H200)
            for key, label, field in (("gpu_mem_nanny_MiB", "GPU memory outside workers: nanny", "nanny_MiB"),
                                      ("gpu_mem_scheduler_MiB", "GPU memory outside workers: scheduler",
                                       "scheduler_MiB")):
                fig = self.figures[key] = figure(label, "MiB", LOWER)
                worst = max(mems, key=lambda m, f=field: float(m[f]) if m.get(f) is not None else -1.0)
                if worst.get(field) is not None:
                    fig["runs"] = [worst[field]]
                fig["note"] = worst.get("note")
            self.result["gpu_memory"] = {"at_ready": mem_ready, "after_workloads": mem_end}

    def _transports(self, cluster: Cluster) -> None:
        info = cluster.client.run(remote.detached(remote.worker_info))
        self.result["transports"] = info
        if self.spec.name != "gpudask":
            loaded = [a for a, i in info.items() if i.get("gpudask_loaded")]
            if loaded:
                self.notes.append(f"gpudask was imported in stock workers {loaded}: results are not stock")

    def _pull(self, cluster: Cluster, nbytes: int) -> None:
        """The in-worker pull: worker B fetches a key of worker A with distributed's own
        ``get_data_from_worker`` (what ``gather_dep`` calls), timed inside B -- no scheduling,
        no task; 3 warm-ups (1 with --quick), then ``--repeat`` x 5 pulls of one array."""
        from distributed import wait

        client = cluster.client
        a, b = cluster.workers[0], cluster.workers[1]
        label = size_label(nbytes)
        t_fig = self.figures[f"pull_{label}_s"] = figure(f"pull {label} (in the receiving worker)", "s", LOWER)
        bw_fig = self.figures[f"pull_{label}_GBps"] = figure(f"pull {label} (bandwidth)", "GB/s", HIGHER)
        if self.left() < 5 + nbytes / 1e9:
            raise TimeBox(t_fig["label"])
        timeout = self.timeout(max(30.0, nbytes / 1e8))
        make, pull = remote.detached(remote.make_array), remote.detached(remote.pull_times)
        src = client.submit(make, nbytes, self.host.backend, 0, key=f"bench-pull-{label}-{uuid.uuid4().hex[:8]}",
                            workers=[a], allow_other_workers=False, pure=False)
        try:
            wait(src, timeout=timeout)
            if src.status != "finished":
                src.result()  # raises the worker's error
            warm = 1 if self.opts.quick else 3
            times = client.run(pull, a, src.key, warm + 5 * self.opts.repeat, self.host.backend,
                               workers=[b])[b]
        finally:
            del src
        t_fig["warmup"], t_fig["runs"] = times[:warm], times[warm:]
        bw_fig["warmup"] = [nbytes / t / 1e9 for t in t_fig["warmup"]]
        bw_fig["runs"] = [nbytes / t / 1e9 for t in t_fig["runs"]]
        self.echo(f"[{self.spec.name}] pull {label}: {brief(t_fig, 's')}, {brief(bw_fig, 'GB/s')}")

    def _transfer(self, cluster: Cluster, nbytes: int) -> None:
        from distributed import wait

        client = cluster.client
        a, b = cluster.workers[0], cluster.workers[1]
        label = size_label(nbytes)
        t_fig = self.figures[f"transfer_{label}_s"] = figure(f"transfer {label} (end to end)", "s", LOWER)
        bw_fig = self.figures[f"transfer_{label}_GBps"] = figure(f"transfer {label} (distributed's log)", "GB/s",
                                                                 HIGHER)
        make, consume, incoming = (remote.detached(f) for f in (remote.make_array, remote.consume, remote.incoming))
        timeout = self.timeout(max(30.0, nbytes / 1e8))  # 10 s per GB at worst
        seq = iter(range(1_000_000))

        def once() -> float:
            i = next(seq)
            tag = uuid.uuid4().hex[:8]
            src = client.submit(make, nbytes, self.host.backend, i, key=f"bench-src-{label}-{tag}",
                                workers=[a], allow_other_workers=False, pure=False)
            wait(src, timeout=timeout)
            if src.status != "finished":
                src.result()  # raises the worker's error
            t0 = time.perf_counter()
            dst = client.submit(consume, src, key=f"bench-dst-{label}-{tag}", workers=[b],
                                allow_other_workers=False, pure=False)
            dst.result(timeout=timeout)
            elapsed = time.perf_counter() - t0
            entries = client.run(incoming, src.key, workers=[b]).get(b, [])
            bw = None
            if entries:
                total = sum(e["total"] for e in entries)
                duration = sum(e["duration"] for e in entries)
                bw = total / duration / 1e9 if duration > 0 else None
            is_warm = not self.opts.quick and not t_fig["warmup"] and not t_fig["runs"]
            (bw_fig["warmup"] if is_warm else bw_fig["runs"]).append(bw)
            del src, dst
            return elapsed

        self._loop(t_fig, once, estimate=nbytes / 1e9)
        if not bw_fig["runs"] or all(v is None for v in bw_fig["runs"]):
            bw_fig["note"] = "no transfer_incoming_log entry for the key"
        else:
            bw_fig["note"] = ("bytes over the duration distributed logs in transfer_incoming_log, which is not the "
                              "transfer's own time (it spans gather_dep's whole request); the pull rows time the "
                              "transfer itself")
        self.echo(f"[{self.spec.name}] transfer {label}: {brief(t_fig, 's')}, {brief(bw_fig, 'GB/s')}")

    def _dc_local_cupy(self, cluster: Cluster) -> None:
        """dask-cuda's own benchmark, a client gpudask did not write, against this cluster."""
        from gpudask.bench import dask_cuda_client as dc

        if not dc.available():
            self.notes.append("dask-cuda (with nvtx) not installed: no dc_local_cupy figures")
            return
        size, chunk = (10000, 1000) if self.opts.quick else (20000, 2000)
        for op in dc.OPERATIONS:
            if self.left() < 20:
                raise TimeBox()
            fig = self.figures[f"dc_local_cupy_{op}_s"] = figure(f"dask-cuda local_cupy {op} {size}^2", "s", LOWER)
            out = dc.run(cluster.sched_file, self.spec.protocol, op, size, chunk, max(3, self.opts.repeat),
                         self.timeout(60.0))
            fig["runs"] = out["runs"]
            if out.get("error"):
                fig["note"] = f"local_cupy {op} failed: {out['error']}"
            elif out["p2p"]:
                fig["note"] = f"local_cupy's p2p 25/50/75%: {'; '.join(out['p2p'])}"
            finish(fig)
            self.echo(f"[{self.spec.name}] dask-cuda local_cupy {op}: {brief(fig, 's')}")

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
            elapsed = time.perf_counter() - t0
            del fut
            return elapsed

        try:
            self._loop(fig, once, estimate=1.0)
        finally:
            del x
        self.echo(f"[{self.spec.name}] transpose-sum: {brief(fig, 's')}")



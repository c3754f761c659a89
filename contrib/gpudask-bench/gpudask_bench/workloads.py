"""What one launch of a configuration measures, within the configuration's time box."""

from __future__ import annotations

import functools
import os
import time
import uuid
from typing import Any, Callable

from gpudask_bench import workers as remote  # functions sent to the workers
from gpudask_bench.cluster import Cluster
from gpudask_bench.configs import Host, Options, Spec
from gpudask_bench.measures import gpu_memory, proto_info
from gpudask_bench.report import HIGHER, LOWER, brief, figure, finish, size_label


class TimeBox(Exception):
    """The configuration's share of --max-seconds is spent."""


class Interrupted(Exception):
    """SIGTERM / SIGINT: stop measuring, tear down, report what was measured."""


class Measuring:
    """The time box of one configuration and the workloads measured on one of its launches;
    the figures, notes and result they fill are :class:`~gpudask_bench.runner.Runner`'s."""

    spec: Spec
    host: Host
    opts: Options
    deadline: float
    echo: Callable[[str], None]
    figures: dict[str, dict[str, Any]]
    notes: list[str]
    result: dict[str, Any]

    # -- time box ----------------------------------------------------------------------
    def _failed(self, what: str, e: Exception) -> None:
        self.result["status"] = "partial"
        self.notes.append(f"{what} failed: {type(e).__name__}: {e}")
        self.echo(f"[{self.spec.name}] {what} failed: {type(e).__name__}: {e}")

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def timeout(self, at_least: float) -> float:
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

    # -- the workloads of one launch ----------------------------------------------------
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
                self._failed(label, e)
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
        """Worker B pulls a key of worker A, timed inside B (:func:`gpudask_bench.workers.pull_times`);
        3 warm-ups (1 with --quick), then ``--pulls`` pulls of one array (5 with --quick)."""
        client = cluster.client
        a, b = cluster.workers[0], cluster.workers[1]
        label = size_label(nbytes)
        t_fig = self.figures[f"pull_{label}_s"] = figure(f"pull {label} (in the receiving worker)", "s", LOWER)
        bw_fig = self.figures[f"pull_{label}_GBps"] = figure(f"pull {label} (bandwidth)", "GB/s", HIGHER)
        if self.left() < 5 + nbytes / 1e9:
            raise TimeBox(t_fig["label"])
        timeout = self.timeout(max(30.0, nbytes / 1e8))
        src = self._source(cluster, nbytes, 0, f"bench-pull-{label}-{uuid.uuid4().hex[:8]}", timeout)
        try:
            warm, n = (1, min(5, self.opts.pulls)) if self.opts.quick else (3, self.opts.pulls)
            times = client.run(remote.detached(remote.pull_times), a, src.key, warm + n, self.host.backend,
                               workers=[b])[b]
        finally:
            del src
        t_fig["warmup"], t_fig["runs"] = times[:warm], times[warm:]
        bw_fig["warmup"] = [nbytes / t / 1e9 for t in t_fig["warmup"]]
        bw_fig["runs"] = [nbytes / t / 1e9 for t in t_fig["runs"]]
        self.echo(f"[{self.spec.name}] pull {label}: {brief(t_fig, 's')}, {brief(bw_fig, 'GB/s')}")

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
        t_fig = self.figures[f"transfer_{label}_s"] = figure(f"transfer {label} (end to end)", "s", LOWER)
        bw_fig = self.figures[f"transfer_{label}_GBps"] = figure(f"transfer {label} (distributed's log)", "GB/s",
                                                                 HIGHER)
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
            bw = None
            if entries:
                total = sum(e["total"] for e in entries)
                duration = sum(e["duration"] for e in entries)
                bw = total / duration / 1e9 if duration > 0 else None
            (bw_fig["warmup"] if i == 0 and not self.opts.quick else bw_fig["runs"]).append(bw)
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
        from gpudask_bench import dask_cuda_client as dc

        if not dc.available():
            self.notes.append("dask-cuda (with nvtx) not installed: no dc_local_cupy figures")
            return
        sizes = dc.QUICK_SIZES if self.opts.quick else dc.SIZES
        log_dir = getattr(self, "log_dir", None)
        for op in dc.OPERATIONS:
            if self.left() < 20:
                raise TimeBox()
            size, chunk = sizes[op]
            fig = self.figures[f"dc_local_cupy_{op}_s"] = figure(
                f"dask-cuda local_cupy {op} {size}^2 chunks {chunk}", "s", LOWER)
            # local_cupy asserts that it sees a worker: never start it on a cluster that lost one
            cluster.client.wait_for_workers(self.opts.nworkers, timeout=self.timeout(30.0))
            log = None
            if log_dir:
                os.makedirs(os.path.join(log_dir, self.spec.name), exist_ok=True)
                log = os.path.join(log_dir, self.spec.name, f"local_cupy-{op}.txt")
            out = dc.run(cluster.sched_file, self.spec.protocol, op, size, chunk, max(3, self.opts.repeat),
                         self.timeout(60.0), log=log)
            fig["runs"] = out["runs"]
            if out.get("error"):
                fig["note"] = f"local_cupy {op} failed: {out['error']}"
            elif out["p2p"]:
                fig["note"] = f"local_cupy's p2p 25/50/75%: {'; '.join(out['p2p'])}"
            finish(fig)
            self.echo(f"[{self.spec.name}] dask-cuda local_cupy {op}: {brief(fig, 's')}"
                      + (f" ({out['error']})" if out.get("error") else ""))
            self.notes.append(f"local_cupy {op}: -p {self.spec.protocol} -t gpu -s {size} -c {chunk} "
                              f"--runs {max(3, self.opts.repeat)} --disable-rmm (each side keeps its own memory "
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
        self.echo(f"[{self.spec.name}] transpose-sum: {brief(fig, 's')}")

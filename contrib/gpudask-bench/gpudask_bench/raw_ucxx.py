"""The ``raw-ucxx`` column: ucxx send/recv between two plain processes, the ceiling of the
worker-to-worker transfer figures (issue 14: "at least 75% of the raw limit").

Two processes run :mod:`gpudask_bench.ucxx_peer`, placed like the first two gpudask workers of the
same run (docs/benchmarks.md, The raw-ucxx column).  It has no cluster, so no ready time, no
(x + x.T).sum() and no GPU memory outside workers: those cells stay empty, with a note.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable

from gpudask.testing import processes
from gpudask_bench.configs import Host, Options, base_env, has_module
from gpudask_bench.measures import proto_info
from gpudask_bench.report import brief, size_label, timed_pair
from gpudask_bench.runner import Column

NAME = "raw-ucxx"
# run by path through runpy: ``python .../ucxx_peer.py`` would put gpudask_bench/ first on
# sys.path, where cli.py, report.py, workers.py... could shadow other packages' modules
_RUN_PEER = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"
_NOT_MEASURED = ("ready, (x + x.T).sum() and GPU memory outside workers are not measured: "
                 "no cluster, two plain ucxx processes")


def skip_reason() -> str | None:
    return None if has_module("ucxx") else "ucxx (distributed-ucxx) is not installed"


def _ucxx_options(config: dict[str, Any], env: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """The ``UCX_*`` variables distributed-ucxx would pass to ``ucxx.init`` in a worker with this
    dask config, less those ``env`` already sets (the environment wins there too), and why they
    could not be derived (None when they could)."""
    try:
        import dask.config
        from distributed_ucxx.ucxx import _prepare_ucx_config  # its own translation, not a copy of it

        with dask.config.set(config):
            options, environment = _prepare_ucx_config()
    except Exception as e:  # not installed, or a private function changed: report rather than fail the column
        return {}, f"distributed-ucxx's UCX options not derived ({type(e).__name__}: {e})"
    out = {f"UCX_{k}": str(v) for k, v in options.items()}
    out.update({k: str(v) for k, v in environment.items() if k not in out})
    return {k: v for k, v in out.items() if k not in env}, None


def placement(host: Host, opts: Options) -> tuple[list[dict[str, Any]], list[str]]:
    """Where the two peers go: gpudask's plan for workers 0 and 1 of this host, from the
    environment the gpudask column's processes get.  Each peer: ``env``, ``plan_env`` (what the
    plan and distributed-ucxx add), ``cpus``, ``interface``, ``host`` (the address to connect to,
    peer A's only).  Also notes."""
    import copy

    import dask.config
    from distributed.utils import get_ip

    from gpudask.bootstrap import plan_host
    from gpudask.plan.planner import INTERNAL_ENV_PREFIX

    user = base_env(host, opts, "ucx")
    # planning merges gpudask's defaults into dask.config: keep this process's (the bench
    # client's) config as it was for the configurations that run after this one
    saved = copy.deepcopy(dask.config.config)
    try:
        plan = plan_host("ucx", max(2, opts.nworkers), facts_path=user.get("GPUDASK_FACTS"), user_env=user)
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)
    notes: list[str] = []
    peers = []
    for wp in plan.workers[:2]:
        added = {k: v for k, v in wp.env.items() if not k.startswith(INTERNAL_ENV_PREFIX)}
        env = {**user, **added}
        extra, why = _ucxx_options(dict(wp.config), env)
        if why and why not in notes:
            notes.append(why)
        added.update(extra)
        env.update(extra)
        # the plan binds CPUs and picks an interface only on a real host (not a described one)
        real = not plan.facts.described
        cpus = wp.cpu_affinity if real else None
        ips = plan.facts.net_interfaces.get(wp.interface, []) if (real and wp.interface) else []
        peers.append({"worker": wp.index, "env": env, "plan_env": added, "cpus": cpus,
                      "interface": wp.interface, "host": ips[0] if ips else get_ip()})
    return peers, notes


def compare_with_gpudask(peers: list[dict[str, Any]], gpudask: dict[str, Any] | None) -> str | None:
    """A note on whether the gpudask workers of this run had the UCX_TLS and CUDA_VISIBLE_DEVICES
    the peers got (None when gpudask did not run before this column)."""
    live = (gpudask or {}).get("transports") or {}
    if not live:
        return None
    diffs = []
    for name in ("UCX_TLS", "CUDA_VISIBLE_DEVICES"):
        theirs = sorted({str((w.get("env") or {}).get(name)) for w in live.values()})
        ours = sorted({str(p["env"].get(name)) for p in peers})
        if theirs != ours:
            diffs.append(f"{name}: gpudask workers {', '.join(theirs)}, raw peers {', '.join(ours)}")
    if diffs:
        return "placement differs from the gpudask workers of this run: " + "; ".join(diffs)
    return "UCX_TLS and CUDA_VISIBLE_DEVICES match the gpudask workers of this run"


class RawRunner(Column):
    """Runs the two peers once, within the column's share of the time box."""

    def __init__(self, host: Host, opts: Options, workdir: str, deadline: float, echo: Callable[[str], None],
                 log_dir: str | None = None, gpudask: dict[str, Any] | None = None):
        super().__init__(NAME, "ucx", host, opts, workdir, deadline, echo, log_dir)
        self.gpudask = gpudask
        self.peers = processes.ProcessCluster(workdir, grace=1.0)  # logs: peer-a.log, peer-b.log

    def _argv(self, role: str, cpus: list[int] | None, *extra: str) -> list[str]:
        from gpudask_bench import ucxx_peer

        argv = [sys.executable, "-c", _RUN_PEER, str(ucxx_peer.__file__), role,
                "--sizes", ",".join(str(n) for n in self.opts.sizes[0]), "--backend", self.host.backend, *extra]
        return argv + (["--cpus", ",".join(map(str, cpus))] if cpus else [])

    def run(self) -> dict[str, Any]:
        try:
            self._run()
        except Exception as e:
            self.result["status"] = "failed" if not any(f["runs"] for f in self.figures.values()) else "partial"
            self.notes.append(f"{type(e).__name__}: {e}")
            self.echo(f"[{NAME}] failed: {type(e).__name__}: {e}")
        finally:
            self.strays += self.peers.stop()
            self.keep_logs(self._logs())
        self.notes.append(_NOT_MEASURED)
        return self.report()

    def _run(self) -> None:
        peers, notes = placement(self.host, self.opts)
        self.notes += notes
        match = compare_with_gpudask(peers, self.gpudask)
        if match:
            self.notes.append(match)
        a, b = peers
        self.result["placement"] = [{k: p[k] for k in ("worker", "plan_env", "cpus", "interface", "host")}
                                    for p in peers]
        ready = os.path.join(self.workdir, "peer-a.json")
        out = os.path.join(self.workdir, "peer-b.json")
        argv_a = self._argv("serve", a["cpus"], "--ready-file", ready)
        self.peers.spawn("peer-a", argv_a, a["env"])
        info_a = self._wait_for_file(ready, min(60.0, max(10.0, self.left())), "peer A")
        warmup = 0 if self.opts.quick else 1
        # the peer keeps a margin to report and exit; 10 minutes at most without a time box
        budget = min(600.0, max(1.0, self.left() - 5.0))
        argv_b = self._argv("fetch", b["cpus"], "--host", a["host"], "--port", str(info_a["port"]),
                            "--repeat", str(self.opts.repeat), "--warmup", str(warmup),
                            "--max-seconds", f"{budget:.1f}", "--out", out)
        self.result["commands"] = {"peers": [" ".join(argv_a[3:]), " ".join(argv_b[3:])]}
        self.peers.spawn("peer-b", argv_b, b["env"])
        info_b = self._wait_for_file(out, budget + 60.0, "peer B")
        peers = {"peer-a (sends)": info_a, "peer-b (receives)": {k: v for k, v in info_b.items() if k != "sizes"}}
        self.result["transports"] = peers
        if self.opts.proto_info:  # base_env set UCX_PROTO_INFO=y: what UCX chose in each peer
            self.result["proto_info"] = proto_info(self._logs(), {k: int(v["pid"]) for k, v in peers.items()})
        self._figures(info_b)
        for p in self.peers.procs:  # A exits once B said stop, B once it wrote its file
            try:
                p.wait(timeout=10)
            except Exception:
                self.notes.append(f"peer {p.pid} did not exit by itself")

    def _wait_for_file(self, path: str, timeout: float, who: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            for p in self.peers.procs:
                if p.poll() is not None and p.returncode != 0:
                    raise RuntimeError(f"a peer exited with {p.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{who} wrote nothing after {timeout:.0f} s: {self._log_tail()}")
            time.sleep(0.05)
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
        return data

    def _figures(self, info: dict[str, Any]) -> None:
        for row in info["sizes"]:
            nbytes, label = row["nbytes"], size_label(row["nbytes"])
            t_fig, bw_fig = timed_pair(self.figures, "transfer", nbytes, "end to end", "bandwidth")
            for key in ("warmup", "runs"):
                t_fig[key], bw_fig[key] = list(row[key]), [nbytes / t / 1e9 for t in row[key]]
            t_fig["note"] = row.get("note")
            # one buffer sent and received is also the ceiling of a pull of that size
            for kind, fig in (("s", t_fig), ("GBps", bw_fig)):
                self.figures[f"pull_{label}_{kind}"] = {**fig, "label": fig["label"].replace("transfer", "pull", 1)}
            if row.get("verified") is False:
                # bytes that did not arrive intact make the figure meaningless: keep it, say so
                self.result["status"] = "partial"
                self.notes.append(f"transfer {label}: the received bytes do not match the sender's checksum")
            self.echo(f"[{NAME}] transfer {label}: {brief(t_fig, 's')}, {brief(bw_fig, 'GB/s')}")
        missing = [size_label(n) for n in self.opts.sizes[0]
                   if f"transfer_{size_label(n)}_s" not in self.figures]
        if missing:
            self.notes.append("time box: skipped transfer " + ", ".join(missing))

    def _logs(self) -> list[str]:
        return [str(path) for path in self.peers.logs.values()]

    def _log_tail(self, lines: int = 8) -> str:
        return "; ".join(f"{label}.log: " + " | ".join(self.peers.log(label).splitlines()[-lines:])
                         for label in self.peers.logs)

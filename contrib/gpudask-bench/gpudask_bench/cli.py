"""``gpudask bench``: tcp, hand-set UCX, gpudask and dask-cuda side by side, on real processes,
and raw ucxx between two plain processes (no cluster) as the ceiling of the transfers.
docs/benchmarks.md describes every figure.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import Any, Callable

import click

from gpudask.testing import processes
from gpudask_bench import raw_ucxx
from gpudask_bench.configs import (CONFIGS, FULL_SIZES, SMALL_SIZES, Host, Options, Spec, build_spec, detect_host,
                                   parse_config_env, versions)
from gpudask_bench.report import add_ratios, add_raw_shares, render_table
from gpudask_bench.runner import Column, Interrupted, Runner


def run_bench(configs: list[str], opts: Options, host: Host, max_seconds: float | None, log_dir: str | None,
              echo: Callable[[str], None]) -> dict[str, Any]:
    t_start = time.perf_counter()
    end = t_start + max_seconds if max_seconds else math.inf
    report: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"hostname": socket.gethostname(), "cpu_count": len(os.sched_getaffinity(0)),
                    "gpus": host.gpus, "visible": host.tokens, "driver": host.driver,
                    "python": sys.version.split()[0], "packages": versions()},
        "settings": {"configs": configs, "nworkers": opts.nworkers, "nthreads": opts.nthreads,
                     "repeat": opts.repeat, "quick": opts.quick, "backend": host.backend,
                     "transfer_bytes": list(opts.sizes[0]), "array_side": opts.sizes[1],
                     "chunk_side": opts.sizes[2], "pool_size": opts.pool_size,
                     "spill_limit": opts.spill_limit, "max_seconds": max_seconds,
                     "profile": opts.profile, "ucx_proto_info": opts.proto_info, "pulls": opts.pulls,
                     "config_env": opts.config_env, "workloads": opts.workloads},
        "configs": [], "notes": []}
    if not host.tokens:
        report["notes"].append("no GPU visible: NumPy arrays, smaller sizes; ucx configurations get UCX_TLS=tcp")
    elif host.backend != "cupy":
        report["notes"].append("GPU visible but cupy is not importable: NumPy arrays, smaller sizes")
    root = tempfile.mkdtemp(prefix="gpudask-bench-")  # scheduler files, worker directories
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    results = report["configs"]
    try:
        todo = []
        for name in configs:  # skipped configurations take no share of the time box
            workdir = os.path.join(root, name)
            os.makedirs(workdir, exist_ok=True)
            # a cluster's commands, why it is skipped, or None: the raw column (no cluster, its own runner)
            sched_file = os.path.join(workdir, "scheduler.json")
            spec: Spec | str | None = (raw_ucxx.skip_reason() if name == raw_ucxx.NAME
                                       else build_spec(name, host, opts, sched_file, workdir))
            todo.append((name, workdir, spec))
        runnable = sum(1 for _, _, spec in todo if not isinstance(spec, str))
        while todo:
            name, workdir, spec = todo.pop(0)
            if isinstance(spec, str):
                results.append(_skipped(name, spec))
                echo(f"[{name}] skipped: {spec}")
                continue
            left = end - time.perf_counter()
            share = left / runnable
            runnable -= 1
            if left < 20:
                results.append(_skipped(name, "time box: --max-seconds spent before this configuration"))
                echo(f"[{name}] skipped: time box")
                continue
            runner: Column
            if spec is None:
                # placed like the gpudask workers; compared with them when they ran before it
                gpudask = next((r for r in results if r["name"] == "gpudask" and r.get("status") != "skipped"), None)
                runner = raw_ucxx.RawRunner(host, opts, workdir, time.perf_counter() + share, echo, log_dir, gpudask)
            else:
                runner = Runner(spec, host, opts, workdir, time.perf_counter() + share, echo, log_dir)
            try:
                results.append(runner.run())
            except Interrupted:
                runner.result["status"] = "interrupted"
                results.append(runner.report())
                results += [_skipped(rest, "interrupted") for rest, _, _ in todo]
                raise
    except Interrupted:
        report["notes"].append("interrupted by a signal: partial results")
    finally:
        processes.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    add_ratios(results)
    add_raw_shares(results, raw_ucxx.NAME)
    report["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    return report


def _skipped(name: str, why: str) -> dict[str, Any]:
    return {"name": name, "status": "skipped", "notes": [why], "figures": {}}


def _on_signal(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


@click.command(name="bench", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--configs", default=",".join(CONFIGS), show_default=True,
              help="Comma-separated configurations, the first one is the reference for ratios.")
@click.option("--nworkers", type=click.IntRange(min=1), default=None,
              help="Workers per configuration (default: one per visible GPU, at least 2).")
@click.option("--nthreads", type=click.IntRange(min=1), default=1, show_default=True,
              help="Threads per worker, the same for every configuration.")
@click.option("--repeat", type=click.IntRange(min=1), default=5, show_default=True,
              help="Measured runs per figure (after one warm-up run).")
@click.option("--quick", is_flag=True,
              help="Smoke test: small sizes, no warm-up, one cluster launch per configuration.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--max-seconds", type=click.FloatRange(min=1), default=None,
              help="Time box for the whole bench; figures that do not fit are skipped with a note.")
@click.option("--profile", is_flag=True,
              help="Record where ready time goes: per-process start, gpudask import, listen, registration.")
@click.option("--ucx-proto-info", "proto_info", is_flag=True,
              help="Set UCX_PROTO_INFO=y in ucx configurations and report the transports UCX selected.")
@click.option("--pool-size", default="1GB", show_default=True,
              help="RMM pool of the hand-set configurations (ucx-stock, dask-cuda); gpudask decides its own.")
@click.option("--spill-limit", default="4GB", show_default=True,
              help="Device memory limit of the spill launch (gpudask and dask-cuda, on a GPU): each worker "
                   "fills 2.5x this with CuPy chunks; 0 = no spill launch.  Bytes, or a size such as 4GB.")
@click.option("--backend", type=click.Choice(["auto", "cupy", "numpy"]), default="auto", show_default=True,
              help="Array library on the workers (auto: cupy with a GPU, numpy without).")
@click.option("--launch-timeout", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="Seconds to wait for a cluster to be ready.")
@click.option("--death-timeout", type=click.IntRange(min=1), default=60, show_default=True,
              help="Workers' --death-timeout (they exit when the scheduler is gone this long).")
@click.option("--log-dir", type=click.Path(file_okay=False), default=None,
              help="Keep the process logs here (default: a temporary directory, removed).")
@click.option("--table-file", type=click.Path(dir_okay=False), default=None,
              help="Also write the table to this file.")
@click.option("--pulls", type=click.IntRange(min=1), default=20, show_default=True,
              help="In-worker pulls per size after 3 warm-ups; the pull figure is their best and median.")
@click.option("--config-env", "config_env", multiple=True, metavar="NAME:KEY=VALUE",
              help="More environment for one configuration's processes (scheduler and workers), e.g. "
                   "gpudask:DASK_DISTRIBUTED__COMM__OFFLOAD=False to compare a lever on one side; repeatable.")
@click.option("--workloads/--no-workloads", default=True, show_default=True,
              help="Measure transfers and compute on the last launch; --no-workloads: ready time and the "
                   "spill launch only.")
@click.option("--show", "show", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Print the table of a previous --json result and exit (runs nothing).")
def bench_command(configs: str, nworkers: int | None, as_json: bool, max_seconds: float | None, spill_limit: str,
                  backend: str, log_dir: str | None, table_file: str | None, config_env: tuple[str, ...],
                  show: str | None, **same: Any) -> None:  # same: the Options fields of the same name
    """Benchmark tcp, ucx-stock, gpudask and dask-cuda side by side on real processes.

    Each configuration gets a real `dask scheduler` and N workers as separate processes,
    measured and then killed: ready time, worker-to-worker transfers, (x + x.T).sum(),
    GPU memory outside the workers, the UCX transports in use.  raw-ucxx: the same
    transfers with ucxx alone between two processes placed like gpudask's workers, the
    transfers' ceiling.  Progress goes to stderr.
    """
    if show:
        with open(show) as f:
            click.echo(render_table(json.load(f)))
        return
    # this process is the client: UCX must print nothing on stdout (--json) and, without
    # a GPU, use TCP only.  The clusters get the user's environment, not these.
    user_env = dict(os.environ)
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    names = [c.strip() for c in configs.split(",") if c.strip()]
    bad = [c for c in names if c not in CONFIGS]
    if bad or not names:
        raise click.BadParameter(f"{','.join(bad) or configs!r}: accepted: {', '.join(CONFIGS)}",
                                 param_hint="--configs")
    try:
        extra_env = parse_config_env(config_env, names)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--config-env") from None
    host = detect_host(backend)
    if not host.tokens:
        os.environ.setdefault("UCX_TLS", "tcp")
    if host.backend == "cupy" and not host.tokens:
        raise click.BadParameter("cupy needs a visible GPU", param_hint="--backend")
    sizes = FULL_SIZES if host.backend == "cupy" and not same["quick"] else SMALL_SIZES
    opts = Options(nworkers=nworkers or max(2, len(host.tokens)), sizes=sizes, user_env=user_env,
                   spill_limit=_parse_size(spill_limit, "--spill-limit"), config_env=extra_env, **same)

    echo = functools.partial(click.echo, err=True)
    import cloudpickle  # noqa: F401  (distributed needs it; fail here, not in a worker)

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        report = run_bench(names, opts, host, max_seconds, log_dir, echo)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    text = render_table(report)
    if table_file:
        with open(table_file, "w") as f:
            f.write(text + "\n")
    click.echo(json.dumps(report, indent=1, default=str) if as_json else text)


def _parse_size(value: str, option: str) -> int:
    from dask.utils import parse_bytes

    try:
        size = parse_bytes(value) if value.strip() else -1  # parse_bytes("") is 1
    except (ValueError, TypeError):
        size = -1
    if size < 0:
        raise click.BadParameter(f"{value!r}: accepted: a number of bytes or a size such as 4GB (0: none)",
                                 param_hint=option)
    return int(size)

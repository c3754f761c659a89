#!/usr/bin/env python
"""Scheduler CPU per joining worker, with and without gpudask (issue 14's scale figure).

    python lab/bench/scheduler-scale.py [--workers 32,64,128,256] [--repeat 3] [--hosts 4]
        [--facts tests/hosts/dgx-8gpu-nvswitch-4ib.json] [--json OUT] [--profile DIR]
    python lab/bench/scheduler-scale-compare.py            # hosted workers look like real ones

Each trial first starts the worker host processes (below) and waits until they are ready
to join, then launches a real ``python -m dask scheduler --host 127.0.0.1 --port 0
--no-dashboard`` (``plain``), or the same with ``--preload gpudask`` (``gpudask``), and
joins N real ``distributed.Worker`` objects to it (tcp, loopback, 1 thread each, no
nanny).  It reads the scheduler process's CPU time (user + sys, ``/proc/PID/stat``):

  startup   from launch until the scheduler has written its file and gone idle (imports,
            gpudask's planning and ``dask_setup``);
  joins     from then until every worker has registered;
  total     startup + joins, from launch: the figure issue 14 bounds (at most 1.1x plain
            at 256 workers).

Nothing is subtracted: both parts are printed.  A worker's registration returns only after
the scheduler ran its ``add_worker`` plugins, gpudask's check among them, so "registered"
means "checked"; after the reading, a client verifies that every worker of a gpudask trial
carries the check's result (``scheduler_info()["workers"][addr]["gpudask-check"]``) and
none of a plain trial does.  Trials of the two modes alternate (which one goes first
alternates too); the table gives medians over ``--repeat`` rounds.

Why workers share processes, and why that is faithful.  256 worker processes do not fit
this 2-core, 24 GiB machine, so ``--hosts`` Python processes each run N/hosts Workers in
one event loop.  Each process plays ``dask worker --nworkers 8 --preload gpudask`` on
nodes of the described host (GPUDASK_FACTS, an 8-GPU DGX by default): it plans the node
once as the nanny host does (``process.start("nanny")``, which writes the host plan and
exports $GPUDASK_HOST_PLAN), and runs, for each worker, what ``import gpudask`` runs first
thing in a nanny's worker process (``process.start_worker``: take worker i's plan from
the host plan, apply it), keeping the sessions.  On "go", for each worker in turn, it puts
that worker's applied plan back in place (``process._apply``) and its session current,
and starts ``Worker(preload=["gpudask"])``, whose ``dask_setup`` records the applied state
and puts the published plan into the worker's startup information -- before the next
worker's plan is applied (registrations then go on at once, as a cluster's nodes join).  So each worker registers with its own index, plan, applied
state and GPU resource, as a real one does.

The index comes from $GPUDASK_WORKER_INDEX (i mod 8), not from the slot lock: a process
holds one slot (``runtime._held_slot``) because a real worker process is one worker;
claiming again in the same process drops the previous descriptor, which frees its lock,
so in-process claims would alternate 0, 1, 0, 1 instead of counting up.  Workers run
without nannies in both modes, and with distributed's worker profiler off (256 sampling
threads would starve the 2 cores; the profiler sends nothing to the scheduler unasked).
``lab/bench/scheduler-scale-compare.py`` checks the claim: it joins two real ``dask worker
--nworkers 2 --preload gpudask`` workers and two hosted ones to one scheduler and compares
what the scheduler holds for them (``WorkerState.extra``, resources, the check's result).

``--profile DIR`` runs each scheduler under cProfile (stopped with SIGTERM so
the profile is written) and saves ``DIR/sched-MODE-N-ROUND.prof``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FACTS = os.path.join(HERE, "..", "..", "tests", "hosts", "dgx-8gpu-nvswitch-4ib.json")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """user + sys CPU of one process (its children are not the scheduler's)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15 of stat)


# ----------------------------------------------------------------- worker host process
async def host_workers(mode: str, first: int, count: int, per_node: int) -> None:
    from distributed import Worker

    sessions = []
    if mode == "gpudask":
        from gpudask.apply import process

        # the `dask worker --nworkers <per_node> --preload gpudask` process of a node:
        # plans once, writes the host plan its worker processes read
        process.start("nanny", protocol="tcp", nworkers=per_node)
        for i in range(first, first + count):
            # what the first `import gpudask` runs in a nanny's worker process: worker i's
            # plan from the host plan, applied.  Done before "go": each real worker process
            # does it at once, in parallel; here it would serialise ~30 ms per worker into
            # the measured window (the scheduler idling meanwhile, its heartbeats going on)
            os.environ["GPUDASK_WORKER_INDEX"] = str(i % per_node)
            sessions.append(process.start_worker({}))
    print("ready", flush=True)
    # "go ADDRESS": the scheduler is launched only once every host is ready, so that its
    # measured time holds no wait for the bench's own preparations
    address = (await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)).split()[1]
    workers = []
    profile = os.environ.get("SCHEDULER_SCALE_PROFILE_HOST")  # a file: where this host's joins go (by hand)
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    joining = []
    for k, i in enumerate(range(first, first + count)):
        if sessions:
            # worker i's applied plan back in place (environment, config), and its session the
            # process's: its dask_setup records this state and publishes this plan
            process._apply(sessions[k])
            process._SESSION = sessions[k]
        w = Worker(address, nthreads=1, host="127.0.0.1", dashboard=False, name=f"node{i // per_node}-{i % per_node}",
                   preload=["gpudask"] if mode == "gpudask" else [])
        task = asyncio.ensure_future(w.start())  # listen, dask_setup, register (checked on return)
        # Registrations go on at once, as a cluster's nodes join.  The next worker starts
        # once this one listens and (gpudask) its dask_setup has published its plan, the last
        # thing it does, so the next plan can go in place; plain workers wait for the same
        # point, so both modes join alike (the window's length decides how many heartbeats
        # of the workers already there fall into it)
        while not task.done() and not (w.listeners and (not sessions or "gpudask" in w.startup_information)):
            await asyncio.sleep(0.001)
        joining.append(task)
        workers.append(w)
    await asyncio.gather(*joining)
    if profile:
        profiler.disable()
        profiler.dump_stats(profile)
    print(f"joined {len(workers)}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes stdin
    os._exit(0)  # closing hundreds of workers one by one only costs time


# ----------------------------------------------------------------- one trial
def _spawn_host(argv: list[str], log: str, env: dict[str, str]) -> subprocess.Popen:
    """A worker host: its own process group, like gpudask.testing.processes.spawn, but with
    pipes (the bench tells it when to join and reads how many joined)."""
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "w"), env=env,
                            start_new_session=True, text=True)


def bench_env(args: argparse.Namespace, d: str) -> dict[str, str]:
    env = {**os.environ, "GPUDASK_FACTS": os.path.abspath(args.facts), "PYTHONUNBUFFERED": "1",
           # 256 sampling threads would starve 2 cores; nothing of it reaches the scheduler unasked
           "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
           "DASK_TEMPORARY_DIRECTORY": d}  # the workers' scratch folders go with the trial's folder
    env.pop("GPUDASK_WORKER_INDEX", None)
    # Bytecode as an installed package has it: with PYTHONDONTWRITEBYTECODE (set on this VM)
    # an editable checkout recompiles gpudask's modules at every start, which a pip-installed
    # gpudask never does.  The warm-up round fills this cache for both modes.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = args.pycache
    return env


def start_hosts(mode: str, n: int, per_node: int, nhosts: int, d: str, env: dict[str, str]) -> list[subprocess.Popen]:
    """Worker host processes, each ready to join its share of the n workers."""
    hosts, first = [], 0
    for k in range(nhosts):
        count = n // nhosts + (k < n % nhosts)
        if count:
            hosts.append(_spawn_host([sys.executable, __file__, "--host", "--mode", mode, "--first", str(first),
                                      "--count", str(count), "--per-node", str(per_node)],
                                     os.path.join(d, f"host-{k}.log"), env))
        first += count
    for h in hosts:
        assert h.stdout is not None and h.stdout.readline().strip() == "ready", f"a host failed; see {d}"
    return hosts


def join(hosts: list[subprocess.Popen], address: str) -> int:
    for h in hosts:
        assert h.stdin is not None
        h.stdin.write(f"go {address}\n")
        h.stdin.flush()
    return sum(int(h.stdout.readline().split()[1]) for h in hosts if h.stdout is not None)


def scheduler_argv(mode: str, sf: str, profile: str | None) -> list[str]:
    py = [sys.executable] + (["-m", "cProfile", "-o", profile] if profile else [])
    return py + ["-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                 "--scheduler-file", sf] + (["--preload", "gpudask"] if mode == "gpudask" else [])


def settled(pid: int, step: float = 0.2) -> float:
    """The process's CPU seconds once it is idle (less than a tick in ``step``): started."""
    before = cpu_seconds(pid)
    while True:
        time.sleep(step)
        now = cpu_seconds(pid)
        if now - before < 1.5 / TICK:
            return now
        before = now


def trial(mode: str, n: int, args: argparse.Namespace, tag: str) -> dict:
    d = tempfile.mkdtemp(prefix=f"sched-scale-{mode}-{n}-")
    sf = os.path.join(d, "scheduler.json")
    env = bench_env(args, d)
    profile = None
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
        profile = os.path.join(args.profile, f"sched-{mode}-{n}-{tag}.prof")
    hosts = start_hosts(mode, n, args.per_node, args.hosts, d, env)
    t0 = time.monotonic()
    from gpudask.testing import processes  # here: a host process imports gpudask in its own order

    sched = processes.spawn(scheduler_argv(mode, sf, profile), env, os.path.join(d, "scheduler.log"), d)
    try:
        address = processes.wait_for_scheduler_file(sf, [sched], timeout=60)
        cpu_started, t_started = settled(sched.pid), time.monotonic()
        joined = join(hosts, address)
        cpu_joined, t_joined = cpu_seconds(sched.pid), time.monotonic()
        seen = verify(sf)
    finally:
        # SIGTERM first (a profiled scheduler writes its file then), SIGKILL what is left
        processes.stop(hosts + [sched], grace=30.0 if profile else 1.0)
    ok = joined == n and seen["workers"] == n and seen["checked"] == (n if mode == "gpudask" else 0)
    if not ok:
        raise RuntimeError(f"{mode} N={n}: joined {joined}, scheduler sees {seen} (logs in {d})")
    shutil.rmtree(d, ignore_errors=True)  # kept when the trial fails
    return {"mode": mode, "n": n, "cpu_startup_s": cpu_started, "cpu_joins_s": cpu_joined - cpu_started,
            "cpu_total_s": cpu_joined, "wall_joins_s": t_joined - t_started, "wall_total_s": t_joined - t0,
            "checked": seen["checked"], "check_status": seen["status"]}


def _scheduler_view(dask_scheduler=None) -> dict:
    workers = dask_scheduler.workers.values()
    checks = [ws.extra["gpudask-check"] for ws in workers if "gpudask-check" in ws.extra]
    status: dict[str, int] = {}
    for c in checks:
        status[c["status"]] = status.get(c["status"], 0) + 1
    return {"workers": len(workers), "checked": len(checks), "status": status}


def verify(sf: str) -> dict:
    """After the reading: what the scheduler holds (a client costs scheduler CPU too)."""
    from distributed import Client

    with Client(scheduler_file=sf, timeout=60) as c:
        return c.run_on_scheduler(_scheduler_view)


# ----------------------------------------------------------------- report
def _ratio(a: float, b: float) -> float | None:
    """None when the plain side read 0 s: CPU time is counted in clock ticks (10 ms), and a
    few joining workers can cost less than one."""
    return a / b if b > 0 else None


def _fmt(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def table(results: list[dict], sizes: list[int]) -> tuple[str, list[dict]]:
    rows = []
    for n in sizes:
        med = {m: {k: statistics.median(r[k] for r in results if r["mode"] == m and r["n"] == n)
                   for k in ("cpu_startup_s", "cpu_joins_s", "cpu_total_s", "wall_total_s")}
               for m in ("plain", "gpudask")}
        rows.append({"n": n, **{f"{m}_{k}": v for m in med for k, v in med[m].items()},
                     "ratio_total": _ratio(med["gpudask"]["cpu_total_s"], med["plain"]["cpu_total_s"]),
                     "ratio_joins": _ratio(med["gpudask"]["cpu_joins_s"], med["plain"]["cpu_joins_s"]),
                     "plain_joins_ms_per_worker": 1000 * med["plain"]["cpu_joins_s"] / n,
                     "gpudask_joins_ms_per_worker": 1000 * med["gpudask"]["cpu_joins_s"] / n})
    head = (f"{'N':>4}  {'plain CPU s':>11}  {'gpudask CPU s':>13}  {'ratio':>5}  {'startup p/g s':>13}  "
            f"{'joins p/g s':>11}  {'joins ratio':>11}  {'ms/worker p/g':>13}  {'wall p/g s':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['n']:>4}  {r['plain_cpu_total_s']:>11.2f}  {r['gpudask_cpu_total_s']:>13.2f}  "
                     f"{_fmt(r['ratio_total']):>5}  {r['plain_cpu_startup_s']:>6.2f}/{r['gpudask_cpu_startup_s']:<6.2f}  "
                     f"{r['plain_cpu_joins_s']:>5.2f}/{r['gpudask_cpu_joins_s']:<5.2f}  {_fmt(r['ratio_joins']):>11}  "
                     f"{r['plain_joins_ms_per_worker']:>6.1f}/{r['gpudask_joins_ms_per_worker']:<6.1f}  "
                     f"{r['plain_wall_total_s']:>5.1f}/{r['gpudask_wall_total_s']:<5.1f}")
    for a, b in zip(rows, rows[1:]):
        step = {m: 1000 * (b[f"{m}_cpu_total_s"] - a[f"{m}_cpu_total_s"]) / (b["n"] - a["n"])
                for m in ("plain", "gpudask")}
        lines.append(f"increment {a['n']}->{b['n']}: plain {step['plain']:.2f} ms/worker, "
                     f"gpudask {step['gpudask']:.2f} ms/worker (scheduler CPU, total)")
    return "\n".join(lines), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="32,64,128,256")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hosts", type=int, default=4, help="worker host processes per trial")
    ap.add_argument("--per-node", type=int, default=8, help="workers per described node (its GPUs)")
    ap.add_argument("--facts", default=DEFAULT_FACTS)
    ap.add_argument("--json")
    ap.add_argument("--pycache", default=os.path.join(tempfile.gettempdir(), "gpudask-bench-pycache"),
                    help="bytecode cache of the bench's processes (PYTHONPYCACHEPREFIX)")
    ap.add_argument("--profile", help="cProfile each scheduler into this folder")
    ap.add_argument("--host", action="store_true", help=argparse.SUPPRESS)  # internal: a worker host process
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.host:
        asyncio.run(host_workers(args.mode, args.first, args.count, args.per_node))
        return
    sizes = [int(s) for s in args.workers.split(",")]
    for mode in ("plain", "gpudask"):  # warm-up, not counted: bytecode cache, page cache
        trial(mode, sizes[0], args, "warmup")
    results = []
    for r in range(args.repeat):
        for n in sizes:
            modes = ("plain", "gpudask") if (r + sizes.index(n)) % 2 == 0 else ("gpudask", "plain")
            for mode in modes:
                res = trial(mode, n, args, str(r))
                print(f"round {r} N={n} {mode}: CPU {res['cpu_total_s']:.2f} s (startup {res['cpu_startup_s']:.2f}, "
                      f"joins {res['cpu_joins_s']:.2f}), wall {res['wall_total_s']:.1f} s, check {res['check_status']}",
                      file=sys.stderr, flush=True)
                results.append(res)
    text, rows = table(results, sizes)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "facts": args.facts, "hosts": args.hosts, "cpus": os.cpu_count(),
                       "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": rows, "trials": results}, f, indent=1)


if __name__ == "__main__":
    main()

"""Run the workload suite against one cluster form; results as JSON lines, as they come.

    python -m tests.workloads.run --form processes|local|dask-cuda --protocol tcp|ucx \\
        --array numpy|cupy --out DIR [--timeout S] [--budget S] [--workflows a,b,...]

Forms:

* ``processes``: ``dask scheduler --preload gpudask`` and ``dask worker --preload gpudask
  --nworkers 2``, and a client script (``client.py``) that does not import gpudask; then
  the workflows that register gpudask's plugins, on a stock cluster (no ``--preload``).
* ``local``: ``local.py``, a script that imports gpudask at its top and starts
  ``gpudask.LocalGPUCluster``.
* ``dask-cuda``: stock ``dask scheduler`` and two ``dask cuda worker`` processes, the
  reference (skipped, with one line, where dask-cuda is not installed).

One cluster per form runs every workflow in sequence.  Each workflow has its time limit
(``--timeout``) inside the client; a client that prints nothing for longer is killed, the
workflow recorded as ``timeout`` and the client started again for the rest.  The whole
form has ``--budget`` seconds; what is left then is ``not-run``.  Every process started is
stopped at the end.  Lines go to stdout and ``DIR/results.jsonl``; process logs to
``DIR/<form>-<protocol>-<array>/``.  Exit 0 when every workflow is ``ok`` or ``skipped``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import queue
import subprocess
import sys
import threading
import time
from typing import Any

from gpudask.testing.processes import ProcessCluster, dask_command, stop

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from workflows import STOCK_ONLY, WORKFLOWS  # noqa: E402 - this folder is not a package

FORMS = ("processes", "local", "dask-cuda")
PROTOCOLS = ("tcp", "ucx")
ARRAYS = ("numpy", "cupy")
DEVICE_MEMORY_LIMIT = "32MiB"  # the spill workflow's working set is 2.5x this per worker
SLACK = 30.0  # seconds a client may stay silent beyond a workflow's own limit


class Form:
    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.suite = f"{args.form}-{args.protocol}-{args.array}" + (
            "-gpu-less-scheduler" if args.scheduler_gpu == "no" else "") + (
            "-gpudask-client" if args.client == "gpudask" else "")
        self.dir = pathlib.Path(args.out) / self.suite
        self.dir.mkdir(parents=True, exist_ok=True)
        self.results = open(pathlib.Path(args.out) / "results.jsonl", "a")
        self.deadline = time.monotonic() + args.budget
        self.lines: list[dict[str, Any]] = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", UCX_WARN_UNUSED_ENV_VARS="n",
                        DASK_GPUDASK__SPILL__DEVICE_MEMORY_LIMIT=args.device_memory_limit,
                        DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT=os.environ.get(
                            "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT", "20s"))
        # the workflows' own functions are pickled by reference: every process imports them
        self.env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
        if args.facts:
            self.env["GPUDASK_FACTS"] = str(pathlib.Path(args.facts).resolve())

    def emit(self, line: dict[str, Any]) -> None:
        line = {"suite": self.suite, "form": self.a.form, "protocol": self.a.protocol, "array": self.a.array, **line}
        self.lines.append(line)
        text = json.dumps(line, default=str)
        print(text, flush=True)
        self.results.write(text + "\n")
        self.results.flush()

    def note(self, text: str) -> None:
        print(f"workloads: {self.suite}: {text}", flush=True)

    # ------------------------------------------------------------------ one client
    def drive(self, argv: list[str], names: list[str], label: str, cwd: pathlib.Path) -> None:
        """Run a client for ``names``; restart it after a hang for the rest."""
        todo = list(names)
        attempt = 0
        while todo:
            if time.monotonic() > self.deadline:
                for name in todo:
                    self.emit({"workflow": name, "status": "not-run", "error": f"the form's budget of "
                               f"{self.a.budget:g} s was spent"})
                return
            attempt += 1
            log = self.dir / f"{label}-{attempt}.log"
            err = open(log, "ab")
            proc = subprocess.Popen([*argv, "--workflows", ",".join(todo), "--timeout", str(self.a.timeout)],
                                    env=self.env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL, start_new_session=True, text=True)
            lines: queue.Queue[str | None] = queue.Queue()

            def pump(p: subprocess.Popen = proc) -> None:
                assert p.stdout is not None
                for text in p.stdout:
                    lines.put(text)
                lines.put(None)

            threading.Thread(target=pump, daemon=True).start()
            current: str | None = None
            # the first line may wait for the cluster to start (LocalGPUCluster, wait_for_workers)
            silence = self.a.timeout * 2 + SLACK
            while True:
                left = self.deadline - time.monotonic()
                try:
                    text = lines.get(timeout=max(1.0, min(silence, left)))
                except queue.Empty:
                    why = (f"no answer within {min(silence, left):.0f} s" if left > 0
                           else f"the form's budget of {self.a.budget:g} s was spent")
                    stop([proc], grace=2)
                    if current is not None:
                        self.emit({"workflow": current, "status": "timeout", "error": why + "; the client was "
                                   "killed", "log": str(log)})
                        todo.remove(current)
                    else:
                        for name in todo:
                            self.emit({"workflow": name, "status": "error", "error": why + " before the first "
                                       f"workflow started; see {log}"})
                        todo = []
                    break
                if text is None:  # the client exited
                    proc.wait()
                    if current is not None:
                        self.emit({"workflow": current, "status": "error", "error": f"the client exited "
                                   f"({proc.returncode}) during the workflow; see {log}"})
                        todo.remove(current)
                    elif todo:
                        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                        for name in todo:
                            self.emit({"workflow": name, "status": "error",
                                       "error": f"the client exited ({proc.returncode}): {tail[0][:300]}"})
                        todo = []
                    break
                try:
                    line = json.loads(text)
                except ValueError:
                    continue  # a library printing on stdout
                if line.get("event") == "start":
                    current = line["workflow"]
                    silence = self.a.timeout + SLACK
                elif line.get("event") == "end":
                    plain = label == "client" and self.a.client == "plain"  # it must not have imported gpudask
                    self.emit({"workflow": f"{label}-end", "status": "wrong" if plain and line.get(
                        "gpudask_imported") else "ok", "detail": line})
                elif "workflow" in line:
                    self.emit(line)
                    if line["workflow"] in todo:
                        todo.remove(line["workflow"])
                    current = None
            err.close()

    # ------------------------------------------------------------------ the forms
    def cluster(self, sub: str) -> ProcessCluster:
        d = self.dir / sub
        d.mkdir(exist_ok=True)
        return ProcessCluster(d, env=self.env, grace=5)

    def processes(self, names: list[str]) -> None:
        main = [n for n in names if n not in STOCK_ONLY]
        if main:
            self.on_processes("gpudask", main, "client", preload=("--preload", "gpudask"))
        stock = [n for n in names if n in STOCK_ONLY]
        if stock:
            self.on_processes("stock", stock, "stock-client", preload=())

    def on_processes(self, sub: str, names: list[str], role: str, preload: tuple[str, ...]) -> None:
        """``names`` from a plain client of ``dask scheduler`` + ``dask worker --nworkers 2``
        (with ``preload`` on both); a cluster that does not start errs every one of them."""
        c = self.cluster(sub)
        p = self.a.protocol
        try:
            # a scheduler without a GPU: CUDA_VISIBLE_DEVICES="" (the workers keep theirs)
            sched_env = dict(self.env, CUDA_VISIBLE_DEVICES="") if self.a.scheduler_gpu == "no" else self.env
            c.scheduler(*preload, protocol=p, env=sched_env, timeout=self.a.timeout * 2)
            c.worker(*preload, "--protocol", p, "--nworkers", "2", "--nthreads", "1", env=self.env)
            self.drive(self.client_argv(c), names, role, c.workdir)
        except RuntimeError as e:
            for name in names:
                self.emit({"workflow": name, "status": "error", "error": str(e).splitlines()[0]})
        finally:
            self.stopped(c)

    def local(self, names: list[str]) -> None:
        main = [n for n in names if n not in STOCK_ONLY]
        argv = [sys.executable, str(HERE / "local.py"), "--protocol", self.a.protocol, "--array", self.a.array]
        d = self.dir / "local"
        d.mkdir(exist_ok=True)
        self.drive(argv, main, "local", d)
        for name in names:
            if name in STOCK_ONLY:
                self.emit({"workflow": name, "status": "skipped",
                           "detail": {"skipped": "registers gpudask on a stock cluster: run in form processes"}})

    def dask_cuda(self, names: list[str]) -> None:
        if importlib.util.find_spec("dask_cuda") is None:
            self.note("dask-cuda is not installed here: the reference form (dask cuda worker) is skipped")
            for name in names:
                self.emit({"workflow": name, "status": "skipped", "detail": {"skipped": "dask-cuda not installed"}})
            return
        env = {k: v for k, v in self.env.items() if not k.startswith("GPUDASK_")}
        gpus = [g for g in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if g] or ["0"]
        c = self.cluster("dask-cuda")
        main = [n for n in names if n not in STOCK_ONLY]
        try:
            c.scheduler(protocol=self.a.protocol, env=env, timeout=self.a.timeout * 2)
            for i in range(2):  # two workers, as in the gpudask forms (one GPU each, or both on one)
                argv = dask_command("cuda", "worker", "--scheduler-file", c.scheduler_file, "--protocol",
                                    self.a.protocol, "--device-memory-limit", self.a.device_memory_limit,
                                    "--death-timeout", "60", "--nthreads", "1", "--no-dashboard")
                c.spawn(f"cuda-worker-{i}", argv, dict(env, CUDA_VISIBLE_DEVICES=gpus[i % len(gpus)]))
            self.drive(self.client_argv(c), main, "client", c.workdir)
        except RuntimeError as e:
            for name in main:
                self.emit({"workflow": name, "status": "error", "error": str(e).splitlines()[0]})
        finally:
            self.stopped(c)
        for name in names:
            if name in STOCK_ONLY:
                self.emit({"workflow": name, "status": "skipped",
                           "detail": {"skipped": "the reference has no gpudask to register"}})

    def client_argv(self, c: ProcessCluster) -> list[str]:
        return [sys.executable, str(HERE / "client.py"), "--scheduler-file", c.scheduler_file,
                "--array", self.a.array] + (["--gpudask-client", self.a.protocol] if self.a.client == "gpudask" else [])

    def stopped(self, c: ProcessCluster) -> None:
        left = c.stop()
        if left:
            self.note(f"processes that survived SIGKILL: {left}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.workloads.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--form", choices=FORMS, required=True)
    p.add_argument("--protocol", choices=PROTOCOLS, default="tcp")
    p.add_argument("--array", choices=ARRAYS, default="numpy")
    p.add_argument("--out", required=True, help="folder for results.jsonl and the process logs")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per workflow (default 60)")
    p.add_argument("--budget", type=float, default=240.0, help="seconds for the whole form (default 240)")
    p.add_argument("--workflows", default=",".join(WORKFLOWS),
                   help="comma-separated, from: " + ", ".join(WORKFLOWS))
    p.add_argument("--scheduler-gpu", choices=("yes", "no"), default="yes",
                   help="form processes: 'no' starts the scheduler with CUDA_VISIBLE_DEVICES=\"\" (default yes)")
    p.add_argument("--client", choices=("plain", "gpudask"), default="plain",
                   help="form processes: the client script calls gpudask.initialize() first (default plain)")
    p.add_argument("--facts", default=None, help="a facts file describing the GPU host (GPUDASK_FACTS)")
    p.add_argument("--device-memory-limit", default=DEVICE_MEMORY_LIMIT,
                   help=f"each worker's device memory limit (default {DEVICE_MEMORY_LIMIT})")
    a = p.parse_args(argv)
    names = [n.strip() for n in a.workflows.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKFLOWS]
    if unknown or not names:
        p.error(f"unknown workflow(s) {', '.join(unknown) or '(none given)'}; accepted: {', '.join(WORKFLOWS)}")
    a.names = names
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    form = Form(a)
    form.note(f"{len(a.names)} workflow(s), {a.timeout:g} s each, {a.budget:g} s in all")
    try:
        {"processes": form.processes, "local": form.local, "dask-cuda": form.dask_cuda}[a.form](a.names)
    except KeyboardInterrupt:
        form.note("interrupted")
        return 130
    finally:
        form.results.close()
    bad = [line["workflow"] for line in form.lines if line["status"] not in ("ok", "skipped")]
    form.note(f"{len(form.lines) - len(bad)} ok or skipped, {len(bad)} not: {', '.join(bad) or '-'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

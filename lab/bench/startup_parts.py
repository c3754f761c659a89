"""Where a GPU worker's start goes, part by part, each in a fresh interpreter (GPU machine).

    python3 lab/bench/startup_parts.py > parts.jsonl

Each line: one part, the median of 3 fresh processes, seconds.  The forkserver lines say
whether a fork server that imported the UCX and GPU libraries (and created no CUDA context:
NVML is asked) gives children that still open UCX and CUDA, and how long a child takes.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap

PARTS = {
    "python": "pass",
    "import distributed": "import distributed",
    "import distributed_ucxx+ucxx (after distributed)":
        "import distributed; t0=T(); import distributed_ucxx.ucxx, ucxx; R(T()-t0)",
    "ucxx init_once, UCX_TLS=tcp (nanny-like, after imports)":
        "import os; os.environ['UCX_TLS']='tcp'; import distributed, distributed_ucxx.ucxx as u, ucxx;"
        " t0=T(); u.init_once(); R(T()-t0)",
    "ucxx init_once, UCX_TLS=tcp,cuda_copy,cuda_ipc (worker-like, after imports)":
        "import os; os.environ['UCX_TLS']='tcp,cuda_copy,cuda_ipc'; import distributed, distributed_ucxx.ucxx as u,"
        " ucxx; t0=T(); u.init_once(); R(T()-t0)",
    "ucxx listener (after init, tcp)":
        "import os, asyncio; os.environ['UCX_TLS']='tcp'; import distributed, distributed_ucxx.ucxx as u;"
        " from distributed.comm import listen\n"
        "async def main():\n"
        "    u.init_once(); t0=T(); l = listen('ucxx://127.0.0.1:0', lambda c: None); await l.start(); R(T()-t0);"
        " l.stop()\n"
        "asyncio.run(main())",
    "import cupy": "t0=T(); import cupy; R(T()-t0)",
    "cuInit (cupy getDeviceCount)": "import cupy; t0=T(); cupy.cuda.runtime.getDeviceCount(); R(T()-t0)",
    "CUDA context (cupy.zeros, after cuInit)":
        "import cupy; cupy.cuda.runtime.getDeviceCount(); t0=T(); cupy.zeros(1); R(T()-t0)",
    "import rmm": "t0=T(); import rmm; R(T()-t0)",
    "rmm pool 35 GiB (after context)":
        "import cupy, rmm; cupy.zeros(1); t0=T(); rmm.reinitialize(pool_allocator=True,"
        " initial_pool_size=35*2**30); R(T()-t0)",
    "import gpudask plugins (client role)":
        "import distributed; t0=T(); import gpudask, gpudask.bootstrap as b; b.inputs(); R(T()-t0)",
}

HEAD = ("import time, json, sys\nT=time.perf_counter\n_t0=T()\n"
        "def R(x): print(json.dumps({'part_s': x}))\n")


def run_part(code: str) -> tuple[float, float | None]:
    src = HEAD + code + "\nprint(json.dumps({'total_s': T()-_t0}))\n"
    t0 = __import__("time").perf_counter()
    p = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"})
    wall = __import__("time").perf_counter() - t0
    part = None
    for line in p.stdout.splitlines():
        if line.startswith("{") and "part_s" in line:
            part = json.loads(line)["part_s"]
    if p.returncode:
        raise RuntimeError(p.stderr[-2000:])
    return wall, part


FORKSERVER = textwrap.dedent("""
    import json, multiprocessing as mp, os, sys, time
    PRELOAD = json.loads(sys.argv[1])

    def child(q):
        t0 = time.perf_counter()
        os.environ['UCX_TLS'] = 'tcp,cuda_copy,cuda_ipc'
        import distributed, distributed_ucxx.ucxx as u, ucxx, cupy, rmm
        t1 = time.perf_counter()
        u.init_once()
        t2 = time.perf_counter()
        cupy.zeros(1); rmm.reinitialize(pool_allocator=True, initial_pool_size=2**30)
        x = cupy.arange(10).sum().item()
        q.put({'imports_s': t1 - t0, 'init_once_s': t2 - t1, 'total_s': time.perf_counter() - t0, 'ok': x == 45})

    if __name__ == '__main__':
        ctx = mp.get_context('forkserver')
        ctx.set_forkserver_preload(PRELOAD)
        import multiprocessing.forkserver as fs
        fs.ensure_running()
        time.sleep(8)   # the server's preload done
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        before = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
        out = []
        for i in range(3):
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            t0 = time.perf_counter(); p.start(); r = q.get(timeout=60); p.join(30)
            r['wall_s'] = time.perf_counter() - t0
            out.append(r)
        print(json.dumps({'preload': PRELOAD, 'gpu_pids_before_children': before, 'children': out}))
""")


def main() -> None:
    for name, code in PARTS.items():
        try:
            runs = [run_part(code) for _ in range(3)]
        except Exception as e:  # noqa: BLE001 - one part failing must not hide the others
            print(json.dumps({"part": name, "error": str(e)[-800:]}), flush=True)
            continue
        parts = [p for _, p in runs if p is not None]
        print(json.dumps({"part": name, "wall_median_s": statistics.median(w for w, _ in runs),
                          "part_median_s": statistics.median(parts) if parts else None}), flush=True)
    for preload in (["distributed"], ["distributed", "distributed_ucxx.ucxx", "ucxx", "cupy", "rmm"]):
        p = subprocess.run([sys.executable, "-c", FORKSERVER, json.dumps(preload)], capture_output=True,
                           text=True, timeout=200, env={**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n"})
        print(p.stdout.strip() or json.dumps({"preload": preload, "rc": p.returncode,
                                              "stderr": p.stderr[-1500:]}), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# dask-cuda's own `local_cupy` benchmark against external clusters, one worker setup at a time
# (issue 16: dot up to 10x slower on `dask worker --preload gpudask` than on `dask cuda worker`).
#
# Needs the device wheels in .whl/ (dask-cuda included) plus nvtx, which local_cupy imports.
# Then with the device tool:           run(command="bash lab/bench/dc-local-cupy-matrix.sh",
#                                          carry=[".whl"], kind="nvidia-h200-x2")
#
# Each variant: a fresh `dask scheduler --protocol ucx` (no preload, the same for every variant),
# two workers (gpudask: `dask worker --nworkers 2 --nthreads 1 --preload gpudask`; dask-cuda:
# `dask cuda worker`, one per GPU), a dump of every worker's state (UCX_* env, CUDA_VISIBLE_DEVICES,
# RMM resource, CuPy allocator, distributed-ucxx config, CPU affinity) before and after the
# benchmark, then `python -m dask_cuda.benchmarks.local_cupy` per operation.  The workers'
# transfer logs are cleared between operations so each operation's p2p bandwidth is its own.
#
# Variants:  VARIANTS="name name ..." (default: all, in the order below); each has a worker kind and
# environment (see `variant`).  Other knobs: SIZE CHUNK DOT_RUNS RUNS OPS_ALL TOTAL_S.
# Everything lands in $OUT/all.tgz (<variant>/: scheduler.log worker.log state-before.json state-after.json
# <op>.txt); $OUT/summary.txt has one line per (variant, operation).
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/dc-local-cupy-out}
mkdir -p "$OUT"
TOTAL_S=${TOTAL_S:-450}        # stop starting variants past this (device call limit: 600 s)
SIZE=${SIZE:-20000}
CHUNK=${CHUNK:-2000}
DOT_RUNS=${DOT_RUNS:-2}
RUNS=${RUNS:-5}                # transpose_sum and slice
OPS_ALL=${OPS_ALL:-"dot transpose_sum slice"}
VARIANTS=${VARIANTS:-"dask-cuda gpudask gpudask-no-pool gpudask-pool-cupy-own dask-cuda-pool-cupy-rmm gpudask-async gpudask-ucx-auto"}
# variants that run dot only (the operation that shows the slowdown)
OPS_ONLY_DOT_FOR=${OPS_ONLY_DOT_FOR-"gpudask-pool-cupy-own dask-cuda-pool-cupy-rmm gpudask-async gpudask-ucx-auto"}

if [ -z "${SKIP_INSTALL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
fi
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
echo "install took $(( $(date +%s) - t0 )) s"

# --- the host, once
if [ -z "${SKIP_HOST:-}" ]; then
  { nvidia-smi; nvidia-smi topo -m; } > "$OUT/host.txt" 2>&1
  python3 -m dask_cuda.benchmarks.local_cupy --help > "$OUT/local_cupy-help.txt" 2>&1
  python3 -m gpudask.cli info --protocol ucx --nworkers 2 > "$OUT/gpudask-info-ucx-2.txt" 2>&1
fi
python3 -c "import nvtx" 2>/dev/null || echo "WARNING: nvtx missing: local_cupy will not import" | tee -a "$OUT/summary.txt"

# --- worker-state dump (client.run on every worker); $1 = output file
STATE_PY=$(mktemp /tmp/dc-state-XXXX.py)
cat > "$STATE_PY" <<'EOF'
import json, os, sys
from distributed import Client

def state(dask_worker=None):
    out = {"pid": os.getpid(),
           "env": {k: v for k, v in sorted(os.environ.items())
                   if k.startswith(("UCX_", "CUDA_", "RAPIDS_", "DASK_", "GPUDASK_", "OMP_", "NCCL_"))
                   and k != "GPUDASK_PROBED_FACTS"},
           "cpus": len(os.sched_getaffinity(0)),
           "plugins": sorted(dask_worker.plugins) if dask_worker is not None else None,
           "nthreads": getattr(dask_worker, "state", None) and dask_worker.state.nthreads,
           "resources": getattr(dask_worker, "state", None) and dict(dask_worker.state.total_resources)}
    import dask.config
    out["config"] = {k: dask.config.get(k, None) for k in (
        "distributed-ucxx", "distributed.rmm", "array.rechunk.method", "distributed.comm.ucx",
        "distributed.worker.memory", "distributed.scheduler.work-stealing")}
    if dask_worker is not None:  # host-memory limit and the spill target (CuPy arrays count against it)
        out["memory_limit"] = dask_worker.memory_manager.memory_limit
        out["spill_target"] = getattr(dask_worker.data, "n", None)
        spilled = getattr(dask_worker.data, "spilled_total", None)  # bytes on disk now (sizeof, pickled)
        out["spilled_now"] = list(spilled) if spilled is not None else None
        out["spill_counters"] = {k: v for k, v in dask_worker.digests_total.items()
                                 if "disk" in str(k)} if hasattr(dask_worker, "digests_total") else None
    try:
        import rmm
        mr = rmm.mr.get_current_device_resource()
        chain, m = [], mr
        while m is not None and len(chain) < 8:
            chain.append(type(m).__name__)
            m = getattr(m, "upstream_mr", None)
        out["rmm_resource"] = " -> ".join(chain)
        for m in [mr, getattr(mr, "upstream_mr", None)]:
            if m is not None and hasattr(m, "pool_size"):
                out["rmm_pool_size"] = int(m.pool_size())
    except Exception as e:  # the dump must never fail the run
        out["rmm_resource"] = f"error: {type(e).__name__}: {e}"
    try:
        import cupy
        alloc = cupy.cuda.get_allocator()
        out["cupy_allocator"] = f"{getattr(alloc, '__module__', '')}.{getattr(alloc, '__qualname__', repr(alloc))}"
        out["cupy_device"] = cupy.cuda.Device().id
        out["cupy_pci_bus_id"] = cupy.cuda.Device().pci_bus_id
        out["cupy_pool_used"] = cupy.get_default_memory_pool().used_bytes()
        out["cupy_pool_total"] = cupy.get_default_memory_pool().total_bytes()
        free, total = cupy.cuda.runtime.memGetInfo()
        out["gpu_free_bytes"] = int(free)
    except Exception as e:
        out["cupy_allocator"] = f"error: {type(e).__name__}: {e}"
    try:
        from gpudask.plugins import rmm as gr
        out["gpudask_rmm_report"] = gr._REPORT
    except Exception as e:
        out["gpudask_rmm_report"] = None
    return out

def clear_logs(dask_worker=None):
    dask_worker.transfer_incoming_log.clear()
    dask_worker.transfer_outgoing_log.clear()
    return True

with Client(scheduler_file=sys.argv[1], timeout=60) as c:
    if sys.argv[2] == "wait":
        c.wait_for_workers(int(sys.argv[3]), timeout=90)
        print(f"{len(c.scheduler_info(n_workers=-1)['workers'])} workers", flush=True)
    elif sys.argv[2] == "clear":
        c.run(clear_logs)
    else:
        with open(sys.argv[2], "w") as f:
            json.dump(c.run(state), f, indent=1, sort_keys=True, default=str)
EOF

# $1 variant name -> sets KIND (gpudask|dask-cuda), VENV (env assignments), WARGS (extra worker args)
variant() {
  KIND=gpudask; VENV=""; WARGS=""
  case "$1" in
    dask-cuda)               KIND=dask-cuda ;;
    dask-cuda-pool-cupy-rmm) KIND=dask-cuda; WARGS="--rmm-pool-size 0.5 --set-rmm-allocator-for-libs cupy" ;;
    gpudask)                 ;;
    gpudask-no-pool)         VENV="DASK_GPUDASK__RMM__POOL_SIZE=off" ;;
    gpudask-pool-cupy-own)   VENV="DASK_GPUDASK__RMM__LIBRARIES=[]" ;;
    gpudask-ucx-auto)        VENV="DASK_GPUDASK__TRANSPORT__MODE=ucx-auto" ;;
    gpudask-async)           VENV="DASK_GPUDASK__RMM__ALLOCATOR=async" ;;
    gpudask-no-affinity)     VENV="DASK_GPUDASK__CPU_AFFINITY__ENABLED=false" ;;
    gpudask-no-pool-ucx-auto) VENV="DASK_GPUDASK__RMM__POOL_SIZE=off DASK_GPUDASK__TRANSPORT__MODE=ucx-auto" ;;
    # the host-memory limit: distributed's 'auto' gives a --nthreads 1 worker 1/CPUs of the host's memory
    # and spills CuPy arrays to disk above 0.6 of it; 0.5 = this host's memory split between 2 workers
    gpudask-memlimit)        WARGS="--memory-limit 0.5" ;;
    # gpudask's device tier off: only the worker-memory plugin's host limit stands between CuPy and disk
    gpudask-no-spill)        VENV="DASK_GPUDASK__SPILL__DEVICE_MEMORY_LIMIT=false" ;;
    # intra-node host transports as UCX picks them when UCX_TLS is unset (dask-cuda's workers)
    gpudask-tls-sm)          VENV="UCX_TLS=tcp,cuda_copy,cuda_ipc,sm,self" ;;
    gpudask-no-host-spill)   VENV="DASK_DISTRIBUTED__WORKER__MEMORY__TARGET=False DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=False" ;;
    # only gpu-pinning; distributed-ucxx then makes the CUDA context itself, as on dask-cuda's workers
    gpudask-pinning-only)    VENV="GPUDASK_PLUGINS=gpu-pinning DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT=True" ;;
    *) echo "unknown variant $1"; return 1 ;;
  esac
}

kill_group() {  # $1 = pid of a setsid'd leader: TERM its group, then KILL what is left
  [ -n "${1:-}" ] || return 0
  kill -TERM -- "-$1" 2>/dev/null
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 -- "-$1" 2>/dev/null || return 0; sleep 0.5; done
  kill -KILL -- "-$1" 2>/dev/null
}

summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

for v in $VARIANTS; do
  elapsed=$(( $(date +%s) - t0 ))
  if [ "$elapsed" -gt "$TOTAL_S" ]; then summary "$v: skipped (time box: ${elapsed} s used)"; continue; fi
  variant "$v" || continue
  d="$OUT/$v"; mkdir -p "$d"
  sf="$d/scheduler.json"
  tv=$(date +%s)
  setsid python3 -m dask scheduler --protocol "${PROTO:-ucx}" --port 0 --scheduler-file "$sf" --no-dashboard \
      > "$d/scheduler.log" 2>&1 < /dev/null &
  spid=$!
  for _ in $(seq 1 60); do [ -s "$sf" ] && break; sleep 0.5; done
  if [ "$KIND" = dask-cuda ]; then
    setsid env $VENV python3 -m dask cuda worker --scheduler-file "$sf" --death-timeout 30 $WARGS \
        > "$d/worker.log" 2>&1 < /dev/null &
  else
    setsid env $VENV python3 -m dask worker --scheduler-file "$sf" --nworkers 2 --nthreads 1 \
        --preload gpudask --death-timeout 30 $WARGS > "$d/worker.log" 2>&1 < /dev/null &
  fi
  wpid=$!
  echo "== $v ($KIND ${VENV:-default} $WARGS)" | tee "$d/variant.txt"
  if ! timeout -k 5 100 python3 "$STATE_PY" "$sf" wait 2 > "$d/wait.txt" 2>&1; then
    summary "$v: workers not ready (see $v/worker.log)"; tail -n 30 "$d/worker.log"
    kill_group "$wpid"; kill_group "$spid"; continue
  fi
  echo "ready after $(( $(date +%s) - tv )) s" >> "$d/variant.txt"
  timeout -k 5 60 python3 "$STATE_PY" "$sf" "$d/state-before.json" > "$d/state.err" 2>&1
  ops=${OPS_ALL}
  [ -n "${OPS_ONLY_DOT_FOR:-}" ] && case " $OPS_ONLY_DOT_FOR " in *" $v "*) ops="dot" ;; esac
  for op in $ops; do
    runs=$RUNS; lim=90; [ "$op" = dot ] && runs=$DOT_RUNS && lim=$(( 25 + 40 * DOT_RUNS ))
    left=$(( TOTAL_S + 60 - ($(date +%s) - t0) ))
    [ "$lim" -gt "$left" ] && lim=$left
    if [ "$lim" -lt 20 ]; then summary "$v $op: skipped (time box)"; continue; fi
    timeout -k 5 60 python3 "$STATE_PY" "$sf" clear >> "$d/state.err" 2>&1
    to=$(date +%s)
    timeout -k 5 "$lim" python3 -m dask_cuda.benchmarks.local_cupy --scheduler-file "$sf" -p "${PROTO:-ucx}" \
        -t gpu -o "$op" -s "$SIZE" -c "$CHUNK" --runs "$runs" > "$d/$op.txt" 2>&1
    rc=$?
    wall=$(grep -E '^Wall clock +\|' "$d/$op.txt" | tail -n 1 | sed 's/.*| *//')
    runs_txt=$(awk '/^Wall clock +\| +Throughput/{f=1;next} f&&/^=+/{if(n)exit} f&&/\|/{n++; split($0,a,"|"); gsub(/ +$/,"",a[1]); printf "%s; ", a[1]}' "$d/$op.txt")
    bw=$(grep -E '^\([0-9],[0-9]\)' "$d/$op.txt" | sed 's/ *| */ /' | tr '\n' ';')
    rmmline=$(grep -c "RMM already setup on external cluster" "$d/$op.txt")
    summary "$v $op rc=$rc took=$(( $(date +%s) - to ))s wall=[$wall] runs=[$runs_txt] p2p(25/50/75%)=[$bw] rmm-already-setup-line=$rmmline"
  done
  timeout -k 5 60 python3 "$STATE_PY" "$sf" "$d/state-after.json" >> "$d/state.err" 2>&1
  kill_group "$wpid"; kill_group "$spid"
  sleep 1
done

echo "== total $(( $(date +%s) - t0 )) s"
echo "== dask processes left (should be none):"; pgrep -af 'dask (scheduler|worker|cuda)' || true
rm -f "$STATE_PY"
# the device tool brings back only a few files: everything in one archive, the summary beside it
( cd "$OUT" && tar czf all.tgz --exclude=all.tgz --warning=no-file-changed . ; find . -mindepth 1 -maxdepth 1 ! -name all.tgz ! -name summary.txt -exec rm -rf {} + )

#!/usr/bin/env bash
# Second GPU call of the shapes round (one call, at most ~9 minutes), what it decides:
#   1. the workload suite's gpudask forms with the new transport/memory rules (the "after"; compared
#      with the recorded stock + dask-cuda rows of lab/device-runs/2026-12-01-workloads-h200-second.jsonl);
#   2. the client/scheduler UCX_CUDA_IPC_CACHE question: the shapes whose client paths were slower
#      (local, one-command-2w) with the cache on, and the suite's restart workflow with it on;
#   3. the offload lever through the plan (gpudask.comm.offload-threshold) in lab/bench/pull-levers.py.
# Here: ../shared/device/wheels.sh; then run(command="bash lab/bench/device-shapes-levers.sh", carry=[".whl"])
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/shapes-levers-out}
mkdir -p "$OUT/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} PATH=/tmp/site/bin:$PATH \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
left() { echo $(( ${TOTAL_S:-540} - ($(date +%s) - t0) )); }
strays() { pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null; sleep 1; }
{
echo "== install $(( $(date +%s) - t0 )) s"
# 1. the workload suite, gpudask forms, default plan
w=/tmp/wl-default; rm -rf $w; mkdir -p $w
for spec in processes:110 local:90; do
  form=${spec%%:*}; budget=${spec##*:}
  echo "=== form $form"
  timeout -k 5 $((budget + 20)) python3 -m tests.workloads.run --form "$form" --protocol ucx --array cupy \
    --out "$w" --timeout 45 --budget "$budget" 2>&1 | tail -n 20
  strays
done
cp $w/results.jsonl "$OUT/workloads-after.jsonl"
grep '"form": "dask-cuda"' lab/device-runs/2026-12-01-workloads-h200-second.jsonl >> $w/results.jsonl
echo "=== compare (gpudask forms now, stock + dask-cuda rows recorded earlier today)"
python3 -m tests.workloads.compare $w/results.jsonl 2>&1 | tail -n 25
echo "== suite done $(( $(date +%s) - t0 )) s"

# 2. the IPC cache on in the client and scheduler: the restart workflow, and the client-path shapes
w2=/tmp/wl-cache; rm -rf $w2; mkdir -p $w2
UCX_CUDA_IPC_CACHE=y timeout -k 5 90 python3 -m tests.workloads.run --form local --protocol ucx --array cupy \
  --out "$w2" --timeout 45 --budget 70 --workflows restart,compute,submit_arg 2>&1 | tail -n 8
cp $w2/results.jsonl "$OUT/workloads-ipc-cache-on.jsonl" 2>/dev/null
strays
b=$(( $(left) - 200 )); [ "$b" -gt 160 ] && b=160
echo "== shapes with UCX_CUDA_IPC_CACHE=y, budget $b s"
UCX_CUDA_IPC_CACHE=y timeout -k 10 $(( b + 30 )) python3 lab/bench/shapes.py --out "$OUT/shapes-ipc-cache" --work /tmp/shapes-work \
    --max-seconds "$b" --shapes local,one-command-2w 2>&1 | grep --line-buffered -v "UCX  WARN" | grep -v "^--"
strays
# 3. the offload lever through the plan
l=$(( $(left) - 20 ))
echo "== levers, budget $l s"
[ "$l" -gt 60 ] && timeout -k 10 "$l" python3 lab/bench/pull-levers.py --out "$OUT/logs/levers" --array cupy \
    --configs gpudask,plan-offload-off,plan-offload-512MiB,dask-cuda --repeat 15 --max-seconds $(( l - 10 )) 2>&1 \
    | grep --line-buffered -v "UCX  WARN"
cp "$OUT/logs/levers/pull-levers.jsonl" "$OUT/levers.jsonl" 2>/dev/null
strays
echo "== all done after $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$OUT/console.txt"
tar -czf "$OUT/logs.tgz" -C /tmp wl-default wl-cache shapes-work 2>/dev/null; rm -rf "$OUT/logs"
true

#!/usr/bin/env bash
# Issue 39's evidence in one device call (at most 9.5 minutes): lab/bench/gpu_less_scheduler.py (the seed
# example, the 256 MiB data-in-graph paths, the scheduler's GPU memory; a GPU-less gpudask scheduler, a
# GPU one and stock + dask cuda worker), then the workload suite (CuPy over UCX) on a GPU-less scheduler
# (gpudask client, plain client), on a GPU scheduler and on the dask-cuda reference, compared.
# Here, once: ../shared/device/wheels.sh ; then run(command="bash lab/bench/device-gpu-less-scheduler.sh", carry=[".whl"])
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/gpu-less-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || { echo "install failed"; exit 1; }
export PATH=/tmp/site/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/console.txt"
echo "== installed after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/console.txt"
timeout -k 5 ${PATHS_S:-260} python3 lab/bench/gpu_less_scheduler.py "$OUT/gpu-less" --reps ${REPS:-5} --mib 256 \
  > "$OUT/gpu-less.txt" 2>&1
echo "== gpu_less_scheduler.py: exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/console.txt"
cp "$OUT/gpu-less/records.jsonl" "$OUT/records.jsonl" 2>/dev/null
pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null
work=/tmp/workloads-run; rm -rf "$work"; mkdir -p "$work"
for spec in ${FORMS:-"processes no gpudask 75" "processes no plain 75" "processes yes plain 70" "dask-cuda yes plain 70"}; do
  set -- $spec
  left=$(( ${TOTAL_S:-560} - ($(date +%s) - t0) ))
  [ "$left" -lt 30 ] && { echo "== no time left for $spec" | tee -a "$OUT/console.txt"; continue; }
  budget=$(( $4 < left - 15 ? $4 : left - 15 ))
  timeout -k 5 $((budget + 15)) python3 -m tests.workloads.run --form "$1" --scheduler-gpu "$2" --client "$3" \
    --protocol ucx --array cupy --out "$work" --timeout 40 --budget "$budget" >> "$OUT/workloads.txt" 2>&1
  echo "== workloads $spec: exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/console.txt"
  pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null
done
python3 -m tests.workloads.compare "$work/results.jsonl" > "$OUT/compare.txt" 2>&1
cp "$work/results.jsonl" "$OUT/workloads.jsonl" 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "$OUT" gpu-less -C /tmp workloads-run 2>/dev/null
rm -rf "$OUT/gpu-less"
echo "== done after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/console.txt"

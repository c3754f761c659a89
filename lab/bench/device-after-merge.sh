#!/usr/bin/env bash
# One device call (at most 9.5 minutes) after the round's branches are merged: the GPU tests of what
# changed (pools through restarts beside dask cuda worker, the GPU-less scheduler, UCX transports), the
# workload suite (CuPy over UCX: a GPU-less scheduler with a gpudask client, a GPU scheduler with a plain
# client, stock + dask cuda worker; compared) and the ready time beside dask-cuda with its profile.
# Here, once: ../shared/device/wheels.sh ; then run(command="bash lab/bench/device-after-merge.sh", carry=[".whl"])
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/after-merge-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench \
  || { echo "install failed"; exit 1; }
export PATH=/tmp/site/bin:$PATH GPUDASK_TEST_LOGS="$OUT/logs/tests"
say() { echo "== $* after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/console.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/console.txt"
timeout -k 10 ${TESTS_S:-270} python3 -m pytest -o addopts= -m gpu -v -rA --tb=short --timeout 200 -p no:cacheprovider \
  --junitxml="$OUT/gpu-tests.xml" ${GPU_TESTS:-tests/test_rmm_restarts_gpu.py tests/test_scheduler_relay.py tests/test_checks.py} \
  -s > "$OUT/gpu-tests.txt" 2>&1
say "GPU tests: exit $?"
grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$OUT/gpu-tests.txt" | grep "::" | sed 's/ *\[ *[0-9]*%\]//' | sort -u | tee -a "$OUT/console.txt"
pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null
work=/tmp/workloads-run; rm -rf "$work"; mkdir -p "$work"
for spec in ${FORMS:-"processes no gpudask 60" "processes yes plain 60" "dask-cuda yes plain 60"}; do
  set -- $spec
  left=$(( ${WORK_END_S:-470} - ($(date +%s) - t0) ))
  [ "$left" -lt 30 ] && { say "no time left for workloads $spec"; continue; }
  budget=$(( $4 < left - 15 ? $4 : left - 15 ))
  timeout -k 5 $((budget + 15)) python3 -m tests.workloads.run --form "$1" --scheduler-gpu "$2" --client "$3" \
    --protocol ucx --array cupy --out "$work" --timeout 40 --budget "$budget" >> "$OUT/workloads.txt" 2>&1
  say "workloads $spec: exit $?"
  pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null
done
python3 -m tests.workloads.compare "$work/results.jsonl" > "$OUT/compare.txt" 2>&1; say "compare: exit $?"
cp "$work/results.jsonl" "$OUT/workloads.jsonl" 2>/dev/null
left=$(( ${TOTAL_S:-555} - ($(date +%s) - t0) - 15 ))
if [ "$left" -gt 40 ]; then
  timeout -k 5 "$left" gpudask bench --configs dask-cuda,gpudask --profile --repeat 3 --spill-limit 0 \
    --max-seconds $(( left - 10 )) --json > "$OUT/bench.json" 2> "$OUT/bench.err"; say "bench: exit $?"
fi
pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "$OUT" logs -C /tmp workloads-run 2>/dev/null; rm -rf "$OUT/logs"
say done

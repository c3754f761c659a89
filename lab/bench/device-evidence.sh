#!/usr/bin/env bash
# The GPU evidence in one device call (at most 9 minutes): every GPU test, each in its own
# time box with junit XML written as it goes, then `gpudask bench` (gpudask, dask-cuda and the
# raw-ucxx ceiling, with the in-worker pull figure), then the pull levers with what is left.
# The workload suite has its own call: tests/workloads/run-on-device.sh.
#
# Here, once:   ../shared/device/wheels.sh      (dask-cuda, nvtx and pytest-timeout included)
# Then:         run(command="bash lab/bench/device-evidence.sh", carry=[".whl"])
# Back in $OUT (at most 8 files): gpu-tests.xml gpu-tests.txt bench.json bench.txt
#               levers.jsonl console.txt logs.tgz
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/gpudask-evidence}
mkdir -p "$OUT/logs"
TOTAL_S=${TOTAL_S:-530}
TESTS_S=${TESTS_S:-240}
BENCH_S=${BENCH_S:-210}
left() { echo $(( TOTAL_S - ($(date +%s) - t0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} PATH=/tmp/site/bin:$PATH \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n GPUDASK_TEST_LOGS="$OUT/logs/tests"
strays() { pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null; sleep 1; }
{
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "== install $(( $(date +%s) - t0 )) s"

# 1. the GPU tests (the workload suite's all-forms test runs in its own call); TESTS_S=0: none
[ "$TESTS_S" -gt 0 ] && timeout -k 10 "$TESTS_S" python3 -m pytest -o addopts= -m gpu -v -rA --tb=short --timeout 100 -p no:cacheprovider \
    --junitxml="$OUT/gpu-tests.xml" --deselect tests/test_workloads.py::test_cupy_workflows_agree_across_all_three_forms \
    tests > "$OUT/gpu-tests.txt" 2>&1
echo "== GPU tests: exit $? after $(( $(date +%s) - t0 )) s"
grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$OUT/gpu-tests.txt" | grep "::" | sed 's/ *\[ *[0-9]*%\]//' | sort | uniq
tail -n 3 "$OUT/gpu-tests.txt"
strays

# 2. the bench: gpudask beside dask-cuda, raw ucxx as the ceiling
b=$(( $(left) - 90 )); [ "$b" -gt "$BENCH_S" ] && b=$BENCH_S
if [ "$b" -gt 60 ]; then
    timeout -k 15 $(( b + 30 )) python3 -m gpudask.cli bench --json --max-seconds "$b" --profile --repeat 3 \
        --configs gpudask,dask-cuda,raw-ucxx --spill-limit 2GB --log-dir "$OUT/logs/bench" \
        --table-file "$OUT/bench.txt" > "$OUT/bench.json" 2> "$OUT/logs/bench.err"
    echo "== bench: exit $? after $(( $(date +%s) - t0 )) s"
    cat "$OUT/bench.txt" 2>/dev/null || tail -n 40 "$OUT/logs/bench.err"
fi
strays

# 3. the pull levers (a fresh cluster per lever), with what is left
l=$(( $(left) - 15 ))
if [ "$l" -gt 45 ]; then
    timeout -k 10 "$l" python3 lab/bench/pull-levers.py --out "$OUT/logs/levers" --array cupy --breakdown \
        --configs "${LEVERS:-gpudask,polling,offload-off,polling-offload-off,dask-cuda,thread-polling,rndv-get,proto-v1}" \
        --repeat 10 --max-seconds $(( l - 10 )) 2>&1 | grep --line-buffered -v "UCX  WARN"
    cp "$OUT/logs/levers/pull-levers.jsonl" "$OUT/levers.jsonl" 2>/dev/null
fi
strays
echo "== all done after $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$OUT/console.txt"
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"

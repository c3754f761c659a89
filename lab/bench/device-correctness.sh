#!/usr/bin/env bash
# The correctness evidence in one device call (at most 9 minutes): the workload suite in its
# three forms (gpudask processes, LocalGPUCluster, stock + dask cuda worker; CuPy over UCX),
# then every GPU test (the suite's own all-forms test aside: the suite just ran), each in its
# own time box, junit XML written as they go.
# Here, once: ../shared/device/wheels.sh ; then run(command="bash lab/bench/device-correctness.sh", carry=[".whl"])
# Back in $OUT: run.txt results.jsonl (the suite), gpu-tests.xml gpu-tests.txt, console.txt, logs.tgz
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/gpudask-correctness}
mkdir -p "$OUT"
export WORKLOAD_FORMS=${WORKLOAD_FORMS:-processes:130 local:100 dask-cuda:130}
bash tests/workloads/run-on-device.sh > "$OUT/console.txt" 2>&1
echo "== workload suite: exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/console.txt"
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} PATH=/tmp/site/bin:$PATH
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n GPUDASK_TEST_LOGS="$OUT/logs/tests"
pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null
left=$(( ${TOTAL_S:-530} - ($(date +%s) - t0) ))
if [ "$left" -gt 40 ]; then
  timeout -k 10 "$left" python3 -m pytest -o addopts= -m gpu -v -rA --tb=short --timeout 90 -p no:cacheprovider \
      --junitxml="$OUT/gpu-tests.xml" --deselect tests/test_workloads.py::test_cupy_workflows_agree_across_all_three_forms \
      ${GPU_TESTS:-tests} > "$OUT/gpu-tests.txt" 2>&1
  echo "== GPU tests: exit $? after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/console.txt"
  grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$OUT/gpu-tests.txt" | grep "::" | sed 's/ *\[ *[0-9]*%\]//' | sort | uniq | tee -a "$OUT/console.txt"
fi
pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null
mkdir -p "$OUT/logs"; mv "$OUT/logs.tar.gz" "$OUT/logs/workloads-logs.tar.gz" 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
tail -n 40 "$OUT/console.txt"

#!/usr/bin/env bash
# One device call (at most 9.5 minutes): ready time beside dask-cuda with the plan made ahead
# (default), then with gpudask.start.plan-ahead false on the gpudask side (the lever), each run
# with its profile; then the GPU tests of process start (plan once, start methods).
# Here: ../shared/device/wheels.sh ; run(command="bash lab/bench/device-plan-ahead.sh", carry=[".whl"])
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} PATH=/tmp/site/bin:$PATH \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
python3 -m compileall -q -j 0 gpudask plugins contrib/gpudask-bench gpudask_forkserver.py /tmp/site >/dev/null 2>&1
say() { echo "== $* after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/console.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/console.txt"
bench() {  # NAME SECONDS REPEAT [more bench args]
  local name=$1 s=$2 r=$3; shift 3
  timeout -k 10 "$s" python3 -m gpudask.cli bench --configs dask-cuda,gpudask --nworkers 2 --profile \
     --repeat "$r" --spill-limit 0 --pulls 3 --max-seconds $(( s - 20 )) --json "$@" \
     --log-dir "$OUT/logs-$name" --table-file "$OUT/bench-$name.txt" > "$OUT/bench-$name.json" 2> "$OUT/bench-$name.err"
  say "bench $name: exit $?"
  python3 - "$OUT/bench-$name.json" <<'PY' | tee -a "$OUT/console.txt"
import json, sys
d = json.load(open(sys.argv[1]))
for c in d.get("configs", []):
    prof = c.get("profile") or {}
    print(c.get("name"), "ready", json.dumps(c.get("ready_s") or c.get("ready")), json.dumps(prof.get("median_s_after_launch")))
PY
  pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null; pkill -9 -f "[f]orkserver" 2>/dev/null
}
bench ahead ${AHEAD_S:-200} ${AHEAD_REPEAT:-4}
[ "${LEVER_S:-150}" -gt 0 ] && bench no-ahead ${LEVER_S:-150} ${LEVER_REPEAT:-3} --config-env gpudask:DASK_GPUDASK__START__PLAN_AHEAD=false  # LEVER_S=0: none
left=$(( ${TOTAL_S:-560} - ($(date +%s) - t0) ))
if [ "$left" -gt 60 ]; then
  GPUDASK_TEST_LOGS="$OUT/logs-tests" timeout -k 10 "$left" python3 -m pytest -o addopts= -m gpu -v -rA --tb=short \
    --timeout 150 -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml" tests/test_plan_once.py \
    tests/test_plugins_process_start_cluster.py > "$OUT/gpu-tests.txt" 2>&1
  say "GPU tests: exit $?"
  grep -E "(PASSED|FAILED|ERROR|SKIPPED)" "$OUT/gpu-tests.txt" | grep "::" | sed 's/ *\[ *[0-9]*%\]//' | sort -u | tee -a "$OUT/console.txt"
fi
pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls -d logs-* 2>/dev/null) 2>/dev/null; rm -rf "$OUT"/logs-*
say done

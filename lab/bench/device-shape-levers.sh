#!/usr/bin/env bash
# Levers on the shape matrix, in one device call: lab/bench/shapes.py run once per line of LEVERS, each a fresh
# pair of clusters (gpudask side beside dask-cuda side, alternated as usual), so that a cell that differs
# between the sides can be taken apart one setting at a time, with the spread of repeated runs in view.
#
# Here, once:   ../shared/device/wheels.sh
# Then:         run(command="bash lab/bench/device-shape-levers.sh", carry=[".whl"], timeout_s=600)
# LEVERS:       one run per line: NAME|SHAPES|OUTER ENV (KEY=VALUE ..., for both sides)|MORE lab/bench/shapes.py ARGS
#               (e.g. --gpudask-env DASK_GPUDASK__RMM__POOL_SIZE=false: the gpudask side only).  Default: below.
# SIZES:        default 1MiB.  TOTAL_S: the whole call (default 540).  SHAPE_S: seconds given to each shape of a
#               run (default 35: enough at 1 MiB; more for larger sizes).
# Back in $OUT: levers.jsonl (every row of every run, with "lever" and "run"), summary.txt (one line per cell and
#               run: the two medians and their ratio), console.txt, logs-<NAME>.tgz for runs named proto-* (worker
#               logs, e.g. with UCX_PROTO_INFO=y).
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/shape-levers-out}
WORK=/tmp/shape-levers-work
mkdir -p "$OUT" "$WORK"
TOTAL_S=${TOTAL_S:-540}
SIZES=${SIZES:-1MiB}
SHAPE_S=${SHAPE_S:-35}
POOL_OFF="--gpudask-env DASK_GPUDASK__RMM__POOL_SIZE=false"
CUPY_OWN="--gpudask-env DASK_GPUDASK__RMM__LIBRARIES=[]"
LEVERS=${LEVERS:-"base-1|ucx-tls-all||
pool-off-1|ucx-tls-all||$POOL_OFF
cupy-own-pool-1|ucx-tls-all||$CUPY_OWN
local-base-1|local||
local-pool-off-1|local||$POOL_OFF
pool-off-2|ucx-tls-all||$POOL_OFF
base-2|ucx-tls-all||
cupy-own-pool-2|ucx-tls-all||$CUPY_OWN
local-pool-off-2|local||$POOL_OFF
local-base-2|local||
proto-base|ucx-tls-all|UCX_PROTO_INFO=y|"}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} PATH=/tmp/site/bin:$PATH \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
n_runs=$(printf '%s\n' "$LEVERS" | grep -c .)
{
echo "== install $(( $(date +%s) - t0 )) s; $n_runs runs, sizes $SIZES"
i=0
while IFS='|' read -r name shapes outer extra; do
  [ -z "$name" ] && continue
  i=$((i + 1))
  left=$(( TOTAL_S - ($(date +%s) - t0) - 15 ))
  # lab/bench/shapes.py keeps 25 s of its budget for the last side's teardown; each shape then needs about
  # SHAPE_S (two clusters ready in 10-14 s, four 1 MiB cells); a run that cannot have that is skipped
  n_shapes=$(( $(tr -cd ',' <<< "$shapes" | wc -c) + 1 ))
  b=$(( 25 + SHAPE_S * n_shapes ))
  if [ "$left" -lt "$b" ]; then echo "== $name: skipped, $left s left (needs $b)"; continue; fi
  echo "== $name: $shapes ${outer:+[$outer]} $extra (budget $b s)"
  rm -rf "$WORK/$name"; mkdir -p "$WORK/$name"
  # shellcheck disable=SC2086  # outer and extra are lists of words
  env $outer timeout -k 10 $(( b + 30 )) python3 lab/bench/shapes.py --out "$WORK/$name/out" --work "$WORK/$name/work" \
      --max-seconds "$b" --shapes "$shapes" --sizes "$SIZES" $extra 2>&1 | grep --line-buffered -v "UCX  WARN" | tail -n 12
  python3 - "$WORK/$name/out/shapes.json" "$name" "$i" "$OUT/levers.jsonl" "$OUT/summary.txt" <<'PY'
import json, sys
src, name, run, jsonl, summary = sys.argv[1:]
try:
    rows = json.load(open(src))
except (OSError, ValueError) as e:
    print(f"   {name}: no rows ({type(e).__name__})"); sys.exit(0)
with open(jsonl, "a") as j, open(summary, "a") as s:
    for r in rows:
        if "meta" in r:  # the run's versions, machine and arguments, for lab/bench/shapes_pool.py
            j.write(json.dumps({"lever": name, "run": int(run), **r}) + "\n")
        if "shape" not in r:
            continue
        j.write(json.dumps({"lever": name, "run": int(run), **r}) + "\n")
        line = (f"{name:20} {r['shape']:14} {r['path']:21} {r['size']:6} "
                f"{r.get('gpudask_s') or float('nan'):9.5f} {r.get('dask-cuda_s') or float('nan'):9.5f} "
                f"{r.get('ratio') or float('nan'):6.3f} match={r.get('result_match')}")
        s.write(line + "\n"); print("   " + line)
PY
  case "$name" in proto-*) tar -czf "$OUT/logs-$name.tgz" -C "$WORK/$name" work 2>/dev/null;; esac
  pkill -9 -f "[d]ask (scheduler|worker|cuda)" 2>/dev/null; sleep 1
done <<< "$LEVERS"
echo "== all done after $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$OUT/console.txt"
true

#!/usr/bin/env bash
# Start-up on the GPU machine: the parts of a worker's start, then ready time beside dask-cuda.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} PATH=/tmp/site/bin:$PATH \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
python3 -m compileall -q -j 0 gpudask plugins contrib/gpudask-bench gpudask_forkserver.py /tmp/site >/dev/null 2>&1; env | grep -i bytecode
if [ "${PARTS:-1}" = 1 ]; then
  timeout 200 python3 lab/bench/startup_parts.py > "$OUT/parts.jsonl" 2> "$OUT/parts.err"; cat "$OUT/parts.jsonl"
fi
timeout -k 10 ${BENCH_S:-200} python3 -m gpudask.cli bench --configs dask-cuda,gpudask --nworkers 2 --profile \
   --repeat ${REPEAT:-3} --spill-limit 0 --pulls 3 --max-seconds $(( ${BENCH_S:-200} - 20 )) --json \
   --log-dir "$OUT/logs" --table-file "$OUT/bench.txt" > "$OUT/bench.json" 2> "$OUT/bench.err"
echo "bench rc $?"; cat "$OUT/bench.txt"; tail -5 "$OUT/bench.err"
python3 - "$OUT/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d.get("configs", []):
    print(c.get("name"), json.dumps((c.get("profile") or {}).get("median_s_after_launch")))
PY
pgrep -af 'dask|forkserver' | grep -v pgrep | head; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader

#!/usr/bin/env bash
# On the GPU machine, one device call: lab/bench/pull-levers.py over every configuration (pull
# breakdown included), then the raw-ucxx ceiling from gpudask bench.  Results land in $OUT as
# they go: pull-levers.jsonl, raw.json/raw.txt, console.txt.
# Here first: ../shared/device/wheels.sh; then run(command="bash lab/bench/device-pull-levers.sh", carry=[".whl"]).
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/pull-levers-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} PATH=/tmp/site/bin:$PATH \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
echo "install $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout -k 10 ${LEVERS_S:-380} python3 lab/bench/pull-levers.py --out "$OUT" --array cupy --breakdown \
   --configs "${LEVERS:-gpudask,dask-cuda,polling,thread-polling,thread,thread-no-delayed,thread-python-future,offload-off,polling-offload-off,rndv-get,rndv-put,proto-v1,dask-cuda-polling}" \
   --max-seconds $(( ${LEVERS_S:-380} - 20 )) 2>&1 | grep --line-buffered -v "UCX  WARN" | tee "$OUT/console.txt"
echo "levers done at $(( $(date +%s) - t0 )) s"
timeout -k 10 100 python3 -m gpudask.cli bench --configs raw-ucxx --nworkers 2 --json --max-seconds 80 \
   --table-file "$OUT/raw.txt" > "$OUT/raw.json" 2> "$OUT/raw.err"
cat "$OUT/raw.txt" 2>/dev/null | head -30
echo "all done at $(( $(date +%s) - t0 )) s"
pgrep -af 'dask (scheduler|worker|cuda)' && pkill -9 -f 'dask (scheduler|worker|cuda)'
true

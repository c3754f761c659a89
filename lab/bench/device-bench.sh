#!/usr/bin/env bash
# `gpudask bench` on the GPU machine in one device call (issue 30 item 3, at most ~9 minutes):
# gpudask beside dask-cuda (two workers sharing the GPU each, fresh clusters) and the raw-ucxx
# ceiling -- ready (3 launches after a warm-up), the in-worker pull (pull_1MB_s, pull_64MB_s,
# pull_1GB_s: 3 warm-ups, then 20), end-to-end transfers, (x + x.T).sum(), and dask-cuda's own
# local_cupy (transpose_sum, dot, slice; 20000^2, chunks 2000, --disable-rmm) on both sides.
#
# Here, once:   ../shared/device/wheels.sh            (dask-cuda and nvtx included)
# Then:         run(command="bash lab/bench/device-bench.sh", carry=[".whl"], timeout_s=600)
# Back in $OUT: bench.json (commit as lab/device-runs/<date>-bench-h200.json), bench.txt (the table),
#               console.txt, logs.tgz (every process's log, local_cupy's full output per side).
# Knobs (environment):
#   TOTAL_S          the whole call (default 520); the bench gets what is left less 40 s
#   GPUDASK_SIDE_ENV extra environment for the gpudask configuration's processes only, e.g.
#                    "DASK_DISTRIBUTED__COMM__OFFLOAD=False UCXPY_PROGRESS_MODE=polling"
#   DASK_CUDA_SIDE_ENV  the same for the dask-cuda configuration (to give it the same levers)
#   CONFIGS          default gpudask,dask-cuda,raw-ucxx;  REPEAT (default 3);  PULLS (default 20)
#   SPILL            --spill-limit (default 0: no spill launch, it costs ~1 minute a side)
#   EXTRA            more `gpudask bench` arguments
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/gpudask-bench-out}
mkdir -p "$OUT/logs"
TOTAL_S=${TOTAL_S:-520}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} PATH=/tmp/site/bin:$PATH \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
side_env=()
for kv in ${GPUDASK_SIDE_ENV:-}; do side_env+=(--config-env "gpudask:$kv"); done
for kv in ${DASK_CUDA_SIDE_ENV:-}; do side_env+=(--config-env "dask-cuda:$kv"); done
{
echo "== install $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
python3 -c "import nvtx, dask_cuda" 2>/dev/null || echo "WARNING: dask-cuda or nvtx missing: no local_cupy figures"
[ ${#side_env[@]} -gt 0 ] && echo "== side environment: ${side_env[*]}"
# what is left, less 40 s for the last teardown, the logs and the way back
b=$(( TOTAL_S - ($(date +%s) - t0) - 40 ))
echo "== bench budget $b s"
timeout -k 15 $(( b + 25 )) python3 -m gpudask.cli bench --json --max-seconds "$b" --repeat "${REPEAT:-3}" \
    --pulls "${PULLS:-20}" --configs "${CONFIGS:-gpudask,dask-cuda,raw-ucxx}" --spill-limit "${SPILL:-0}" \
    ${side_env[@]+"${side_env[@]}"} --log-dir "$OUT/logs/bench" --table-file "$OUT/bench.txt" ${EXTRA:-} \
    > "$OUT/bench.json.tmp" 2> >(grep --line-buffered -v "UCX  WARN" | tee "$OUT/logs/bench.err" >&2)
rc=$?
echo "== bench: exit $rc after $(( $(date +%s) - t0 )) s"
# the JSON only when it is whole (a killed bench prints nothing; its progress is in console.txt)
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$OUT/bench.json.tmp" 2>/dev/null \
    && mv "$OUT/bench.json.tmp" "$OUT/bench.json" || mv "$OUT/bench.json.tmp" "$OUT/logs/bench.json.partial"
cat "$OUT/bench.txt" 2>/dev/null || echo "no table (see the progress above)"
# anything the bench could not stop (it kills its own process groups; this is the backstop)
pgrep -af "[d]ask (scheduler|worker|cuda)" && pkill -9 -f "[d]ask (scheduler|worker|cuda)"
nvidia-smi --query-gpu=memory.used --format=csv,noheader
echo "== all done after $(( $(date +%s) - t0 )) s"
} 2>&1 | tee "$OUT/console.txt"
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
ls -la "$OUT"
true

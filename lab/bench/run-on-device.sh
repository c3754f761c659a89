#!/usr/bin/env bash
# `gpudask bench` on the GPU machine (one H200): the whole device command.
#
# Here, from the project root, once:   ../shared/device/wheels.sh      (dask-cuda included)
# Then with the device tool:           run(command="bash lab/bench/run-on-device.sh", carry=[".whl"])
#
# About 8 minutes in all (the device call limit is 10): installing takes what it takes,
# the bench gets the rest of BENCH_TOTAL_S as its --max-seconds and skips, with a note,
# whatever does not fit.  Everything lands in $OUT:
#   bench.json  the results (gpudask bench --json)     bench.txt  the same as a table
#   bench.err   progress and errors                     logs/      every process's log
#   gpu-before.txt / gpu-after.txt                      nvidia-smi around the run
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/gpudask-bench-out}
mkdir -p "$OUT"
BENCH_TOTAL_S=${BENCH_TOTAL_S:-470}

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n

nvidia-smi > "$OUT/gpu-before.txt" 2>&1
budget=$(( BENCH_TOTAL_S - ($(date +%s) - t0) ))
echo "install took $(( $(date +%s) - t0 )) s; bench time box ${budget} s"

# SIGTERM 30 s after the bench's own time box (the bench then reports what it measured
# and kills its clusters), SIGKILL 15 s later
timeout -k 15 $(( budget + 30 )) python3 -m gpudask.cli bench \
    --configs tcp,ucx-stock,gpudask,dask-cuda,raw-ucxx --nworkers 2 --json \
    --max-seconds "$budget" --profile --ucx-proto-info \
    --log-dir "$OUT/logs" --table-file "$OUT/bench.txt" \
    > "$OUT/bench.json" 2> "$OUT/bench.err"
rc=$?

nvidia-smi > "$OUT/gpu-after.txt" 2>&1
echo "== bench exit status $rc after $(( $(date +%s) - t0 )) s"
cat "$OUT/bench.txt" 2>/dev/null || tail -n 60 "$OUT/bench.err"
echo "== processes on the GPU after the run (should be none):"
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1
echo "== dask processes left (should be none):"
pgrep -af 'dask (scheduler|worker|cuda)' || true
exit $rc

#!/usr/bin/env bash
# The shape matrix (issue 29 item 4) on the GPU machine, in one device call of at most ~9 minutes:
# lab/bench/shapes.py over every shape, each gpudask form started with its dask-cuda form, their repetitions
# alternated; gpudask info (the probed facts and the plan) first, into info*.
#
# Here, once:   ../shared/device/wheels.sh            (dask-cuda, distributed-ucxx, rmm ... into .whl/)
# Then:         run(command="bash lab/bench/device-shapes.sh", carry=[".whl"], timeout_s=600)
# Back in $OUT: shapes.json (one run's rows: pool runs -- fresh pairs of clusters, one call each -- with
#               lab/bench/shapes_pool.py into lab/device-runs/<date>-shapes-h200.json), shapes.jsonl (as it
#               went), console.txt, logs.tgz (every cluster's logs, each side's console).
# Knobs (environment): TOTAL_S (default 540: the whole call), SHAPES (default: all), SIZES, EXTRA (more
#               arguments for lab/bench/shapes.py, e.g. "--dask-cuda-worker-args=--rmm-pool-size=8GB").
set -u
t0=$(date +%s)
OUT=${OUT:-/tmp/shapes-out}
WORK=/tmp/shapes-work
mkdir -p "$OUT" "$WORK"
TOTAL_S=${TOTAL_S:-540}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} PATH=/tmp/site/bin:$PATH \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
python3 -m compileall -q -j 0 /tmp/site gpudask plugins gpudask_forkserver.py >/dev/null 2>&1  # bytecode, as a pip install has it
{
echo "== install $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
# what gpudask reads of this host (the facts probes: NVML, sysfs, ucx_info) and plans, on the real GPU
timeout 60 gpudask info --protocol ucx --reasons > "$OUT/info-reasons.txt" 2>&1; echo "== gpudask info rc $?"
timeout 60 gpudask info --protocol ucx --json > "$OUT/info.json" 2>&1; echo "== gpudask info --json rc $?"
# what is left, less 25 s for the last side's kill, the logs and the way back
b=$(( TOTAL_S - ($(date +%s) - t0) - 25 ))
[ "$b" -gt 500 ] && b=500
echo "== shapes budget $b s"
timeout -k 10 $(( b + 30 )) python3 lab/bench/shapes.py --out "$OUT" --work "$WORK" --max-seconds "$b" \
    ${SHAPES:+--shapes "$SHAPES"} ${SIZES:+--sizes "$SIZES"} ${EXTRA:-} 2>&1 | grep --line-buffered -v "UCX  WARN"
echo "== shapes: exit ${PIPESTATUS[0]} after $(( $(date +%s) - t0 )) s"
# anything lab/bench/shapes.py started and could not stop (it kills by pid, after each cluster, what carries its
# run id in its environment; this is the same, for any run id)
python3 - <<'PY'
import os, signal, psutil
for p in psutil.process_iter(["pid", "cmdline"]):
    try:
        if p.pid != os.getpid() and "SHAPES_BENCH_RUN" in p.environ():
            print("stray", p.pid, " ".join(p.info["cmdline"] or [])[:150]); p.send_signal(signal.SIGKILL)
    except psutil.Error:
        pass
PY
nvidia-smi --query-gpu=memory.used --format=csv,noheader
} 2>&1 | tee "$OUT/console.txt"
tar -czf "$OUT/logs.tgz" -C "$WORK" --exclude='dask-scratch-space' --exclude='*.json.tmp' . 2>/dev/null
ls -la "$OUT"
true

#!/usr/bin/env bash
# Reproduce the GPU-less scheduler failure over UCX (issue 6), with and without gpudask.
# Device machine: run(command="bash lab/bench/gpu-less-scheduler-repro.sh", carry=[".whl"]).
set -u
OUT=${OUT:-/tmp/repro-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
for mode in stock gpudask; do
  pre=(); [ $mode = gpudask ] && pre=(--preload gpudask)
  rm -f /tmp/s-$mode.json
  CUDA_VISIBLE_DEVICES="" timeout 150 python3 -m dask scheduler --protocol ucx --port 0 --no-dashboard \
      --scheduler-file /tmp/s-$mode.json "${pre[@]}" > "$OUT/scheduler-$mode.log" 2>&1 &
  spid=$!
  while [ ! -f /tmp/s-$mode.json ]; do sleep 0.2; done
  timeout 140 python3 -m dask worker --scheduler-file /tmp/s-$mode.json --no-dashboard --death-timeout 30 \
      --preload gpudask > "$OUT/worker-$mode.log" 2>&1 &
  wpid=$!
  timeout 120 python3 - "$mode" > "$OUT/client-$mode.log" 2>&1 <<'PY'
import sys, cupy, dask.array as da
from distributed import Client
mode = sys.argv[1]
c = Client(scheduler_file=f"/tmp/s-{mode}.json", timeout=60)
c.wait_for_workers(1, timeout=60)
if mode == "gpudask":
    import gpudask
    for f in gpudask.check(c)["findings"]:
        print(f"finding: {f['severity']} {f['code']} [{f['plugin']}] {f['subject']} vs {f['reference']}: {f['message']}")
x = da.random.random((4000, 4000), chunks=(1000, 4000)).map_blocks(cupy.asarray, dtype="f8")
try:
    r = c.compute(x.sum(axis=0)).result(timeout=45)
    print("no failure:", type(r))
except Exception as e:
    print("client saw:", type(e).__name__, str(e)[:300])
c.close(timeout=5)
PY
  kill $wpid $spid 2>/dev/null; sleep 2; kill -9 $wpid $spid 2>/dev/null
  echo "===== $mode: client"; cat "$OUT/client-$mode.log" | tail -8
  echo "===== $mode: scheduler (errors, first 12 distinct)"
  grep -iE "error|cuda|exception|gpudask" "$OUT/scheduler-$mode.log" | sed -E 's/^[0-9-]+ [0-9:,]+ //' | awk '!seen[$0]++' | head -12
done

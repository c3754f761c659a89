#!/usr/bin/env bash
# The workload suite on the GPU machine: CuPy over UCX in the three forms (gpudask
# processes, gpudask LocalGPUCluster, stock dask scheduler + dask cuda worker), compared.
# Needs the wheels in .whl/ (as .ci/gpu-on-device.sh); at most 8 minutes in all.
# Usage there: bash tests/workloads/run-on-device.sh     (everything lands in $OUT)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/workloads-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || { echo "install failed" | tee "$OUT/run.txt"; exit 1; }
export PATH=/tmp/site/bin:$PATH
work=/tmp/workloads-run
rm -rf "$work"; mkdir -p "$work"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import importlib.metadata as m; print(*[f'{p} {m.version(p)}' for p in ('distributed', 'distributed-ucxx-cu13', 'cupy-cuda13x', 'gpudask')], sep='; ')" 2>&1
  python3 -c "import dask_cuda; print('dask-cuda', dask_cuda.__version__)" 2>/dev/null \
    || echo "dask-cuda is not installed: the reference form (dask cuda worker) will be skipped"
  rc=0
  # per-form time boxes: 150 + 120 + 150 s of workflows, each form's runner killed 20 s after its budget
  for spec in ${WORKLOAD_FORMS:-processes:150 local:120 dask-cuda:150}; do
    form=${spec%%:*}; budget=${spec##*:}
    echo "=== form $form (budget ${budget} s)"
    timeout -k 5 $((budget + 20)) python3 -m tests.workloads.run --form "$form" --protocol ucx --array cupy \
      --out "$work" --timeout 45 --budget "$budget" || rc=1
  done
  echo "=== compare"
  python3 -m tests.workloads.compare "$work/results.jsonl" || rc=1
  echo "=== exit $rc"
} 2>&1 | tee "$OUT/run.txt"
cp "$work/results.jsonl" "$OUT/results.jsonl" 2>/dev/null
tar -czf "$OUT/logs.tar.gz" -C "$work" . 2>/dev/null
grep -q "^=== exit 0" "$OUT/run.txt"

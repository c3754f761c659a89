#!/usr/bin/env bash
# GPU tests on a machine with an NVIDIA GPU but no package registry (the device machine):
# wheels fetched beforehand into .whl/ by ../shared/device/wheels.sh (plus cupy when absent).
# Usage there: bash .ci/gpu-on-device.sh [pytest args...]   (results also copied to $OUT if set)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . -e ./contrib/gpudask-bench || exit 1
export PATH=/tmp/site/bin:$PATH
# bytecode, as a pip install has it: this machine sets PYTHONDONTWRITEBYTECODE=1, so without it every
# process the tests start compiles dask, distributed and the RAPIDS packages again (about 1 s each)
python3 -m compileall -q -j 0 /tmp/site gpudask plugins contrib/gpudask-bench gpudask_forkserver.py >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout -k 10 ${GPU_TESTS_S:-540} python3 -m pytest -o addopts= -m gpu -v -rs -p no:cacheprovider --durations=0 "$@" 2>&1 | tee ${OUT:-/tmp}/gpu-tests.txt
exit ${PIPESTATUS[0]}

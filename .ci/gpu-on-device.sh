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
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -m pytest -o addopts= -m gpu -v -rs -p no:cacheprovider "$@" 2>&1 | tee ${OUT:-/tmp}/gpu-tests.txt
exit ${PIPESTATUS[0]}

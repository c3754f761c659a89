#!/usr/bin/env bash
# A fresh-machine run of the README's and docs/*.md's shell commands that a CPU machine can run
# (issue 42), each in the venv a new user would make for it, under a new temporary directory:
#   bash lab/fresh-machine/run.sh [LOG]        (LOG: lab/fresh-machine/<date>-run.log by default)
# One line per command on stdout (ok/FAILED, seconds); every command's output goes to LOG.
# pip sees PyPI only (no pip.conf, no local wheel directories: PIP_CONFIG_FILE=/dev/null), with
# pip's download cache kept.  The GPU installs are resolved with `pip install --dry-run`; the
# commands that need a GPU or a batch system are listed at the end, not run.
# Servers listen on free ports (the docs' 8786/8787 may be taken by a cluster already running).
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LOG=${1:-$ROOT/lab/fresh-machine/$(date -u +%Y-%m-%d)-run.log}
PY=${PYTHON:-python3.11}
WORK=$(mktemp -d /tmp/gpudask-fresh.XXXXXX)
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_CONSTRAINT
for v in $(env | grep -o -E '^(DASK|UCX|GPUDASK)_[A-Za-z0-9_]*'); do unset "$v"; done
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done; }
trap cleanup EXIT
FAILED=0
: > "$LOG"
{ echo "# gpudask fresh-machine run, $(date -u '+%Y-%m-%d %H:%M UTC')"; echo "# $(uname -srm), $(nproc) cores, $($PY --version)";
  echo "# checkout $(git -C "$ROOT" rev-parse --short HEAD) ($(git -C "$ROOT" status --porcelain | wc -l) uncommitted paths); work dir $WORK"; } >> "$LOG"
head -2 "$LOG" | tail -1

# step NAME TIMEOUT COMMAND...: run COMMAND in bash (cwd: the checkout), its output to LOG
step() {
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s.%N) rc
  { echo; echo "### $name"; echo "\$ $*"; } >> "$LOG"
  (cd "$ROOT" && timeout "$limit" bash -o pipefail -c "$*") >> "$LOG" 2>&1; rc=$?
  local dt=$(echo "$(date +%s.%N) - $t0" | bc)
  echo "-> exit $rc, $(printf %.1f "$dt") s" >> "$LOG"
  if [ $rc -eq 0 ]; then printf 'ok      %6.1f s  %s\n' "$dt" "$name"; else printf 'FAILED  %6.1f s  %s (exit %s)\n' "$dt" "$name" "$rc"; FAILED=$((FAILED+1)); fi
}
# serve NAME COMMAND...: start a server in the background (its own log, appended to LOG at the end)
serve() { local name=$1; shift; (cd "$WORK" && exec bash -c "exec $*") > "$WORK/$name.log" 2>&1 & PIDS+=($!); eval "PID_$name=$!"; }
stop() {  # stop NAME...: SIGTERM (dask closes its nannies), then its log into LOG
  for n in "$@"; do local p; eval "p=\${PID_$n:-}"; [ -n "$p" ] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    { echo; echo "### log of $n"; cat "$WORK/$n.log"; } >> "$LOG"; done
}
freeport() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
venv() { "$PY" -m venv "$WORK/$1" && "$WORK/$1/bin/python" -m pip --version; }
export PY WORK; export -f venv
waitw() {  # waitw VENV SCHEDFILE N: until N workers are connected
  echo "$WORK/$1/bin/python -c \"from distributed import Client; c = Client(scheduler_file='$2', timeout=60); c.wait_for_workers($3, timeout=120); print(len(c.scheduler_info(n_workers=-1)['workers']), 'workers')\""
}

# --- the GPU installs: resolved in fresh venvs, in the background while the rest runs ---------
for extra in cu12 cu13 cu12,test cu13,test ucx-cu12 ucx-cu13; do
  ( venv "dry-$extra" > "$WORK/dry-$extra.log" 2>&1 && cd "$ROOT" && \
    "$WORK/dry-$extra/bin/python" -m pip install --dry-run -e ".[$extra]" >> "$WORK/dry-$extra.log" 2>&1
    echo $? > "$WORK/dry-$extra.rc" ) &
done
DRY_START=$(date +%s.%N)

# --- README: python -m pip install -e . && gpudask demo --------------------------------------
step "venv plain + pip install -e . (README)" 600 "venv plain && $WORK/plain/bin/python -m pip install -e ."
P=$WORK/plain/bin
step "gpudask demo (README)" 300 "$P/gpudask demo"
step "gpudask info" 120 "$P/gpudask info"
step "gpudask info --protocol ucx without distributed-ucxx: refused in one line" 120 "! $P/gpudask info --protocol ucx --nworkers 8 > $WORK/info-ucx.out 2> $WORK/info-ucx.err; cat $WORK/info-ucx.err; [ \$(wc -l < $WORK/info-ucx.err) = 1 ] && [ ! -s $WORK/info-ucx.out ]"
step "gpudask info --json | ... > node.json (facts.md)" 120 "cd $WORK && $P/gpudask info --json | $P/python -c 'import json, sys; json.dump(json.load(sys.stdin)[\"facts\"], sys.stdout, indent=1)' > node.json"
step "gpudask info --facts dgx-8gpu-nvswitch-4ib.json --protocol ucx --nworkers 8" 120 "$P/gpudask info --facts gpudask/testing/hosts/dgx-8gpu-nvswitch-4ib.json --protocol ucx --nworkers 8"
step "gpudask plugins" 120 "$P/gpudask plugins"
step "gpudask config" 120 "$P/gpudask config"
step "gpudask config with gpudask.toml (usage: pool-size = \"40GiB\", disable cpu-affinity)" 120 "mkdir -p $WORK/cfg && printf '[rmm]\npool-size = \"40GiB\"\n\n[plugins]\ndisable = [\"cpu-affinity\"]\n' > $WORK/cfg/gpudask.toml && cd $WORK/cfg && $P/gpudask config | tee $WORK/cfg/out.txt && grep -q 40GiB $WORK/cfg/out.txt"
step "DASK_GPUDASK__RMM__POOL_SIZE=0.8 gpudask config (usage)" 120 "DASK_GPUDASK__RMM__POOL_SIZE=0.8 $P/gpudask config | grep -E 'pool-size'"
step "dask --help lists gpudask" 120 "$P/dask --help | tee $WORK/dask-help.txt && grep -q gpudask $WORK/dask-help.txt"

# --- a scheduler file cluster over tcp (usage: several nodes), then check and status ------------
S=$WORK/sched-tcp.json; SP=$(freeport); DP=$(freeport)
serve sched_tcp "$P/dask scheduler --scheduler-file $S --port $SP --dashboard-address :$DP --preload gpudask"
serve worker_tcp "$P/dask worker --scheduler-file $S --nworkers 2 --nthreads 1 --preload gpudask"
step "dask scheduler --scheduler-file + dask worker --nworkers 2 --preload gpudask (tcp)" 180 "$(waitw plain $S 2)"
step "gpudask check --scheduler-file sched.json" 120 "$P/gpudask check --scheduler-file $S"
step "gpudask check --probe --scheduler-file sched.json" 180 "$P/gpudask check --probe --scheduler-file $S"
step "gpudask status --scheduler-file sched.json" 120 "$P/gpudask status --scheduler-file $S"
step "gpudask status --scheduler-file sched.json --json (parses)" 120 "$P/gpudask status --scheduler-file $S --json | $P/python -c 'import json, sys; json.load(sys.stdin)'"
step "gpudask status ADDRESS / --address ADDRESS" 120 "$P/gpudask status tcp://127.0.0.1:$SP && $P/gpudask status --address tcp://127.0.0.1:$SP"
step "gpudask check --json (parses)" 120 "$P/gpudask check --scheduler-file $S --json | $P/python -c 'import json, sys; json.load(sys.stdin)'"
step "curl /gpudask/json | python -m json.tool (dashboard)" 60 "curl -sf http://127.0.0.1:$DP/gpudask/json | $P/python -m json.tool > /dev/null && curl -sf -o $WORK/page.html http://127.0.0.1:$DP/gpudask && grep -q -i worker $WORK/page.html"
# a described 4-GPU host joining the same scheduler (facts.md, plugin-authoring.md)
serve worker_described "env GPUDASK_FACTS=$ROOT/gpudask/testing/hosts/hgx-4gpu-2ib.json $P/dask worker --scheduler-file $S --nworkers 4 --nthreads 1 --preload gpudask"
step "GPUDASK_FACTS=hgx-4gpu-2ib.json dask worker --nworkers 4 --preload gpudask (described host)" 180 "$(waitw plain $S 6)"
step "gpudask status with the described workers" 120 "$P/gpudask status --scheduler-file $S"
stop worker_described worker_tcp sched_tcp
# migrating-from-dask-cuda.md: dask-cuda's options on stock commands
S2=$WORK/sched-dc.json; SP2=$(freeport)
serve sched_dc "$P/dask scheduler --scheduler-file $S2 --port $SP2 --dashboard-address :0 --preload gpudask --enable-cudf-spill"
serve worker_dc "$P/dask worker tcp://127.0.0.1:$SP2 --nworkers 4 --nthreads 1 --preload gpudask --rmm-pool-size 1GB --enable-nvlink"
step "dask scheduler --preload gpudask --enable-cudf-spill + dask worker ADDR --nworkers 4 ... --rmm-pool-size 1GB --enable-nvlink (migrating)" 180 "$(waitw plain $S2 4)"
stop worker_dc sched_dc

# --- UCX on a CPU: pip install -e '.[ucx-cu13]' (usage: a host without a GPU) ------------------
step "venv ucx + pip install -e '.[ucx-cu13]' (usage)" 600 "venv ucx && $WORK/ucx/bin/python -m pip install -e '.[ucx-cu13]'"
U=$WORK/ucx/bin
step "gpudask info --protocol ucx --nworkers 8 (README)" 120 "$U/gpudask info --protocol ucx --nworkers 8"
step "gpudask info --protocol ucx --nworkers 8 --reasons (troubleshooting)" 120 "$U/gpudask info --protocol ucx --nworkers 8 --reasons"
step "gpudask info --facts node.json --protocol ucx (troubleshooting)" 120 "cd $WORK && $U/gpudask info --json | $U/python -c 'import json, sys; json.dump(json.load(sys.stdin)[\"facts\"], sys.stdout, indent=1)' > node-ucx.json && $U/gpudask info --facts $WORK/node-ucx.json --protocol ucx"
step "gpudask demo --protocol ucx" 300 "$U/gpudask demo --protocol ucx 2>&1 | tee $WORK/demo-ucx.txt; ! grep -q 'still alive' $WORK/demo-ucx.txt"
SU=$WORK/sched-ucx.json
serve sched_ucx "$U/dask scheduler --protocol ucx --scheduler-file $SU --port 0 --dashboard-address :0 --preload gpudask"
serve worker_ucx "$U/dask worker --scheduler-file $SU --nworkers 2 --nthreads 1 --preload gpudask"
step "dask scheduler --protocol ucx --scheduler-file + dask worker --nworkers 2 --nthreads 1 --preload gpudask (README)" 180 "$(waitw ucx $SU 2)"
step "gpudask check --scheduler-file (ucx)" 120 "$U/gpudask check --scheduler-file $SU"
step "gpudask check --probe --scheduler-file (ucx)" 180 "$U/gpudask check --probe --scheduler-file $SU"
step "gpudask status --scheduler-file (ucx)" 120 "$U/gpudask status --scheduler-file $SU"
step "gpudask check/status --json over ucx parse (nothing of UCX on stdout)" 180 "$U/gpudask check --scheduler-file $SU --json | $U/python -c 'import json, sys; json.load(sys.stdin)' && $U/gpudask status --scheduler-file $SU --json | $U/python -c 'import json, sys; json.load(sys.stdin)'"
serve worker_ucx_described "env GPUDASK_FACTS=$ROOT/gpudask/testing/hosts/workstation-2gpu-pcie.json $U/dask worker --scheduler-file $SU --nworkers 2 --nthreads 1 --preload gpudask"
step "GPUDASK_FACTS=workstation-2gpu-pcie.json dask worker over ucx (described GPU host on a CPU)" 180 "$(waitw ucx $SU 4)"
stop worker_ucx_described worker_ucx sched_ucx
step "GPUDASK_FACTS=... LocalGPUCluster(protocol='ucx') (facts.md: described hosts run on the CPU)" 240 "cd $WORK && printf 'import gpudask\nfrom distributed import Client\nif __name__ == \"__main__\":\n    with gpudask.LocalGPUCluster(protocol=\"ucx\", dashboard_address=\":0\") as cluster, Client(cluster) as client:\n        print(len(cluster.workers), client.submit(sum, [1, 2, 3]).result())\n' > lgc.py && GPUDASK_FACTS=$ROOT/gpudask/testing/hosts/workstation-2gpu-pcie.json $U/python lgc.py"
step "GPUDASK_FACTS=... dask scheduler --protocol ucx --preload gpudask starts" 120 "cd $WORK && (GPUDASK_FACTS=$ROOT/gpudask/testing/hosts/dgx-8gpu-nvswitch-4ib.json $U/dask scheduler --protocol ucx --port 0 --dashboard-address :0 --preload gpudask --scheduler-file $WORK/sched-d.json > $WORK/sched-d.log 2>&1 & echo \$! > $WORK/sched-d.pid); for i in \$(seq 100); do [ -s $WORK/sched-d.json ] && break; sleep 0.3; done; kill \$(cat $WORK/sched-d.pid); cat $WORK/sched-d.log; [ -s $WORK/sched-d.json ]"

# --- docs: pip install -e '.[docs]', then mkdocs (serve: build here) ---------------------------
step "venv docs + pip install -e '.[docs]' (README)" 600 "venv docs && $WORK/docs/bin/python -m pip install -e '.[docs]'"
step "mkdocs build (the site mkdocs serve shows)" 300 "$WORK/docs/bin/mkdocs build -d $WORK/site"

# --- the tests' install (README), the recipes and the bench smoke test --------------------------
step "venv test + pip install -e '.[test,ucx-cu13]' -e ./contrib/gpudask-bench (README)" 600 "venv test && $WORK/test/bin/python -m pip install -e '.[test,ucx-cu13]' -e ./contrib/gpudask-bench"
T=$WORK/test/bin
step "python -m pytest --collect-only (the suite collects; the full run: see below)" 300 "$T/python -m pytest --collect-only -q | tail -3"
step "the recipes (usage: Slurm job script and Kubernetes pods, run by tests/test_recipes.py)" 400 "$T/python -m pytest -q -n 0 tests/test_recipes.py"
step "gpudask bench --configs tcp,gpudask --repeat 1 --quick --json (benchmarks: the CI smoke test)" 400 "$T/gpudask bench --configs tcp,gpudask --repeat 1 --quick --json > $WORK/bench.json && $T/gpudask bench --show $WORK/bench.json"
step "python -m tests.workloads.run --form processes ... && compare (workloads)" 400 "$T/python -m tests.workloads.run --form processes --protocol tcp --array numpy --out $WORK/wl --facts tests/hosts/workstation-2gpu-pcie.json && $T/python -m tests.workloads.compare $WORK/wl/results.jsonl"

# --- the GPU installs' resolution -------------------------------------------------------------
wait_dry() { for extra in cu12 cu13 cu12,test cu13,test ucx-cu12 ucx-cu13; do
  for i in $(seq 600); do [ -f "$WORK/dry-$extra.rc" ] && break; sleep 1; done
  local rc; rc=$(cat "$WORK/dry-$extra.rc" 2>/dev/null || echo timeout)
  { echo; echo "### pip install --dry-run -e '.[$extra]' (fresh venv)"; cat "$WORK/dry-$extra.log"; echo "-> exit $rc"; } >> "$LOG"
  local would; would=$(grep -o -E 'Would install .*' "$WORK/dry-$extra.log" | tr ' ' '\n' | grep -E '^(distributed-ucxx-cu1[23]|rmm-cu1[23]|cupy-cuda1[23]x|distributed|dask)-[0-9]' | tr '\n' ' ')
  if [ "$rc" = 0 ]; then printf 'ok      %6s    %s\n' "" "pip install --dry-run -e '.[$extra]': $would"; else printf 'FAILED  %6s    %s\n' "" "pip install --dry-run -e '.[$extra]' (exit $rc)"; FAILED=$((FAILED+1)); fi
done; }
wait_dry

cat <<'NOTRUN'
not run here (a GPU, a batch system, or hours):
  dask worker ... --preload gpudask on a GPU node; pip install -e '.[cu12]' / '.[cu13]' for real (resolved above)
  python -m pytest (the whole suite: the lead's run) and python -m pytest -o addopts= -m gpu (GPU tests)
  bash lab/bench/device-correctness.sh, bash lab/bench/run-on-device.sh, bash .ci/gpu-on-device.sh (GPU machine)
  gpudask bench (all five configs: dask-cuda and raw ucxx on GPUs), python -m gpudask_bench.startup --pairs 12
  python -m dask_cuda.benchmarks.local_cupy ... (dask-cuda on a GPU)
  recipes/slurm.py's scale(jobs=2) (Slurm), kubectl apply -f kubernetes.yaml (a cluster)
  docs/distributed-suite.md: distributed's own test suite (a clone, hours); lab/bench/distributed_ucxx_suite.py
  pip install 'gpudask[cu13] @ git+https://<gpudask repository URL>' (no public URL yet)
NOTRUN
echo "$FAILED failed; full log: $LOG"
exit $((FAILED > 0))

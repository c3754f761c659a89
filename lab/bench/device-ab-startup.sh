#!/usr/bin/env bash
# Ready time of gpudask at two commits, in one device call (about 5 minutes): the working tree ("new")
# and an older tree unpacked into _old/ ("old"), each `gpudask bench --configs gpudask --no-workloads`
# (4 launches after a warm-up), alternated three times, so the machine's drift hits both sides.
# Here: rm -rf _old && mkdir _old && git archive REV | tar -x -C _old && rm -rf _old/lab _old/docs _old/tests
# then run(command="bash lab/bench/device-ab-startup.sh", carry=[".whl"]); remove _old/ afterwards.
set -u; t0=$(date +%s); W=/tmp/ab; mkdir -p $W
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site LD_LIBRARY_PATH=/tmp/site/libucx/lib:${LD_LIBRARY_PATH:-} PATH=/tmp/site/bin:$PATH || exit 1
export PYTHONUNBUFFERED=1 UCX_WARN_UNUSED_ENV_VARS=n
python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1
for round in 1 2 3; do for side in new old; do
  d=.; [ $side = old ] && d=_old
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e $d -e $d/contrib/gpudask-bench >/dev/null 2>&1 || echo install-fail
  python3 -m compileall -q -j 0 $d/gpudask $d/plugins $d/gpudask_forkserver.py >/dev/null 2>&1
  timeout -k 5 100 python3 -m gpudask.cli bench --configs gpudask --nworkers 2 --profile --repeat 4 --no-workloads --spill-limit 0 --json > $W/$side-$round.json 2>$W/$side-$round.err
  python3 -c "import json,sys; d=json.load(open('$W/$side-$round.json')); c=d['configs'][0]; p=c['profile']; print('$side $round', [l['ready'] for l in p['launches']], json.dumps(p['median_s_after_launch']))" 2>&1 | tee -a $OUT/ab.txt
  pkill -9 -f "[d]ask (scheduler|worker)" 2>/dev/null; pkill -9 -f "[f]orkserver" 2>/dev/null
  echo "== $side $round after $(( $(date +%s) - t0 )) s" | tee -a $OUT/ab.txt
done; done
tar czf $OUT/ab.tgz -C $W .

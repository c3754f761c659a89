#!/bin/bash
# Ready time of a stock tcp cluster with or without gpudask: PRELOAD="--preload gpudask" lab/bench/ready-time-tcp.sh
# prints the seconds from start until a client sees both workers (see docs/benchmarks.md).
# a stock tcp cluster: dask scheduler + dask worker --nworkers 2 (with PRELOAD="--preload gpudask" or not),
# timed until a client sees 2 workers; then everything is stopped
t0=$(date +%s.%N); d=$(mktemp -d); sf=$d/s.json
python -m dask scheduler --port 0 --no-dashboard --scheduler-file $sf $PRELOAD >/dev/null 2>&1 &
s=$!
python -m dask worker --scheduler-file $sf --nworkers 2 --no-dashboard $PRELOAD >/dev/null 2>&1 &
w=$!
python -c "
import time
from distributed import Client
while True:
    try:
        c = Client(scheduler_file='$sf', timeout=30); break
    except Exception: time.sleep(0.05)
c.wait_for_workers(2, timeout=60)
c.close(); print(round(time.time() - $t0, 3))
"
kill $w $s; wait $w $s 2>/dev/null
rm -rf $d

"""A user's script with its own cluster: ``gpudask.LocalGPUCluster``, gpudask imported at the top.

    python tests/workloads/local.py --protocol tcp|ucx --array numpy|cupy --workflows a,b,... --timeout S
"""

import gpudask  # noqa: I001 - at the top, as the docs tell users

import argparse
import sys

from distributed import Client

import workflows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--protocol", default="tcp")
    p.add_argument("--array", default="numpy")
    p.add_argument("--workflows", required=True)
    p.add_argument("--timeout", type=float, default=60)
    p.add_argument("--nworkers", type=int, default=2)
    a = p.parse_args()
    xp = workflows.array_module(a.array)
    emit = workflows.emitter()
    with gpudask.LocalGPUCluster(n_workers=a.nworkers, threads_per_worker=1, protocol=a.protocol,
                                 dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(a.nworkers, timeout=a.timeout)
        bad = workflows.run(client, xp, a.workflows.split(","), a.timeout, emit)
    emit({"event": "end", "gpudask_imported": True})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""A user's script with its own cluster: ``gpudask.LocalGPUCluster``, gpudask imported at the top.

    python tests/workloads/local.py --protocol tcp|ucx --array numpy|cupy --workflows a,b,... --timeout S
"""

import gpudask  # noqa: I001 - at the top, as the docs tell users

import sys

from distributed import Client

import workflows


def main() -> int:
    a = workflows.arguments(("--protocol", {"default": "tcp"}))
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

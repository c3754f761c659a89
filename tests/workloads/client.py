"""A user's client script against a running cluster; it does not import gpudask (but with
``--gpudask-client PROTOCOL``, which calls ``gpudask.initialize()`` first).

    python tests/workloads/client.py --scheduler-file FILE --array numpy|cupy --workflows a,b,... --timeout S

One JSON line per workflow on stdout (see workflows.run); the last line says whether
gpudask was imported in this process (it must not be, unless a workflow that registers
gpudask's plugins ran).
"""

from __future__ import annotations

import sys

from distributed import Client

import workflows


def main() -> int:
    a = workflows.arguments(("--scheduler-file", {"required": True}),
                            ("--gpudask-client", {"default": None, "metavar": "PROTOCOL"}))
    if a.gpudask_client:  # a gpudask client: its plan applied before the Client (gpu-graph-data's too)
        import gpudask

        gpudask.initialize(protocol=a.gpudask_client)
    xp = workflows.array_module(a.array)
    emit = workflows.emitter()
    with Client(scheduler_file=a.scheduler_file, timeout=a.timeout) as client:
        client.wait_for_workers(a.nworkers, timeout=a.timeout)
        bad = workflows.run(client, xp, a.workflows.split(","), a.timeout, emit)
    emit({"event": "end", "gpudask_imported": "gpudask" in sys.modules})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

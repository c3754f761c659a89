"""gpu-graph-data: GPU objects in task graphs never materialise on the scheduler, and large ones
travel worker-direct (hooks: :mod:`.plugin`; the scheduler's graph reader: :mod:`.deferral`;
the client's scatter: :mod:`.lifting`)."""

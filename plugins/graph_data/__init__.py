"""gpu-graph-data: GPU objects in task graphs never materialise on the scheduler; large ones
travel worker-direct (the hooks: :mod:`.plugin`; the scheduler's graph reader: :mod:`.deferral`;
the client's scatter: :mod:`.lifting`; distributed's private names it relies on are
:mod:`gpudask.compat.distributed`'s, reached through the plugin API)."""

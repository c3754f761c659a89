"""The scheduler-parity plugin: hooks and the scheduler check in :mod:`.plugin`, the relay guard in :mod:`.relay`."""

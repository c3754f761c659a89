"""The gpu-dask-defaults plugin: hooks in :mod:`.plugin`, the scheduler's P2P rechunk warning in :mod:`.p2p`."""

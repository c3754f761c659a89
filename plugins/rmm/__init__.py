"""The rmm plugin: RMM pools in worker processes (hooks in :mod:`.plugin`; only :mod:`.setup` imports rmm)."""

"""The spill plugin: a device memory limit per worker (hooks in :mod:`.plugin`, store in :mod:`.store`)."""

"""The spill plugin: a device memory limit per worker; GPU objects above it move to host
memory, then disk.  :mod:`.plugin` holds its hooks, :mod:`.store` the worker's data store.
"""

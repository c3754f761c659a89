"""The gpu-dask-defaults plugin: dask defaults that fail on GPU data.  :mod:`.plugin` holds
its hooks; :mod:`.p2p` the scheduler plugin that warns a plain client once about P2P rechunk.
"""

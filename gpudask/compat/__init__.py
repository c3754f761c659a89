"""Other projects' interfaces, translated into gpudask's settings (the compat stage).

A room of its own because it is neither planning nor applying: it knows another project's
API (dask-cuda's ``LocalCUDACluster`` arguments and ``dask cuda worker`` options,
:mod:`gpudask.compat.dask_cuda`) and turns what a user wrote for it into the settings the
plugins declare, or refuses it in one line.  It reads the bootstrap's plugins and settings
and decides nothing; the apply stage (``dask worker``'s preload options) and
:class:`gpudask.cluster.LocalGPUCluster` call it.

:mod:`gpudask.compat.distributed` is every reach into distributed's internals (private names,
frame walks, replaced handlers), each held by tests/test_compat_contract.py; it imports nothing
of gpudask, so any stage and the plugin API may use it.
"""

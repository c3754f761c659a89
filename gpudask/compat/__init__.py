"""Other projects' interfaces, translated into gpudask's settings (the compat stage).

A stage of its own because it decides nothing: it turns what a user wrote for dask-cuda
(:mod:`gpudask.compat.dask_cuda`) into the settings the plugins declare, or refuses it in one line.

:mod:`gpudask.compat.distributed` is every reach into distributed's internals (private names,
frame walks, replaced handlers), each held by tests/test_compat_contract.py; it imports nothing
of gpudask, so any stage and the plugin API may use it.
"""

"""gpudask's built-in plugins, installed as ``gpudask.plugins``.

A plugin is one module (``gpu_pinning``, ``cpu_affinity``, ``forkserver``, ``cuda_context``,
``worker_memory``) or a folder whose ``plugin`` module holds the hooks beside the plugin's own
helpers (``rmm/``, ``spill/``, ``scheduler_parity/``, ``dask_defaults/``); ``ucx/`` holds the
three transport plugins and the rules they share.  The core registers them from
:data:`gpudask.plugin.manager.BUILTIN_PLUGINS` and calls them exactly like a third-party plugin:
they import only :mod:`gpudask.pluginapi` and their own folder.
"""

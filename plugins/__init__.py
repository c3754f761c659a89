"""gpudask's built-in plugins, installed as ``gpudask.plugins``.

A plugin is one module (``forkserver``, ``cuda_context``, ...) or a folder whose ``plugin`` module
holds the hooks beside its helpers (``rmm/``, ``scheduler_parity/``, ...); ``ucx/`` holds the three
transport plugins and the rules they share.  The core calls them exactly like third-party plugins:
they import only :mod:`gpudask.pluginapi` and their own folder.
"""

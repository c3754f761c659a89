"""gpudask's built-in plugins, installed as ``gpudask.plugins``.

Each module is one plugin, registered through the ``gpudask`` entry point group exactly
like a third-party plugin; none of them is special to the core.
"""

"""The rmm plugin: RMM pools in worker processes.

:mod:`.plugin` holds its hooks (registered as the built-in ``rmm``), :mod:`.options` its
settings, :mod:`.target` the GPU a pool lives on and its size arithmetic, :mod:`.report` its
rows of ``gpudask info`` / ``status`` / the ``/gpudask`` page, :mod:`.setup` what runs in a
worker process (the only module that imports rmm).
"""

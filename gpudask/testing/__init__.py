"""Testing gpudask and gpudask plugins on real processes.

* :mod:`gpudask.testing.processes` -- real ``dask scheduler`` / ``dask worker`` processes on
  this host: start, wait, stop, with everything they started (no pytest needed);
* :mod:`gpudask.testing.plugin` -- a pytest plugin (``pytest_plugins =
  ["gpudask.testing.plugin"]``): the ``gpudask_cluster`` and ``gpudask_cluster_factory``
  fixtures, which stop what a test started.

Nothing in the gpudask runtime imports this package, and importing it imports nothing.
"""

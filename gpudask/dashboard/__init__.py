"""What gpudask shows on dask's HTTP servers (the dashboard stage): ``/gpudask`` and ``/metrics``.

A room of its own because it applies nothing: it reads what a running cluster holds and
serves it.  The apply stage installs it in the servers it sets up (``dask_setup``, the
distributed plugins); it imports the checks and the bootstrap, never the apply stage (the
plugin manager of this process's session comes through :mod:`gpudask.plan.applied`).
"""

"""What gpudask shows on dask's HTTP servers (the dashboard stage): ``/gpudask`` and ``/metrics``.
It applies nothing: the apply stage installs it; it never imports the apply stage (the session's
plugin manager comes through :mod:`gpudask.plan.applied`).
"""

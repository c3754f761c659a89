"""What gpudask shows on dask's HTTP servers (the dashboard stage).

* :mod:`gpudask.dashboard.page` -- the ``/gpudask`` page on the scheduler: what it shows
  (from what the workers published and the scheduler check's report), its handlers, and
  :func:`~gpudask.dashboard.page.install`;
* :mod:`gpudask.dashboard.html` -- the page's HTML and script, as one document;
* :mod:`gpudask.dashboard.serve` -- ``/gpudask/json`` built off the event loop, shared and bounded;
* :mod:`gpudask.dashboard.prometheus` -- the ``gpudask-*`` worker metrics on ``/metrics``.

A room of its own because it applies nothing: it reads what a running cluster holds and
serves it.  The apply stage installs it in the servers it sets up (``dask_setup``, the
distributed plugins); it imports the checks and the bootstrap, never the apply stage (the
plugin manager of this process's session comes through :mod:`gpudask.plan.applied`).
"""

"""Testing gpudask plugins: plans for described hosts, and real processes.

* :func:`plan_for`, :func:`facts_file`, :func:`example_host`, :func:`example_hosts`
  (:mod:`gpudask.testing.plans`) -- the plan gpudask builds for a described host with your
  plugin registered, facts files of your own, and the example hosts gpudask ships;
* :mod:`gpudask.testing.processes` -- real ``dask scheduler`` / ``dask worker`` processes on
  this host: start, wait, stop, with everything they started (no pytest needed);
* :mod:`gpudask.testing.plugin` -- a pytest plugin (``pytest_plugins =
  ["gpudask.testing.plugin"]``): the ``gpudask_cluster`` and ``gpudask_cluster_factory``
  fixtures, which stop what a test started.

With :mod:`gpudask.pluginapi` this is all a plugin's tests need.  Nothing in the gpudask
runtime imports this package, and importing it imports nothing: the names above load on
first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudask.testing.plans import example_host, example_hosts, facts_file, plan_for

__all__ = ["example_host", "example_hosts", "facts_file", "plan_for"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from gpudask.testing import plans

        return getattr(plans, name)
    raise AttributeError(f"module 'gpudask.testing' has no attribute {name!r}")

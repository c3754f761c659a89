"""Testing gpudask plugins: plans for described hosts (:mod:`gpudask.testing.plans`), real processes
(:mod:`gpudask.testing.processes`) and a pytest plugin (``pytest_plugins = ["gpudask.testing.plugin"]``).

With :mod:`gpudask.pluginapi` this is all a plugin's tests need.  Nothing in the gpudask
runtime imports this package, and importing it imports only the standard library.
"""

from __future__ import annotations

from gpudask.testing.plans import example_host, example_hosts, facts_file, plan_for

__all__ = ["example_host", "example_hosts", "facts_file", "plan_for"]

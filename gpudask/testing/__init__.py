"""Testing gpudask plugins: plans for described hosts (:mod:`gpudask.testing.plans`), real processes
(:mod:`gpudask.testing.processes`) and a pytest plugin (``pytest_plugins = ["gpudask.testing.plugin"]``).

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

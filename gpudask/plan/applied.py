"""Which role's plan this process applied: asked by plugins' apply hooks
(:func:`gpudask.pluginapi.applied_role`), answered by the apply stage.

The apply stage is above the plan stage; it registers its answer here
(:func:`set_role_source`) when it is imported, so the plugin API asks without importing
it.  In a process where nothing was applied the answer is None.
"""

from __future__ import annotations

from collections.abc import Callable

_SOURCE: Callable[[], str | None] | None = None


def set_role_source(source: Callable[[], str | None] | None) -> None:
    """The apply stage's ``() -> role or None``."""
    global _SOURCE
    _SOURCE = source


def applied_role() -> str | None:
    """The role whose plan this process applied (``"scheduler"``, ``"nanny"``, ``"worker"``,
    ``"client"``), or None.  A scheduler or nanny inside a client's process (a LocalCluster)
    runs with the client's plan: an apply hook checking "this process" asks this first."""
    return _SOURCE() if _SOURCE is not None else None

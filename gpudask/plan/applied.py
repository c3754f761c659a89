"""What the apply stage holds for this process, asked from below it without importing it: the
role whose plan this process applied (:func:`gpudask.pluginapi.applied_role`) and the plan
context of its session (the ``/gpudask`` page).  The apply stage registers its answers here
when imported; where nothing was applied the answers are None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudask.plan.context import PlanContext

_SOURCE: Callable[[], str | None] | None = None
_CONTEXT: Callable[[], PlanContext | None] | None = None


def set_role_source(source: Callable[[], str | None] | None) -> None:
    """The apply stage's ``() -> role or None``."""
    global _SOURCE
    _SOURCE = source


def applied_role() -> str | None:
    """The role whose plan this process applied (``"scheduler"``, ``"nanny"``, ``"worker"``,
    ``"client"``), or None.  A scheduler or nanny inside a client's process (a LocalCluster)
    runs with the client's plan: an apply hook checking "this process" asks this first."""
    return _SOURCE() if _SOURCE is not None else None


def set_context_source(source: Callable[[], PlanContext | None] | None) -> None:
    """The apply stage's ``() -> the plan context of this process's session, or None``."""
    global _CONTEXT
    _CONTEXT = source


def session_context() -> PlanContext | None:
    """The plan context of this process's gpudask session -- the plan it applied, else the
    last plan-only session -- or None when it has none."""
    return _CONTEXT() if _CONTEXT is not None else None

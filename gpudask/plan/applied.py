"""What the apply stage holds for this process, asked from below it without importing it (it
registers its answers here when imported; None where nothing was applied).
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
    """The role whose plan this process applied, or None.  A scheduler or nanny inside a
    client's process (a LocalCluster) runs with the client's plan."""
    return _SOURCE() if _SOURCE is not None else None


def set_context_source(source: Callable[[], PlanContext | None] | None) -> None:
    """The apply stage's ``() -> the plan context of this process's session, or None``."""
    global _CONTEXT
    _CONTEXT = source


def session_context() -> PlanContext | None:
    """The plan context of the plan this process applied, else of its last plan-only session, or None."""
    return _CONTEXT() if _CONTEXT is not None else None

"""The plan stage: what every process of a host gets, and why (docs/architecture.md).

:class:`ProcessPlan` and :class:`Reason` (:mod:`~gpudask.plan.model`), :class:`HostPlan` and its
file format (:mod:`~gpudask.plan.host_plan`), :class:`PlanInputs`, :class:`PlanContext` (the
frozen snapshot of a plan's inputs) and :func:`build_plan` (:mod:`~gpudask.plan.planner`, the
fixed order of the plan hooks).  Pure: building a plan never changes the process.
"""

from __future__ import annotations

from gpudask.plan.context import UCX_PROTOCOLS, PlanContext
from gpudask.plan.host_plan import FORMAT, HostPlan, PlanFileError, UserValues
from gpudask.plan.inputs import PlanInputs
from gpudask.plan.model import ROLES, ProcessPlan, Reason, cpu_ranges
from gpudask.plan.planner import INTERNAL_ENV_PREFIX, build_plan, check_protocol

__all__ = ["ROLES", "Reason", "ProcessPlan", "HostPlan", "PlanContext", "PlanInputs", "UserValues",
           "PlanFileError", "FORMAT", "UCX_PROTOCOLS", "build_plan", "check_protocol", "cpu_ranges",
           "INTERNAL_ENV_PREFIX"]

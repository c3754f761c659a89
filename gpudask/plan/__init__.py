"""The plan stage: what every process of a host gets, and why (docs/architecture.md).  Pure:
building a plan (:func:`build_plan`) never changes the process.
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

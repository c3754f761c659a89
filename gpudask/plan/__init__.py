"""The plan stage: what every process of a host gets, and why (see docs/architecture.md).

* :mod:`gpudask.plan.model` -- :class:`ProcessPlan`, :class:`HostPlan`;
* :mod:`gpudask.plan.context` -- :class:`PlanContext`, the frozen snapshot of a plan's inputs;
* :mod:`gpudask.plan.planner` -- :func:`build_plan`, the fixed order of the plan hooks;
* :mod:`gpudask.plan.host` -- :func:`plan_host`, the plan for this (or a described) host.

Pure: building a plan reads the process and never changes it.
"""

from __future__ import annotations

from gpudask.plan.context import UCX_PROTOCOLS, PlanContext
from gpudask.plan.host import plan_host
from gpudask.plan.model import ROLES, HostPlan, ProcessPlan, Reason, cpu_ranges
from gpudask.plan.planner import INTERNAL_ENV_PREFIX, build_plan

__all__ = ["ROLES", "Reason", "ProcessPlan", "HostPlan", "PlanContext", "UCX_PROTOCOLS",
           "build_plan", "plan_host", "cpu_ranges", "INTERNAL_ENV_PREFIX"]

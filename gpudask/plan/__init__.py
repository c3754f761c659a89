"""The plan stage: what every process of a host gets, and why (see docs/architecture.md).

* :mod:`gpudask.plan.model` -- :class:`ProcessPlan` (with its plugin sections), :class:`Reason`;
* :mod:`gpudask.plan.host_plan` -- :class:`HostPlan` and its file format (``to_json`` /
  ``from_json``, :class:`UserValues`);
* :mod:`gpudask.plan.inputs` -- :class:`PlanInputs`, what a plan is computed from (made once
  per process by :mod:`gpudask.bootstrap`);
* :mod:`gpudask.plan.context` -- :class:`PlanContext`, the frozen snapshot of a plan's inputs;
* :mod:`gpudask.plan.planner` -- :func:`build_plan`, the fixed order of the plan hooks.

Pure: building a plan reads its inputs and never changes the process.  The plan for this
process's host, from its settings and facts, is :func:`gpudask.bootstrap.plan_host`.
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

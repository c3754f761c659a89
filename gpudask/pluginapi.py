"""The public plugin API: everything a gpudask plugin imports from gpudask.

Built-in plugins (``gpudask.plugins.*``), ``contrib/`` and third-party plugins import
from this module only (and from the standard library and third-party libraries); a
test holds the built-ins and ``contrib/`` to it.  What is here is kept stable; anything
else in ``gpudask`` may move.  Nothing in gpudask's core imports this module.

* hooks: :data:`hookimpl` (the hooks are documented in docs/hooks.md);
* settings: :class:`Option` and its parsers; read values with ``ctx.setting(key)``;
* errors: :class:`GpudaskError`, :class:`ConfigError`, :class:`PluginError`;
* plans: :class:`PlanContext`, :class:`ProcessPlan` (a plugin's own decisions go in its
  section, ``plan.set_section``), :class:`HostPlan`; the checks: :class:`Finding`,
  :class:`ProcessSide` (what ``gpudask_scheduler_check`` receives);
* shared rules: what a ``UCX_TLS`` value means (:func:`parse_ucx_tls`, the one parser,
  :func:`tls_enables`, :func:`ucxx_creates_cuda_context`, :func:`ucx_supports`), which GPU a
  process of the plan uses and who shares it (:func:`process_gpu`, :func:`workers_sharing_gpu`),
  :func:`cpu_ranges`, :func:`format_bytes` / :func:`parse_bytes` (dask's);
* facts of another process: :func:`facts_from_dict` (validates published facts),
  :func:`fingerprint` (an exact key for plain data, to read the same facts once).
"""

from __future__ import annotations

from dask.utils import format_bytes, parse_bytes

from gpudask.config import Option, choice, parse_bool, parse_name_list, parse_optional_bool, parse_optional_float
from gpudask.errors import ConfigError, GpudaskError, PluginError
from gpudask.facts import GPU, Facts, IBDevice, facts_from_dict
from gpudask.facts.probe import ucx_unused_variables
from gpudask.facts.statedir import host_lock
from gpudask.findings import Finding, ProcessSide, fingerprint
from gpudask.hookspecs import hookimpl
from gpudask.plan import HostPlan, PlanContext, ProcessPlan, cpu_ranges
from gpudask.plan.gpus import process_gpu, workers_sharing_gpu
from gpudask.plan.ucx_tls import parse_ucx_tls, tls_enables, ucx_supports, ucxx_creates_cuda_context

__all__ = [
    # hooks
    "hookimpl",
    # settings
    "Option", "parse_bool", "parse_optional_bool", "parse_optional_float", "parse_name_list", "choice",
    # errors
    "GpudaskError", "ConfigError", "PluginError",
    # plans and checks
    "PlanContext", "ProcessPlan", "HostPlan", "Finding", "ProcessSide", "facts_from_dict",
    "fingerprint",
    # what ctx.facts holds (for annotations)
    "Facts", "GPU", "IBDevice",
    # this process
    "applied_role", "ucx_unused_variables", "host_lock",
    # shared rules
    "parse_ucx_tls", "tls_enables", "ucxx_creates_cuda_context", "ucx_supports", "process_gpu",
    "workers_sharing_gpu", "cpu_ranges", "format_bytes", "parse_bytes",
]


def applied_role() -> str | None:
    """The role whose plan this process applied (``"scheduler"``, ``"nanny"``, ``"worker"``,
    ``"client"``), or None.  A scheduler or nanny inside a client's process (a LocalCluster)
    runs with the client's plan: an apply hook checking "this process" asks this first."""
    from gpudask.apply.process import current

    session = current()
    return session.role if session is not None and session.applied else None

"""The public plugin API: everything a gpudask plugin imports from gpudask.

Built-in plugins (``gpudask.plugins.*``), ``contrib/`` and third-party plugins import
from this module only (and from the standard library and third-party libraries); a
test holds the built-ins and ``contrib/`` to it.  What is here is kept stable; anything
else in ``gpudask`` may move.  Nothing in gpudask's core imports this module, and it imports nothing above the plan
stage (the apply stage answers :func:`applied_role` through :mod:`gpudask.plan.applied`).

* hooks: :data:`hookimpl` (the hooks are documented in docs/hooks.md);
* settings: :class:`Option` and its parsers; read values with ``ctx.setting(key)``;
* errors: :class:`GpudaskError`, :class:`ConfigError`, :class:`PluginError`;
* plans: :class:`PlanContext`, :class:`ProcessPlan` (a plugin's own decisions go in its
  section, ``plan.set_section``), :class:`HostPlan`; the checks: :class:`Finding`,
  :class:`ProcessSide` (what ``gpudask_scheduler_check`` receives);
* shared rules: what a ``UCX_TLS`` value means (:func:`parse_ucx_tls`, the one parser,
  :func:`tls_enables`, :func:`ucxx_creates_cuda_context`), which GPU a
  process of the plan uses and who shares it (:func:`process_gpu`, :func:`workers_sharing_gpu`),
  :func:`cpu_ranges`, :func:`format_bytes` / :func:`parse_bytes` (dask's);
* facts a plugin owns: :class:`FactsSection` (``gpudask_facts_sections``), read with
  ``ctx.facts.section(name)``; :func:`sysfs_root` (where a probe reads sysfs: /sys, or the
  tests' fake tree); the user's private state directory, where a slow probe keeps its answer
  (:func:`state_dir`, :class:`StateDirError`, :func:`read_private`, :func:`write_atomic`);
* this process's state a plugin keeps (:func:`plugin_state`: forgotten with gpudask's own),
  and the results of pure computations it keeps, bounded (:func:`remembered`);
* facts of another process: :func:`facts_from_dict` (validates published facts),
  :func:`fingerprint` (an exact key for plain data, to read the same facts once);
* what a process publishes (typed: :class:`Published`, :class:`PublishedPlan`,
  :class:`AppliedState`, :class:`Mismatch`, ...; under :data:`PUBLISHED_KEY` of a worker's
  startup information): what ``gpudask_report_rows`` receives and a test reads back.
"""

from __future__ import annotations

from dask.utils import format_bytes, parse_bytes

from gpudask.config import Option, choice, parse_bool, parse_name_list, parse_optional_bool, parse_optional_float
from gpudask.compat.distributed import (P2P_RECHUNK_TRANSFER_PREFIX, add_worker_metric, offload_threshold,
                                        set_offload_threshold, unwrap_handler, unwrap_report,
                                        wrap_direct_default, wrap_graph_submission, wrap_handler,
                                        wrap_pickle_family_loads, wrap_report)
from gpudask.errors import ConfigError, GpudaskError, PluginError
from gpudask.facts import GPU, Facts, facts_from_dict
from gpudask.facts.sections import FactsSection
from gpudask.facts.probe import (norm_bus_id, nvml_session, read_sysfs, sysfs_numa_node,
                                 sysfs_realpath, sysfs_root)
from gpudask.facts.statedir import StateDirError, host_lock, read_private, state_dir, write_atomic
from gpudask.findings import Finding, ProcessSide, fingerprint
from gpudask.plugin.hookspecs import hookimpl
from gpudask.plan import HostPlan, PlanContext, ProcessPlan, cpu_ranges
from gpudask.plan.applied import applied_role
from gpudask.plan.gpus import process_gpu, workers_sharing_gpu
from gpudask.plan.published import (PUBLISHED_KEY, AppliedState, CudaContextState, Mismatch, PlannedActual, PluginInfo,
                                    Published, PublishedPlan, PublishedReason)
from gpudask.compat.distributed_ucxx import start_ucx
from gpudask.plan.ucx_tls import parse_ucx_tls, tls_enables, ucxx_creates_cuda_context
from gpudask.session import plugin_state, remembered

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
    # what a process publishes (typed dicts)
    "PUBLISHED_KEY", "Published", "PublishedPlan", "PublishedReason", "AppliedState", "CudaContextState",
    "PlannedActual", "Mismatch", "PluginInfo",
    # what ctx.facts holds (for annotations), and a plugin's own facts
    "Facts", "GPU", "FactsSection", "sysfs_root", "read_sysfs", "sysfs_realpath", "sysfs_numa_node", "norm_bus_id", "nvml_session", "state_dir", "StateDirError", "read_private", "write_atomic",
    # this process
    "applied_role", "host_lock", "plugin_state", "remembered",
    # shared rules
    "parse_ucx_tls", "tls_enables", "ucxx_creates_cuda_context", "process_gpu",
    "workers_sharing_gpu", "cpu_ranges", "format_bytes", "parse_bytes",
    # distributed's internals a plugin relies on (gpudask.compat.distributed, contract-tested)
    "start_ucx", "wrap_handler", "unwrap_handler", "wrap_report", "unwrap_report", "offload_threshold", "set_offload_threshold",
    "P2P_RECHUNK_TRANSFER_PREFIX", "wrap_graph_submission", "wrap_direct_default", "wrap_pickle_family_loads",
    "add_worker_metric",
]

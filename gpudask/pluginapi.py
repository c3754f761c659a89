"""The public plugin API: everything a gpudask plugin imports from gpudask (built-in, ``contrib/``
and third-party plugins alike; a test holds the built-ins and ``contrib/`` to it).  What is here
is kept stable; anything else in ``gpudask`` may move.  The core never imports this module, and it
imports nothing above the plan stage (:func:`applied_role` comes through :mod:`gpudask.plan.applied`).
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

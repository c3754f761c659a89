"""The published shape of a process's plan and applied state (``WorkerState.extra["gpudask"]``,
``gpudask info --json``, what ``gpudask_report_rows`` and ``gpudask_scheduler_check`` receive),
exported by :mod:`gpudask.pluginapi`.  Plain JSON data, bounded before it is shown
(:mod:`gpudask.checks.published`): a value can be a marker string (``"... and 99 more items"``)
where the type says otherwise, so a reader checks what it uses.
"""

from __future__ import annotations

from typing import Any, TypedDict

PUBLISHED_KEY = "gpudask"  # the key of a worker's startup information / WorkerState.extra


class PublishedReason(TypedDict):
    """One decision: the plugin that made it, what it decided, and why."""

    plugin: str
    decision: str
    why: str


class PublishedPlan(TypedDict):
    """One process's plan (``ProcessPlan.to_dict()``; ``gpudask info --json``'s
    ``scheduler``, ``nanny``, ``client`` and each of ``workers``)."""

    role: str  # "scheduler" | "nanny" | "client" | "worker"
    index: int | None  # the worker number, None for the other roles
    gpu: str | None  # UUID of the process's own GPU (MIG UUID for a MIG instance)
    gpu_index: int | None  # its NVML index
    cuda_visible_devices: str | None
    env: dict[str, str]  # environment variables set in the process
    config: dict[str, Any]  # dask config keys set in the process
    interface: str | None
    cpu_affinity: list[int] | None
    sections: dict[str, dict[str, Any]]  # each plugin's own decisions, by plugin name
    requests: dict[str, dict[str, dict[str, Any]]]  # {owner: {requester: values}}
    multiprocessing_method: str | None
    resources: dict[str, float]
    ucx_transports: list[str]
    reasons: list[PublishedReason]


class PlannedActual(TypedDict):
    """A value a plugin read back (``gpudask_applied_state``): planned against actual."""

    planned: Any
    actual: Any


class CudaContextState(TypedDict, total=False):
    exists: bool | None  # does the process hold a CUDA context (None: NVML could not tell)
    uuid: str | None  # on which GPU
    error: str  # why NVML could not tell


class StartupCounts(TypedDict):
    """How many times a process took each costly step (:mod:`gpudask.session`): a worker
    process that read its host plan shows 0 everywhere."""

    bootstrap: int  # config, plugin manager and settings built from its own config
    facts_read: int  # facts probed or read, and the plugins' sections taken
    facts_schema: int  # JSON Schema validations of facts or of a facts section
    parsed: dict[str, int]  # settings parsed from their raw value, by key
    # the modules (gpudask_preimport) a forked worker found imported by its fork server
    preimported: list[str]


class AppliedState(TypedDict, total=False):
    """What the live process runs with, read after setup (``gpudask.apply.state``): the
    keys its plan decides, nothing else."""

    pid: int
    env: dict[str, str | None]  # each variable the plan sets, as the process has it
    config: dict[str, Any]  # each dask config key the plan sets, as the process has it
    multiprocessing_method: str | None
    cpu_affinity: list[int]  # Linux only
    cuda_context: CudaContextState  # a real GPU host only
    ucx: dict[str, str]  # ucxx's configuration, once UCX is up
    startup: StartupCounts  # what the process paid for at start (gpudask.session)
    plugins: dict[str, dict[str, PlannedActual]]  # each plugin's gpudask_applied_state


class Mismatch(TypedDict):
    """A planned value the live process does not have."""

    process: str  # "worker 3", "scheduler"
    key: str
    planned: Any
    actual: Any
    plugin: str | None  # the plugin whose decision it was


class PluginInfo(TypedDict, total=False):
    """A loaded plugin, as ``gpudask plugins --json`` and a plan's ``plugins`` list it."""

    name: str
    priority: int
    source: str  # "builtin" | "entry point" | "registered"
    distribution: str | None
    hooks: list[str]
    reads_sections: list[str]  # only when it reads other plugins' sections


class Published(TypedDict):
    """What a worker's (or a planning server's) gpudask publishes about itself."""

    version: str  # gpudask's
    role: str
    protocol: str
    facts: dict[str, Any]  # the host's facts (a facts file's format, schema 2)
    facts_origin: str | None  # the facts file, when the host is described
    plugins: list[PluginInfo]
    plan: PublishedPlan
    memory: dict[str, Any]  # each plugin's gpudask_setup_memory result, by plugin
    applied: AppliedState
    mismatches: list[Mismatch]


__all__ = ["PUBLISHED_KEY", "AppliedState", "CudaContextState", "Mismatch", "PlannedActual", "PluginInfo",
           "Published", "PublishedPlan", "PublishedReason"]

"""Device memory limit and spilling of GPU objects, device -> host -> disk, on stock workers.

The plan gives every worker with a GPU a ``device_memory_limit`` (its ``spill`` section); the
worker applies it at ``dask_setup``, after distributed built ``Worker.data`` and before the worker
holds data: that store becomes the host tier of a :class:`DeviceHostStore`.  Not at import time:
the preload imports run before the memory manager exists.  docs/memory.md describes it for users.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import (ConfigError, Option, add_worker_metric, hookimpl, parse_bool, parse_bytes,
                               workers_sharing_gpu)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from distributed import Nanny, Scheduler, Worker

    from gpudask.pluginapi import PlanContext, ProcessPlan

name = "spill"
priority = 110
# dask-cuda's LocalCUDACluster arguments about spilling that gpudask has no equivalent for:
# LocalGPUCluster refuses them (None or False, their "not used", is accepted) saying what
# to use instead (docs/migrating-from-dask-cuda.md)
dask_cuda_refused = {
    "jit_unspill": "gpudask has no JIT-unspill proxy objects; spilling is gpudask.spill.device-memory-limit",
    "shared_filesystem": "it only serves dask-cuda's JIT unspilling, which gpudask does not have; leave it out",
}
_JIT_UNSPILL = ("gpudask has no JIT-unspill proxy objects; spilling from the GPU is --device-memory-limit "
                "(gpudask.spill.device-memory-limit), cuDF's own --enable-cudf-spill")
_SHARED_FS = "leave it out: it only serves dask-cuda's JIT unspilling, which gpudask does not have"
# the same for `dask cuda worker`'s options given to `dask worker --preload gpudask`
dask_cuda_refused_options = {
    "--enable-jit-unspill": _JIT_UNSPILL,
    "--disable-jit-unspill": "leave it out: gpudask has no JIT unspilling to turn off",
    "--jit-unspill": _JIT_UNSPILL,
    "--shared-filesystem": _SHARED_FS,
    "--no-shared-filesystem": _SHARED_FS,
}
# reads the rmm plugin's section (its maximum_pool_size) in gpudask_plan_finish, the step
# after rmm's gpudask_plan_memory: the order is the plan's steps', not the priorities
reads_sections = ("rmm",)

KEY = "gpudask.spill.device-memory-limit"
CUDF_KEY = "gpudask.spill.cudf"
CUDF_STATS_KEY = "gpudask.spill.cudf-stats"
LOG_KEY = "gpudask.spill.log"
DEFAULT_FRACTION = 0.8
# a bare number is bytes; below this it is almost surely a fraction or GB written without
# its unit, and would make every GPU object spill at once
MIN_BARE_BYTES = 2**20
METRIC = "gpudask-spill"
ACCEPTED = ("a size ('8GB' = 8*10**9 bytes, '8GiB' = 2**33; a bare number is bytes), a fraction 0 < f <= 1 "
            "of the worker's GPU (0.8, '80%'), null/'auto' (0.8 of the worker's share of its GPU), "
            "or 0/false/'off' (no spilling)")
_OFF = ("0", "false", "off", "no")
_TRUE_ENV = ("1", "on", "true", "yes")


# --------------------------------------------------------------------------- parsing
def parse_limit(value: Any) -> float | int | bool | None:
    """``None``: default; ``False``: off; ``float`` in (0, 1]: fraction; ``int``: bytes."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto", "default", "null")):
        return None
    if value is False or value == 0 or (isinstance(value, str) and value.strip().lower() in _OFF):
        return False
    if value is True or not isinstance(value, (int, float, str)):
        raise ValueError(ACCEPTED)
    text = str(value).strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        try:
            number = parse_bytes(text)
        except (ValueError, KeyError, TypeError):
            raise ValueError(ACCEPTED) from None
        if number <= 0:
            raise ValueError(ACCEPTED)
        return int(number)
    if math.isnan(number) or math.isinf(number) or number < 0:
        raise ValueError(ACCEPTED)
    if text.endswith("%") and number > 1:
        raise ValueError("a percentage up to 100%, or " + ACCEPTED)
    if number == 0:
        return False
    return float(number) if number <= 1 else int(number)


def parse_stats_level(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    try:
        level = int(value)
    except (TypeError, ValueError):
        level = -1
    if level < 0:
        raise ValueError("an integer >= 0 (cuDF's spill statistics level)")
    return level


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [
        Option(KEY, None,
               "Device memory each worker may hold in GPU objects before the least recently used move to host "
               "memory (then to disk under distributed's own limits): bytes ('8GB', '8GiB') or a fraction of "
               "the worker's GPU (0.8); null/'auto': 0.8 of the worker's share of its GPU; 0/false: off.",
               parse_limit, ACCEPTED, dask_cuda_kwarg="device_memory_limit",
               dask_cuda_convert=lambda v: None if v == "default" else v, dask_cuda_option="--device-memory-limit"),
        Option(CUDF_KEY, False,
               "Let cuDF spill its own buffers: CUDF_SPILL=1 in workers, client and scheduler; gpudask's device "
               "tier then stands aside (like dask-cuda's --enable-cudf-spill).", parse_bool, "true or false",
               dask_cuda_kwarg="enable_cudf_spill", dask_cuda_convert=bool,
               dask_cuda_option="--enable-cudf-spill/--disable-cudf-spill"),
        Option(CUDF_STATS_KEY, 0,
               "cuDF's spill statistics level (CUDF_SPILL_STATS) when gpudask.spill.cudf is on "
               "(like dask-cuda's --cudf-spill-stats).", parse_stats_level, "an integer >= 0",
               dask_cuda_kwarg="cudf_spill_stats", dask_cuda_option="--cudf-spill-stats"),
        Option(LOG_KEY, False,
               "Log every move between device and host at INFO on the distributed.worker logger "
               "(like dask-cuda's log_spilling).", parse_bool, "true or false",
               dask_cuda_kwarg="log_spilling", dask_cuda_convert=bool),
    ]


# --------------------------------------------------------------------------- checks
def _shown(ctx: PlanContext, key: str) -> str:
    import dask.config

    setting = ctx.require(key)
    raw = setting.value
    if setting.explicit:
        raw = dask.config.get(key, default=setting.value, config=dict(ctx.user_config or {}))
    return f"{key} = {raw!r} (from {setting.source})"


@hookimpl
def gpudask_validate(ctx: PlanContext) -> None:
    """A bare number below 1 MiB is bytes, but surely not what was meant: refuse it."""
    value = ctx.value(KEY)
    if isinstance(value, int) and not isinstance(value, bool) and value < MIN_BARE_BYTES:
        guesses = [f"'{value}GB'"]
        if value < 10:
            guesses.append(f"{value / 10:g}")
        elif value <= 100:
            guesses.append(f"{value / 100:g}")
        raise ConfigError(f"{_shown(ctx, KEY)} is {value} bytes? a bare number is bytes; did you mean "
                          f"{' or '.join(guesses)}? accepted: at least {MIN_BARE_BYTES} bytes, or {ACCEPTED}")


def _cudf_spilling(ctx: PlanContext) -> str | None:
    """Why cuDF spills its own buffers in this cluster, or None."""
    if ctx.value(CUDF_KEY):
        return f"{CUDF_KEY} = true (from {ctx.require(CUDF_KEY).source})"
    env = (ctx.user_env or {}).get("CUDF_SPILL")
    if env is not None and env.strip().lower() in _TRUE_ENV:
        return f"CUDF_SPILL={env} is set in the environment"
    return None


# --------------------------------------------------------------------------- planning
@hookimpl
def gpudask_plan_process(ctx: PlanContext, plan: ProcessPlan) -> None:
    """CUDF_SPILL where cuDF objects are made or received: workers, client, scheduler."""
    if plan.role == "nanny" or not ctx.value(CUDF_KEY):
        return
    where = {"worker": "cuDF spills this worker's device buffers to host itself",
             "client": "cuDF objects made or received in the client spill the same way as in workers",
             "scheduler": "cuDF objects the scheduler deserialises spill the same way as in workers "
                          "(dask-cuda only warns about this process)"}[plan.role]
    plan.set_env("CUDF_SPILL", "1", f"{_shown(ctx, CUDF_KEY)}: {where}")
    level = ctx.value(CUDF_STATS_KEY)
    if level:
        plan.set_env("CUDF_SPILL_STATS", str(level), f"{_shown(ctx, CUDF_STATS_KEY)}")
    if plan.role == "worker" and not ctx.facts.packages.get("cudf"):
        ctx.warn(f"{CUDF_KEY} is on but cudf is not installed on this host: CUDF_SPILL has no effect")


def _gpu_memory(ctx: PlanContext, plan: ProcessPlan) -> tuple[int, str] | None:
    """Device memory of the worker's own GPU (or MIG instance) and a label for messages."""
    gpus = ctx.gpus
    if not gpus:
        return None
    for gpu in gpus:
        for inst in (gpu.mig.get("instances") or []) if gpu.mig.get("enabled") else []:
            if inst.get("uuid") == plan.gpu:
                return int(inst.get("memory_total") or 0), f"MIG instance {plan.gpu} of GPU {gpu.index}"
    gpu = next((g for g in gpus if g.index == plan.gpu_index), None) or gpus[(plan.index or 0) % len(gpus)]
    return int(gpu.memory_total), f"GPU {gpu.index} ({gpu.name}, {gpu.memory_total / 2**30:.1f} GiB)"


def _gib(n: int) -> str:
    return f"{n} bytes ({n / 2**30:.2f} GiB)"


@hookimpl
def gpudask_plan_finish(ctx: PlanContext, plan: ProcessPlan) -> None:
    if plan.role != "worker":
        return
    found = _gpu_memory(ctx, plan)
    if found is None:
        plan.note("skipped", "no GPU visible: no device memory limit, nothing to spill")
        return
    memory, label = found
    if memory <= 0:
        plan.note("skipped", f"{label} reports no memory: no device memory limit")
        return
    who = f"worker {plan.index}"
    cudf = _cudf_spilling(ctx)
    value = ctx.value(KEY)
    if cudf:
        return _set(plan, None, f"no device tier: {cudf}, so cuDF moves its own buffers to host; a second "
                                f"spiller over the same memory would move them twice")
    if value is False:
        return _set(plan, None, f"spilling off: {_shown(ctx, KEY)}; GPU objects stay on the device until "
                                f"out of memory")
    sharing = workers_sharing_gpu(ctx, plan)
    k = max(1, len(sharing))
    pool_max = plan.section("rmm").get("maximum_pool_size")
    if value is None:
        limit = int(DEFAULT_FRACTION * memory / k)
        why = (f"default {DEFAULT_FRACTION:g} of {label}"
               + (f" split between the {k} workers sharing it" if k > 1 else "") + f" = {_gib(limit)}")
        if isinstance(pool_max, int) and limit > pool_max:
            limit = int(DEFAULT_FRACTION * pool_max)
            why = (f"default {DEFAULT_FRACTION:g} of the RMM pool's maximum size {pool_max} bytes (plugin rmm; "
                   f"smaller than {DEFAULT_FRACTION:g} of the worker's share of {label}) = {_gib(limit)}")
    else:
        limit = int(value * memory) if isinstance(value, float) else int(value)
        what = f"{value:g} of {label} = {_gib(limit)}" if isinstance(value, float) else _gib(limit)
        if limit <= 0:
            raise ConfigError(f"{_shown(ctx, KEY)} is 0 bytes on {label} of {who}; accepted: {ACCEPTED}")
        if limit * k > memory:
            sharing_text = f" x {k} workers sharing it" if k > 1 else ""
            raise ConfigError(f"{_shown(ctx, KEY)} = {limit} bytes{sharing_text} is more than {label} of {who} "
                              f"has ({memory} bytes); accepted: at most {memory // k} bytes or a fraction "
                              f"<= {1 / k:g}")
        if isinstance(pool_max, int) and limit > pool_max:
            raise ConfigError(f"{_shown(ctx, KEY)} = {limit} bytes is above the RMM pool's maximum size "
                              f"{pool_max} bytes for {who} (gpudask.rmm.maximum-pool-size): the pool would run "
                              f"out before spilling starts; accepted: at most {pool_max} bytes")
        why = f"{_shown(ctx, KEY)} = {what}"
    _set(plan, limit, why + ": above it the least recently used GPU objects move to host memory, then disk")


def _set(plan: ProcessPlan, limit: int | None, why: str) -> None:
    plan.set_section({"device_memory_limit": limit}, why, decision=f"memory: device_memory_limit={limit}")


@hookimpl
def gpudask_report_rows(plan: Mapping[str, Any],
                        published: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """The ``spill`` column: the device memory limit above which GPU objects move to host."""
    sections = plan.get("sections") if isinstance(plan, dict) else None
    section = sections.get(name) if isinstance(sections, dict) else None
    limit = section.get("device_memory_limit") if isinstance(section, dict) else None
    if not isinstance(limit, int) or isinstance(limit, bool):
        return None
    return [{"column": "spill", "summary": f"spill > {limit / 2**30:.1f} GiB", "planned": limit, "actual": None,
             "bytes": True, "keys": []}]


# --------------------------------------------------------------------------- applying
@hookimpl
def gpudask_server_setup(ctx: PlanContext, plan: ProcessPlan, server: Scheduler | Worker | Nanny) -> None:
    """Put the device tier in front of the worker's own store (before it holds data)."""
    from distributed import Worker

    if plan.role != "worker" or not isinstance(server, Worker):
        return  # the nanny (--preload-nanny) holds no data
    manager = server.memory_manager
    limit = plan.sections.get(name, {}).get("device_memory_limit")
    if not isinstance(limit, int) or limit <= 0:
        return
    from .store import DeviceHostStore  # distributed and zict: worker processes only

    if isinstance(manager.data, DeviceHostStore):
        return  # already in place (the WorkerPlugin after the preload)
    store = DeviceHostStore(manager.data, limit, log_spilling=bool(ctx.value(LOG_KEY)),
                            worker_name=str(getattr(server, "name", None) or getattr(server, "address", "")))
    # Worker.data reads the memory manager's; the state machine keeps its own reference
    manager.data = store
    server.state.data = store
    add_worker_metric(server, METRIC, store.metrics, replace=True)  # distributed calls it with the worker

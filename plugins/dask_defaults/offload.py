"""distributed's offload threshold, made to take effect in workers (part of gpu-dask-defaults).

distributed hands (de)serialisation of messages above ``distributed.comm.offload`` to a thread,
counting GPU frames too: a 64 MiB GPU pull took 1.83 ms with the hand-off, 0.77 without (H200,
docs/benchmarks.md).  It reads the threshold once, at import of ``distributed.comm.utils`` --
before a worker's plan applies -- so the value is copied into ``OFFLOAD_THRESHOLD`` at server setup."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import Option, offload_threshold, parse_bytes, set_offload_threshold

if TYPE_CHECKING:
    from gpudask.pluginapi import PlanContext, ProcessPlan

OFFLOAD = "gpudask.comm.offload-threshold"
# Measured on one H200 (2026-12-01, lab/bench/pull-levers.py, medians of 15 in-worker pulls, ms at 1 MiB /
# 64 MiB / 1 GiB): distributed's 10 MiB 0.71 / 1.45 / 1.99; 512 MiB 0.57 / 0.58 / 1.73; never 0.91 /
# 0.96 / 1.35; dask cuda worker 0.98 / 1.78 / 2.42.  2 GiB keeps every GPU pull up to 2 GiB inline
# while a host message above it is still handed to a thread.
DEFAULT = "2GiB"
DISTRIBUTED_KEY = "distributed.comm.offload"


def parse_threshold(value: Any) -> int | bool | None:
    """null (distributed's own), false (never offload), or a size in bytes ("512MiB", 2**29)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null", "auto")):
        return None
    if value is False or (isinstance(value, str) and value.strip().lower() in ("false", "off", "no")):
        return False
    if isinstance(value, bool):
        raise ValueError("null, false or a size")
    try:
        size = int(parse_bytes(value)) if isinstance(value, str) else int(value)
    except (ValueError, TypeError, OverflowError):
        size = -1
    if size <= 0 or size > 2**50:
        raise ValueError('null (distributed\'s own, 10 MiB), false (never offload), or a size such as "512MiB"')
    return size


def option() -> Option:
    return Option(OFFLOAD, DEFAULT, "distributed.comm.offload for GPU workers over UCX, made to take effect in "
                  "the worker process: a size (messages larger are (de)serialised in a thread; default 2GiB: GPU "
                  "pulls up to 2 GiB stay on the event loop), false = never, null = distributed's own (10 MiB).",
                  parse_threshold, 'a size such as "2GiB", false, or null')


def plan_offload(ctx: PlanContext, plan: ProcessPlan) -> None:
    """A GPU worker over UCX: the threshold asked for, as distributed.comm.offload."""
    setting = ctx.setting(OFFLOAD)
    if setting is None or setting.value is None or plan.role != "worker":
        return
    if not setting.explicit and not (ctx.uses_ucx and ctx.gpus):
        return  # the default is for GPU workers over UCX: nothing to say elsewhere
    if not (ctx.uses_ucx and ctx.gpus):
        plan.note(f"{OFFLOAD} not applied", "it is for GPU workers over UCX, whose large messages are GPU frames")
        return
    user = ctx.user_dask_config(DISTRIBUTED_KEY)
    if user is not None:
        plan.note(f"{DISTRIBUTED_KEY} kept at {user!r}", "set by the user (explicit settings win)")
        return
    value = setting.value
    what = "never" if value is False else f"above {value} bytes"
    plan.set_config(DISTRIBUTED_KEY, value,
                    f"{OFFLOAD}={value!r} (from {setting.source}): (de)serialisation handed to a thread {what}; "
                    "the hand-off doubled a 64 MiB GPU pull on an H200 (1.83 -> 0.77 ms without it)")


def apply_offload(plan: ProcessPlan) -> None:
    """Make the planned distributed.comm.offload the one distributed's comms read."""
    if plan.role != "worker" or DISTRIBUTED_KEY not in plan.config:
        return
    set_offload_threshold(plan.config[DISTRIBUTED_KEY])


def applied(plan: ProcessPlan) -> dict[str, dict[str, Any]] | None:
    if plan.role != "worker" or DISTRIBUTED_KEY not in plan.config:
        return None
    return {"distributed.comm.utils.OFFLOAD_THRESHOLD": {"planned": plan.config[DISTRIBUTED_KEY],
                                                         "actual": offload_threshold()}}

"""The rmm plugin's settings: ``gpudask.rmm.*``, their parsers and how messages quote them."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import Option, hookimpl, parse_bool, parse_bytes, parse_name_list

if TYPE_CHECKING:
    from gpudask.pluginapi import PlanContext, ProcessPlan

ALLOCATORS = ("pool", "async", "managed", "default")
LIBRARIES = ("cupy", "torch", "numba")
ALIGNMENT = 256
DEFAULT_FRACTION = 0.5
# a default pool of a GPU that several workers share grows at most to its share of this much
# of the GPU: one worker's task cannot take the memory its neighbours' pools are planned on
SHARED_MAXIMUM_FRACTION = 0.9
MAX_WORKERS_PER_GPU = 4096
MAX_RELEASE_WAIT = 600.0
# distributed-ucxx builds a pool from these keys in *every* process that opens UCX
# (``init_once``); gpudask keeps them unset and builds worker pools itself.
UCXX_POOL_KEYS = ("distributed-ucxx.rmm.pool-size", "distributed.rmm.pool-size")
SIZE_FORM = ("a size (4GB = 4*10**9 bytes, 4GiB = 2**32, 4000000000) or a fraction of the GPU's memory "
             "(0.5, '0.5', '50%')")
_OFF_WORDS = ("off", "false", "no", "disabled")


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def share_of(total: int, workers: int, fraction: float = DEFAULT_FRACTION) -> int:
    return int(fraction * total / max(1, workers)) // ALIGNMENT * ALIGNMENT


def share_maximum(total: int, workers: int) -> int | None:
    """A shared GPU's default pool stops growing at its share of :data:`SHARED_MAXIMUM_FRACTION` (None: one worker)."""
    return None if workers <= 1 else share_of(total, workers, SHARED_MAXIMUM_FRACTION)


# --------------------------------------------------------------------------- parsing
def _parse_size(value: Any) -> float | int:
    """``float`` in (0, 1] = fraction of the GPU, ``int`` > 1 = bytes, ``0`` = zero; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(SIZE_FORM)
    if isinstance(value, str):
        text = value.strip()
        percent = text.endswith("%")
        try:
            number = float(text[:-1]) / 100 if percent else float(text)
        except ValueError:
            if percent or not text:
                raise ValueError(SIZE_FORM) from None
            try:
                nbytes = parse_bytes(text)
            except (ValueError, KeyError, TypeError):
                raise ValueError(SIZE_FORM) from None
            if nbytes < 0:
                raise ValueError("a non-negative size: " + SIZE_FORM) from None
            return int(nbytes)
        if percent and not 0 <= number <= 1:
            raise ValueError("a percentage from 0% to 100%, or " + SIZE_FORM)
    else:
        number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise ValueError(SIZE_FORM)
    if number < 0:
        raise ValueError("a non-negative size: " + SIZE_FORM)
    if number == 0:
        return 0
    if number <= 1:
        return float(number)
    if number < 2**20 and not (isinstance(value, str) and text.isdigit() and len(text) > 6):
        # a bare number is bytes: 2 means two bytes, which is almost certainly not meant
        raise ValueError(f"{SIZE_FORM} -- {value!r} would be {int(number)} bytes (a bare number is bytes): did "
                         f"you mean '{value}GB' or {number / 10 ** len(str(int(number))):g} (a fraction)?")
    return int(number)


def parse_pool_size(value: Any) -> float | int | bool | None:
    """``None`` = auto (gpudask decides), ``False`` = no pool, else a size."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    if isinstance(value, str) and not value.strip():
        raise ValueError("'auto' (or unset), false/'off'/0 (no pool), or " + SIZE_FORM
                         + " -- an empty value is none of these")
    if value is False or (isinstance(value, str) and value.strip().lower() in _OFF_WORDS):
        return False
    size = _parse_size(value)
    return False if size == 0 else size


def parse_threshold(value: Any) -> float | int | None:
    """A size or null; zero is allowed (release everything at each synchronisation)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    return _parse_size(value)


def parse_optional_size(value: Any) -> float | int | None:
    """A size or null; zero is refused (a zero maximum or scheduler pool means nothing)."""
    size = parse_threshold(value)
    if size == 0:
        raise ValueError("a size greater than 0 or null: " + SIZE_FORM)
    return size


def parse_workers_per_gpu(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto", "null", "none")):
        return None
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, bool) or not (isinstance(text, int) or (isinstance(text, str) and text.isascii()
                                                               and text.isdigit() and len(text) <= 5)) \
            or not 1 <= int(text) <= MAX_WORKERS_PER_GPU:
        raise ValueError(f"an integer from 1 to {MAX_WORKERS_PER_GPU}, or null (counted)")
    return int(text)


def parse_release_wait(value: Any) -> float:
    try:
        number = float(value.strip() if isinstance(value, str) and len(value) < 40 else value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or math.isnan(number) or not 0 <= number <= MAX_RELEASE_WAIT:
        raise ValueError(f"a number of seconds from 0 to {MAX_RELEASE_WAIT:g}") from None
    return number


def parse_allocator(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return None
    if isinstance(value, str) and value.strip().lower() in ALLOCATORS:
        return value.strip().lower()
    raise ValueError(" | ".join(ALLOCATORS) + " or null (auto)")


def parse_libraries(value: Any) -> list[str]:
    if value is False or (isinstance(value, str) and value.strip().lower() in ("none", "off")):
        return []
    names = [n.lower() for n in parse_name_list(value)]
    bad = [n for n in names if n not in LIBRARIES]
    if bad:
        raise ValueError(f"a list of library names among {', '.join(LIBRARIES)} (not {', '.join(bad)})")
    return list(dict.fromkeys(names))


def parse_log_directory(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, (str, os.PathLike)):
        return os.path.expanduser(os.fspath(value))
    raise ValueError("a directory path or null")


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [
        Option("gpudask.rmm.pool-size", None,
               "Initial RMM pool size of each worker: bytes ('4GB', '4GiB') or a fraction of its GPU (0.5); "
               "null/'auto': a pool of 0.5 of the GPU when UCX uses NVLink or InfiniBand, else none; "
               "false/'off'/0: no pool.",
               parse_pool_size, SIZE_FORM + ", 'auto'/null, or false/'off'/0 (no pool)",
               legacy=UCXX_POOL_KEYS, dask_cuda_kwarg="rmm_pool_size",
               dask_cuda_option="--rmm-pool-size"),
        Option("gpudask.rmm.maximum-pool-size", None,
               "Largest size the pool may grow to (same forms as pool-size); null: no limit.",
               parse_optional_size, SIZE_FORM + " or null (no limit)", dask_cuda_kwarg="rmm_maximum_pool_size",
               dask_cuda_option="--rmm-maximum-pool-size"),
        Option("gpudask.rmm.allocator", None,
               "pool (RMM pool), async (cudaMallocAsync), managed (CUDA managed memory), "
               "default (cudaMalloc through RMM, no pool); null: pool when a pool is wanted.",
               parse_allocator, " | ".join(ALLOCATORS) + " or null (auto)",
               # dask-cuda's rmm_async=True is the async allocator; False (its default) sets nothing
               dask_cuda_kwarg="rmm_async", dask_cuda_convert=lambda v: "async" if v else None,
               dask_cuda_option="--rmm-async/--no-rmm-async"),
        Option("gpudask.rmm.managed-memory", False,
               "Back the pool with CUDA managed memory (like dask-cuda's --rmm-managed-memory).",
               parse_bool, "true or false", dask_cuda_kwarg="rmm_managed_memory", dask_cuda_convert=bool,
               dask_cuda_option="--rmm-managed-memory/--no-rmm-managed-memory"),
        Option("gpudask.rmm.release-threshold", None,
               "async allocator only: memory kept reserved by the driver's pool (same forms as pool-size).",
               parse_threshold, SIZE_FORM + " or null", dask_cuda_kwarg="rmm_release_threshold",
               dask_cuda_option="--rmm-release-threshold"),
        Option("gpudask.rmm.log-directory", None,
               "Write one RMM allocation log per worker into this directory "
               "(rmm-<host>-worker-<n>.dev0.log); slows allocation.",
               parse_log_directory, "a directory path or null", dask_cuda_kwarg="rmm_log_directory",
               dask_cuda_option="--rmm-log-directory"),
        Option("gpudask.rmm.track-allocations", False,
               "Wrap the allocator in RMM's TrackingResourceAdaptor: distributed's rmm-used metric then "
               "shows live bytes.", parse_bool, "true or false", dask_cuda_kwarg="rmm_track_allocations",
               dask_cuda_convert=bool, dask_cuda_option="--rmm-track-allocations/--no-rmm-track-allocations"),
        Option("gpudask.rmm.libraries", ["cupy"],
               "Libraries whose GPU allocations go through RMM in workers (cupy, numba, torch).",
               parse_libraries, "a list among cupy, numba, torch (or [])",
               # dask-cuda's rmm_allocator_external_lib_list: "cupy,torch" or a list
               dask_cuda_kwarg="rmm_allocator_external_lib_list",
               dask_cuda_convert=lambda v: [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v,
               dask_cuda_option="--set-rmm-allocator-for-libs"),
        Option("gpudask.rmm.workers-per-gpu", None,
               "How many workers share each GPU of this host, across all its gpudask commands; a default pool is "
               "0.5 of the GPU split between them. null: counted (this command's workers plus those of this user's "
               "other running gpudask commands, from their host plans in the state directory).",
               parse_workers_per_gpu, f"an integer from 1 to {MAX_WORKERS_PER_GPU}, or null (counted)"),
        Option("gpudask.rmm.release-wait", 30.0,
               "Seconds a starting worker waits for GPU memory being released (its predecessor's pool after a "
               "restart or a kill) before it sizes its pool against what is free.",
               parse_release_wait, f"a number of seconds from 0 to {MAX_RELEASE_WAIT:g}"),
        Option("gpudask.rmm.scheduler-pool-size", None,
               "A pool in the scheduler, built by distributed-ucxx when the scheduler uses UCX "
               "(it then receives CUDA frames into device memory); null: none.",
               parse_optional_size, SIZE_FORM + " or null (none)"),
    ]


# --------------------------------------------------------------------------- settings
@dataclass
class RmmSettings:

    pool_size: Any
    maximum: Any
    allocator: str | None
    managed: bool
    threshold: Any
    log_directory: str | None
    track: bool
    libraries: list[str]
    scheduler_pool: Any
    workers_per_gpu: int | None = None
    release_wait: float = 30.0


def read_settings(ctx: PlanContext) -> RmmSettings:
    return RmmSettings(*(ctx.value(f"gpudask.rmm.{option}") for option in (
        "pool-size", "maximum-pool-size", "allocator", "managed-memory", "release-threshold", "log-directory",
        "track-allocations", "libraries", "scheduler-pool-size", "workers-per-gpu", "release-wait")))


def shown(ctx: PlanContext, key: str) -> str:
    """``key = <value as the user wrote it> (from <source>)`` for messages and reasons."""
    import dask.config

    setting = ctx.require(key)
    where = key
    if setting.source.startswith("legacy key "):
        where = setting.source[len("legacy key "):]
    raw = setting.value
    if setting.explicit and ctx.user_config:
        raw = dask.config.get(where, default=setting.value, config=dict(ctx.user_config))
    return f"{key} = {raw!r} (from {setting.source})"


def allocator_kind(s: RmmSettings, want_pool: bool, managed: bool) -> str | None:
    if s.allocator == "async":
        return "async"
    if want_pool:
        return "pool"
    if managed:
        return "managed"
    if s.allocator == "default":
        return "default"
    return None

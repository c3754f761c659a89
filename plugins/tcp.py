"""The base UCX transport (tcp), the transport mode, and the plain-TCP fallback.

This plugin owns what every UCX process needs whatever the hardware: the
``gpudask.transport.mode`` switch, ``tcp`` in ``UCX_TLS``, the connect timeout, an
interface the user names, and the one clear error when ``--protocol ucx`` is asked
for without distributed-ucxx.  The helpers below are shared with the ``nvlink`` and
``infiniband`` plugins, which decide the CUDA and InfiniBand transports the same way
(auto / explicit / ucx-auto, explicit settings win).  See docs/transports.md.
"""

from __future__ import annotations

from typing import Any

from gpudask import hookimpl
from gpudask.config import Option, choice, parse_optional_bool
from gpudask.errors import ConfigError

name = "tcp"
priority = 50

MODE = "gpudask.transport.mode"
TCP = "gpudask.transport.tcp"
INTERFACE = "gpudask.transport.interface"
CONNECT_TIMEOUT = "gpudask.transport.connect-timeout"
CONNECT_KEY = "distributed.comm.timeouts.connect"

AUTO, EXPLICIT, UCX_AUTO = "auto", "explicit", "ucx-auto"
# processes that move GPU data; the nanny host and the scheduler never do
GPU_ROLES = ("worker", "client")


# -- parsers -------------------------------------------------------------------------
def parse_name_or_list(value: Any) -> str | list[str] | None:
    """null/"auto" (detect), one name for every process, or a list (worker i gets item i mod length)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto", "none", "null")):
        return None
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) and v.strip() for v in value):
        return [v.strip() for v in value]
    raise ValueError("null (auto), a name, or a non-empty list of names (worker i takes item i mod length)")


def parse_timeout(value: Any) -> float | None:
    """Seconds (a number) or a dask duration ("30s", "2 minutes"); null leaves distributed's default."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        return None
    from dask.utils import parse_timedelta

    try:
        seconds = parse_timedelta(value, default="seconds")
    except (ValueError, TypeError, KeyError, AttributeError):
        seconds = None
    if isinstance(value, bool) or seconds is None or not seconds > 0:
        raise ValueError('a positive number of seconds or a duration such as "30s", or null')
    return float(seconds)


@hookimpl
def gpudask_config_options():
    return [
        Option(MODE, AUTO, "How UCX transports are chosen: auto (from the hardware, per worker), explicit (only the "
               "gpudask.transport.* / distributed-ucxx.* flags the user set to true), ucx-auto (UCX_TLS=all and the "
               "CUDA context created first: UCX chooses, dask-cuda's default since 22.02).",
               choice(AUTO, EXPLICIT, UCX_AUTO), "auto | explicit | ucx-auto"),
        Option(TCP, None, "tcp in UCX_TLS: null = auto (always with UCX), true, false.", parse_optional_bool,
               "true, false or null (auto)", legacy=("distributed.comm.ucx.tcp", "distributed-ucxx.tcp")),
        Option(INTERFACE, None, "Network interface the scheduler, nanny and workers listen on: null = auto (the "
               "netdev of the InfiniBand port nearest each worker's GPU), a name (ib0), or a list (worker i takes "
               "item i mod length).", parse_name_or_list, "null, a name or a list of names"),
        Option(CONNECT_TIMEOUT, None, "Connect timeout of every comm (UCX included), as distributed.comm.timeouts."
               "connect: seconds or a duration such as \"30s\"; null keeps distributed's.", parse_timeout,
               'a positive number of seconds, a duration such as "30s", or null',
               legacy=("distributed.comm.ucx.connect-timeout",)),
    ]


# -- helpers shared with the nvlink and infiniband plugins ----------------------------
def setting(ctx: Any, key: str) -> Any:
    """The Setting of ``key``, or None when the plugin declaring it is not loaded.

    (The settings are read from the user's config: what gpudask applied in this process
    is taken out by the core, see ``runtime.user_config``.)
    """
    try:
        return ctx.settings.get(key)
    except KeyError:
        return None


def mode(ctx: Any) -> str:
    s = setting(ctx, MODE)
    return s.value if s is not None else AUTO


def mode_why(ctx: Any) -> str:
    s = setting(ctx, MODE)
    return f"{MODE}={mode(ctx)}" + (f" (from {s.source})" if s is not None and s.explicit else "")


def user_tls(ctx: Any) -> str | None:
    """UCX_TLS as the user exported it (None when unset)."""
    return ctx.user_env.get("UCX_TLS") or None


# UCX_TLS aliases (ucx_info -c / UCX docs) for the transports gpudask contributes
_ALIASES = {
    "cuda": {"cuda_copy", "cuda_ipc"},
    "ib": {"rc"},
    "rc_v": {"rc"}, "rc_x": {"rc"}, "rc_verbs": {"rc"}, "rc_mlx5": {"rc"},
}


def tls_enables(tls: str, transport: str) -> bool:
    """Does a UCX_TLS value (``"tcp,cuda_copy"``, ``"all"``, ``"^cuda"``) let UCX use ``transport``?"""
    items = [t.strip().lower() for t in tls.split(",") if t.strip()]
    negate = bool(items) and items[0].startswith("^")
    if negate:
        items[0] = items[0][1:]
    named = any(item == "all" or item.rstrip("\\") == transport or transport in _ALIASES.get(item.rstrip("\\"), ())
                for item in items)
    return named != negate


def ucx_supports(facts: Any, transport: str) -> bool | None:
    """Whether this host's UCX lists ``transport`` (``rc`` matches rc_verbs/rc_mlx5); None when unknown."""
    if facts.ucx_transports is None:
        return None
    return any(t == transport or t.startswith(transport + "_") for t in facts.ucx_transports)


def process_gpu(ctx: Any, plan: Any) -> tuple[Any, str]:
    """(GPU this process uses, how we know) for workers and clients; (None, why) otherwise."""
    if plan.role not in GPU_ROLES:
        return None, f"the {plan.role} process moves no GPU data"
    gpus = ctx.gpus
    if not gpus:
        return None, "no GPU visible"
    if plan.role == "worker" and plan.gpu_index is not None:
        return ctx.facts.gpu_by_index(plan.gpu_index), f"worker {plan.index} uses GPU {plan.gpu_index}"
    first = gpus[0]
    if plan.role == "client":
        return first, f"the client uses the first visible GPU, {first.index}"
    return first, (f"worker {plan.index} has no GPU of its own (gpu-pinning not loaded): CUDA device 0 is "
                   f"GPU {first.index}")


def workers_on_gpu(ctx: Any, plan: Any, gpu: Any) -> list[int]:
    """Worker numbers of this host that use ``gpu`` (round-robin over the visible GPUs, as gpu-pinning does)."""
    gpus = ctx.gpus
    if plan.role == "worker" and plan.gpu_index is None:
        return list(range(ctx.nworkers))  # unpinned: every worker uses CUDA device 0
    return [j for j in range(ctx.nworkers) if gpus[j % len(gpus)].index == gpu.index]


def pick(value: Any, index: int | None) -> str:
    """One item of a name-or-list setting for worker ``index``."""
    if isinstance(value, list):
        return value[(index or 0) % len(value)]
    return value


def decide(ctx: Any, key: str, transport: str, detected: bool, detect_why: str,
           implied_by: tuple[str, ...] = ()) -> tuple[bool, str, bool]:
    """Whether to use ``transport``: (on, why, explicit).  Explicit settings win over detection:
    UCX_TLS in the environment, then the option ``key`` (or its legacy keys), then mode explicit
    (where ``transport`` is on only if one of the ``implied_by`` options is true, as in
    distributed-ucxx: nvlink and infiniband imply tcp, nvlink implies cuda-copy)."""
    tls = user_tls(ctx)
    if tls is not None:
        on = tls_enables(tls, transport)
        return on, (f"UCX_TLS={tls} set in the environment {'names' if on else 'leaves out'} {transport} "
                    f"(explicit settings win; detection: {detect_why})"), True
    s = setting(ctx, key)
    if s is not None and s.value is not None:
        return s.value, (f"{key}={s.value} (from {s.source}): explicit settings win "
                         f"(detection: {detect_why})"), True
    if mode(ctx) == EXPLICIT:
        for other in implied_by:
            o = setting(ctx, other)
            if o is not None and o.value is True:
                return True, f"{mode_why(ctx)}: implied by {other}=True (from {o.source})", True
        return False, f"{mode_why(ctx)} and {key} not set (detection: {detect_why})", True
    return detected, detect_why, False


def set_flag(ctx: Any, plan: Any, flag: str, value: bool, why: str) -> None:
    """distributed-ucxx.<flag>, so distributed-ucxx's own view of the transports agrees with UCX_TLS."""
    plan.set_config(f"distributed-ucxx.{flag}", value, why)


# -- hooks -----------------------------------------------------------------------------
def ucxx_package(cuda_major: int | None) -> str:
    if cuda_major in (12, 13):
        return f"distributed-ucxx-cu{cuda_major}"
    return "distributed-ucxx-cu12 or distributed-ucxx-cu13 (the one matching the CUDA major version)"


@hookimpl
def gpudask_validate(ctx):
    packages = ctx.facts.packages
    if ctx.uses_ucx and "distributed-ucxx" in packages and packages["distributed-ucxx"] is None:
        major = ctx.facts.cuda_major
        driver = f"CUDA {major} driver" if major is not None else "no CUDA driver found"
        raise ConfigError(f"protocol {ctx.protocol!r} needs distributed-ucxx, which is not installed on "
                          f"{ctx.facts.hostname} ({driver}): pip install {ucxx_package(major)}")
    interface = setting(ctx, INTERFACE)
    if interface is not None and interface.value is not None:
        names = interface.value if isinstance(interface.value, list) else [interface.value]
        missing = [n for n in names if n not in ctx.facts.net_interfaces]
        if missing:
            ctx.warn(f"{INTERFACE}={interface.value!r} (from {interface.source}): {', '.join(missing)} is not an "
                     f"interface of {ctx.facts.hostname} (it has {', '.join(sorted(ctx.facts.net_interfaces))})")


@hookimpl
def gpudask_select_transport(ctx, plan):
    timeout = setting(ctx, CONNECT_TIMEOUT)
    if timeout is not None and timeout.value is not None:
        plan.set_config(CONNECT_KEY, f"{timeout.value:g}s",
                        f"{CONNECT_TIMEOUT} (from {timeout.source}): distributed's connect() retries until this "
                        "timeout for every comm, UCX included (ucxx 0.52 uses no timeout of its own there)")
    interface = setting(ctx, INTERFACE)
    if interface is not None and interface.value is not None and plan.role != "client":
        if plan.role == "worker" or not isinstance(interface.value, list):
            plan.set_interface(pick(interface.value, plan.index),
                               f"{INTERFACE}={interface.value!r} (from {interface.source}): explicit settings win")
    if not ctx.uses_ucx:
        return
    if mode(ctx) == UCX_AUTO:
        _ucx_auto(ctx, plan)
        return
    support = ucx_supports(ctx.facts, "tcp")
    detected = support is not False
    detect_why = ("the base transport of every UCX process: connection setup and the fallback for data"
                  if detected else "this host's UCX has no tcp transport")
    on, why, _ = decide(ctx, TCP, "tcp", detected, detect_why,
                        implied_by=("gpudask.transport.nvlink", "gpudask.transport.infiniband",
                                    "gpudask.transport.cuda-copy"))
    if on:
        plan.add_ucx_transport("tcp", why)
    else:
        plan.note("no UCX transport tcp", why)
    set_flag(ctx, plan, "tcp", on, "tcp in UCX_TLS" if on else "no tcp in UCX_TLS")


def _ucx_auto(ctx: Any, plan: Any) -> None:
    """UCX chooses: UCX_TLS=all where GPU data moves, all but CUDA elsewhere (no CUDA context there)."""
    gpu, why = process_gpu(ctx, plan)
    if gpu is not None:
        plan.set_env("UCX_TLS", "all", f"{mode_why(ctx)}: UCX chooses among all its transports ({why}; the CUDA "
                                       "context is created first so UCX sees the GPU)")
    else:
        plan.set_env("UCX_TLS", "^cuda", f"{mode_why(ctx)}: UCX chooses among all its transports but CUDA ones "
                                         f"({why}: no CUDA context for UCX here)")

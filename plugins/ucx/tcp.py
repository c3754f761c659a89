"""The base UCX transport (tcp): what this host's UCX offers (facts ``ucx_info``), the transport mode,
``tcp`` in ``UCX_TLS``, the connect timeout, a named interface, and the one clear error when
``--protocol ucx`` is asked for without distributed-ucxx.  See docs/transports.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import (ConfigError, FactsSection, Option, choice, hookimpl, parse_optional_bool, process_gpu,
                               start_ucx)

from . import ucx_info
from .rules import (AUTO, EXPLICIT, INTERFACE, MODE, UCX_AUTO, decide, mode, mode_why, offer, parse_name_or_list, pick,
                    set_tls_flag)

if TYPE_CHECKING:
    from gpudask.pluginapi import Facts, PlanContext, ProcessPlan

name = "tcp"
priority = 50

TCP = "gpudask.transport.tcp"
CONNECT_TIMEOUT = "gpudask.transport.connect-timeout"
CONNECT_KEY = "distributed.comm.timeouts.connect"


def parse_timeout(value: Any) -> float | None:
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
def gpudask_facts_packages() -> dict[str, list[str]]:
    # a ucx:// plan needs distributed-ucxx (gpudask_validate says which one is missing); ucx_info's
    # transports are probed where ucxx or libucx is installed
    return {"ucxx": ["ucxx", "ucxx-cu12", "ucxx-cu13"], "libucx": ["libucx", "libucx-cu12", "libucx-cu13"],
            "distributed-ucxx": ["distributed-ucxx", "distributed-ucxx-cu12", "distributed-ucxx-cu13"]}


def _likely_ucx(facts: Facts) -> bool:
    # GPU clusters mostly run UCX: a GPU host with distributed-ucxx installed
    return bool(facts.visible_gpus()) and facts.packages.get("distributed-ucxx") is not None


@hookimpl
def gpudask_likely_protocol(facts: Facts) -> str | None:
    """UCX on a GPU host with distributed-ucxx (a ``dask worker`` beside its scheduler plans for it ahead)."""
    return "ucx" if _likely_ucx(facts) else None


@hookimpl
def gpudask_listen_ahead(ctx: PlanContext, plan: ProcessPlan) -> None:
    """UCX started now (distributed-ucxx's own ``init_once``, with the plan applied), not at the nanny's
    first ``listen()``: about 1 s of an H200 host's start, overlapped with the scheduler's."""
    if ctx.uses_ucx and ctx.facts.packages.get("distributed-ucxx") is not None:
        start_ucx()


@hookimpl
def gpudask_preimport(facts: Facts, role: str, protocol: str | None) -> list[str] | None:
    """distributed-ucxx's comm, ucxx and rmm (about 0.9 s of imports on an H200), for a worker likely over UCX."""
    likely_ucx = protocol in ("ucx", "ucxx") or (protocol is None and _likely_ucx(facts))
    if not likely_ucx or facts.packages.get("distributed-ucxx") is None:
        return None
    return ["distributed_ucxx.ucxx", "ucxx"] + (["rmm"] if facts.packages.get("rmm") else [])


@hookimpl
def gpudask_facts_sections() -> list[FactsSection]:
    """What this host's UCX offers, as ``ucx_info`` says (:mod:`.ucx_info`)."""
    return list(ucx_info.SECTIONS)


@hookimpl
def gpudask_ucx_offered(facts: Facts) -> list[str] | None:
    # the core checks the user's UCX_TLS against UCX's names and these
    return ucx_info.transports(facts)


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [
        Option(MODE, AUTO, "How UCX transports are chosen: auto (from the hardware, per worker), explicit (only the "
               "gpudask.transport.* / distributed-ucxx.* flags the user set to true), ucx-auto (UCX_TLS=all and the "
               "CUDA context created first: UCX chooses, dask-cuda's default since 22.02).",
               choice(AUTO, EXPLICIT, UCX_AUTO), "auto | explicit | ucx-auto"),
        Option(TCP, None, "tcp in UCX_TLS: null = auto (always with UCX), true, false.", parse_optional_bool,
               "true, false or null (auto)", legacy=("distributed.comm.ucx.tcp", "distributed-ucxx.tcp"),
               dask_cuda_kwarg="enable_tcp_over_ucx",
               dask_cuda_option="--enable-tcp-over-ucx/--disable-tcp-over-ucx", ucx_only=True),
        Option(INTERFACE, None, "Network interface the scheduler, nanny and workers listen on: null = auto (the "
               "netdev of the InfiniBand port nearest each worker's GPU), a name (ib0), or a list (worker i takes "
               "item i mod length).", parse_name_or_list, "null, a name or a list of names"),
        Option(CONNECT_TIMEOUT, None, "Connect timeout of every comm (UCX included), as distributed.comm.timeouts."
               "connect: seconds or a duration such as \"30s\"; null keeps distributed's.", parse_timeout,
               'a positive number of seconds, a duration such as "30s", or null'),
    ]


def ucxx_package(cuda_major: int | None) -> str:
    """What to install for UCX, pinned as gpudask's extras pin it (unpinned, pip may pick an empty 0.44.0)."""
    if cuda_major in (12, 13):
        return _pinned(f"distributed-ucxx-cu{cuda_major}")
    return f"{_pinned('distributed-ucxx-cu12')} or {_pinned('distributed-ucxx-cu13')} (the one matching the CUDA " \
           "major version)"


def _pinned(name: str) -> str:
    """``name`` as gpudask's installed metadata pins it (quoted for a shell), or ``name`` alone."""
    from importlib import metadata

    try:
        requirements = metadata.requires("gpudask") or []
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return name
    for requirement in requirements:
        spec = requirement.split(";", 1)[0].replace(" ", "")
        if spec.startswith(name + "=="):
            return f"'{spec}'"
    return name


@hookimpl
def gpudask_validate(ctx: PlanContext) -> None:
    packages = ctx.facts.packages
    if ctx.uses_ucx and "distributed-ucxx" in packages and packages["distributed-ucxx"] is None:
        major = ctx.facts.cuda_major
        driver = f"CUDA {major} driver" if major is not None else "no CUDA driver found"
        raise ConfigError(f"protocol {ctx.protocol!r} needs distributed-ucxx, which is not installed on "
                          f"{ctx.facts.hostname} ({driver}): pip install {ucxx_package(major)}")
    interface = ctx.setting(INTERFACE)
    if interface is not None and interface.value is not None:
        names = interface.value if isinstance(interface.value, list) else [interface.value]
        missing = [n for n in names if n not in ctx.facts.net_interfaces]
        if missing:
            ctx.warn(f"{INTERFACE}={interface.value!r} (from {interface.source}): {', '.join(missing)} is not an "
                     f"interface of {ctx.facts.hostname} (it has {', '.join(sorted(ctx.facts.net_interfaces))})")


@hookimpl
def gpudask_select_transport(ctx: PlanContext, plan: ProcessPlan) -> None:
    timeout = ctx.setting(CONNECT_TIMEOUT)
    if timeout is not None and timeout.value is not None:
        plan.set_config(CONNECT_KEY, f"{timeout.value:g}s",
                        f"{CONNECT_TIMEOUT} (from {timeout.source}): distributed's connect() retries until this "
                        "timeout for every comm, UCX included (ucxx 0.52 limits each attempt's endpoint creation "
                        "to a fixed 5 s and ignores UCXPY_CONNECT_TIMEOUT there)")
    interface = ctx.setting(INTERFACE)
    if interface is not None and interface.value is not None and (
            plan.role == "worker" or (plan.role != "client" and not isinstance(interface.value, list))):
        plan.set_interface(pick(interface.value, plan.index),
                           f"{INTERFACE}={interface.value!r} (from {interface.source}): explicit settings win")
    if not ctx.uses_ucx:
        return
    _quiet_ucx(ctx, plan)
    if mode(ctx) == UCX_AUTO:
        _ucx_auto(ctx, plan)
        return
    detected = ucx_info.supports(ctx.facts, "tcp") is not False
    detect_why = ("the base transport of every UCX process: connections and fallback"
                  if detected else "this host's UCX has no tcp transport")
    on, why, _ = decide(ctx, TCP, "tcp", detected, detect_why,
                        implied_by=("gpudask.transport.nvlink", "gpudask.transport.infiniband",
                                    "gpudask.transport.cuda-copy"))
    offer(plan, "tcp", on, why)
    set_tls_flag(plan, "tcp", "tcp", on)


def _quiet_ucx(ctx: PlanContext, plan: ProcessPlan) -> None:
    """UCX warns about every UCX_* variable no component reads, ucxx's own included: turn that off in
    gpudask's processes and report the user's own unused variables instead, as UCX judges them."""
    if "UCX_WARN_UNUSED_ENV_VARS" in ctx.user_env:
        plan.note("UCX's unused-variable warning left as set",
                  f"UCX_WARN_UNUSED_ENV_VARS={ctx.user_env['UCX_WARN_UNUSED_ENV_VARS']} is set: explicit settings win")
        return
    plan.set_env("UCX_WARN_UNUSED_ENV_VARS", "n",
                 "UCX warns about variables ucxx itself sets (UCX_MEMTYPE_CACHE); gpudask reports the user's "
                 "own unused ones")
    if plan.role != "scheduler" or ctx.planner == "worker":
        # once per host plan; a worker process planning for itself applies only its own part: UCX's
        # view of the user's variables (a ucx_info run, seconds under load) is for the processes that
        # plan the host (dask scheduler, the dask worker process, a client, gpudask info)
        return
    unused = ucx_info.ucx_unused_variables(dict(ctx.user_env))
    for name, maybe in unused or []:
        ctx.warn(f"{name}={ctx.user_env[name]} is not a variable UCX uses here"
                 + (f" (did you mean {maybe}?)" if maybe else "") + ": UCX ignores it")


def _ucx_auto(ctx: PlanContext, plan: ProcessPlan) -> None:
    """UCX chooses: UCX_TLS=all where GPU data moves, all but CUDA elsewhere (no CUDA context there)."""
    gpu, why = process_gpu(ctx, plan)
    if gpu is not None:
        plan.set_env("UCX_TLS", "all", f"{mode_why(ctx)}: UCX chooses among all its transports ({why}; the CUDA "
                                       "context is created first so UCX sees the GPU)")
    else:
        plan.set_env("UCX_TLS", "^cuda", f"{mode_why(ctx)}: UCX chooses among all its transports but CUDA ones "
                                         f"({why}: no CUDA context for UCX here)")


"""What of its plan a running process lacks, when gpudask is registered on it late: what can
still be applied (dask config read later) and what *needs a restart* (the GPU, the transport,
config read at start), each item naming the plugin that decided it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import dask.config

from gpudask.apply.state import cuda_context, plugin_of
from gpudask.plan.planner import INTERNAL_ENV_PREFIX

logger = logging.getLogger("distributed.gpudask")

# dask config read once, when the process starts or first connects (distributed-ucxx's at
# its init_once): changing it in a running process has no effect
CORE_READ_AT_START = ("distributed-ucxx.", "distributed.comm.ucx.", "distributed.worker.multiprocessing-method",
                      "distributed.nanny.")


def read_at_start(manager: Any) -> tuple[str, ...]:
    """The prefixes of the dask config keys read only when a process starts or first
    connects: the core's and the loaded plugins' (``config_read_at_start``)."""
    declared = [prefix for p in manager.plugins for prefix in p.read_at_start]
    return CORE_READ_AT_START + tuple(dict.fromkeys(declared))


_WHY_ENV = {
    "CUDA_VISIBLE_DEVICES": "the GPU of a process is fixed when CUDA initialises: GPU pinning needs a new "
                            "worker process",
    "UCX_": "UCX reads its environment once, at the process's first listen/connect: the transport needs a new "
            "worker process",
}
_WHY_ENV_OTHER = "environment variables are read by libraries when they load: needs a new worker process"
_WHY_CONFIG = "read when the process starts or opens its first connection: needs a new worker process"
HOW = ("register gpudask.NannyPlugin() and call client.restart(), or start the workers with "
       "`dask worker --preload gpudask`")


def item(what: str, planned: Any, actual: Any, why: str, plugin: str | None) -> dict[str, Any]:
    return {"what": what, "planned": planned, "actual": actual, "why": why, "plugin": plugin}


def missing_in_running_process(plan: Any, ctx: Any, address: str | None = None,
                               read_late: tuple[str, ...] = CORE_READ_AT_START
                               ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What of ``plan`` this running process does not have (``read_late``: :func:`read_at_start`).

    :return: ``(needs_restart, late_config)``: the items only a new process can apply,
        and the dask config keys that can still be set now (key -> planned value).
    """
    needs: list[dict[str, Any]] = []
    late: dict[str, Any] = {}
    for name, value in plan.env.items():
        if name.startswith(INTERNAL_ENV_PREFIX):
            continue
        actual = os.environ.get(name)
        if actual != value:
            why = next((w for prefix, w in _WHY_ENV.items() if name.startswith(prefix)), _WHY_ENV_OTHER)
            needs.append(item(name, value, actual, why, plugin_of(plan, f"{name}=")))
    for key, value in plan.config.items():
        actual = dask.config.get(key, default=None)
        if actual == value:
            continue
        if key.startswith(read_late):
            needs.append(item(key, value, actual, _WHY_CONFIG, plugin_of(plan, f"{key}=")))
        else:
            late[key] = value
    method = plan.multiprocessing_method
    actual_method = dask.config.get("distributed.worker.multiprocessing-method", default=None)
    if method and plan.role in ("worker", "nanny") and actual_method != method:
        needs.append(item("multiprocessing_method", method, actual_method,
                           "worker processes are started by the `dask worker` process (the nanny host): it must "
                           "run with --preload gpudask (or distributed.worker.multiprocessing-method set) from "
                           "its start", plugin_of(plan, "multiprocessing_method=")))
    if plan.interface and not ctx.facts.described and address:
        from distributed.comm.addressing import get_address_host

        host = get_address_host(address)
        ips = ctx.facts.net_interfaces.get(plan.interface) or []
        if host not in ips:
            needs.append(item("interface", plan.interface, host,
                               "a server listens on its interface from its start: needs a new worker process",
                               plugin_of(plan, "interface=")))
    return needs, late


def gpu_matches(plan: Any, ctx: Any) -> bool:
    """Does CUDA in this process pick the planned GPU as device 0?"""
    planned = (plan.cuda_visible_devices or "").split(",")[0].strip()
    if not planned:
        return True
    actual = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    if actual:
        return actual == planned
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    gpus = sorted(ctx.facts.gpus, key=lambda g: g.index)
    return bool(gpus) and planned in (str(gpus[0].index), gpus[0].uuid)


def context_check(plan: Any, ctx: Any) -> dict[str, Any] | None:
    """A CUDA context on another GPU than planned (NVML: creates no context)."""
    if ctx.facts.described or not plan.gpu:
        return None
    found = cuda_context()
    uuid = found.get("uuid")
    if found["exists"] and uuid and uuid != plan.gpu:
        return item("cuda_context", plan.gpu, uuid, "this process already has a CUDA context on another GPU: "
                     "needs a new worker process", plugin_of(plan, "CUDA_VISIBLE_DEVICES="))
    return None


def log_report(what: str, report: dict[str, Any]) -> None:
    needs = report["needs_restart"]
    applied = ", ".join(report["applied"]) or "nothing"
    if needs:
        items = "; ".join(f"{i['what']}={i['planned']!r} (now {i['actual']!r})" for i in needs)
        logger.warning("gpudask: %s: registered on a running process; applied %s; needs a restart: %s -- %s",
                       what, applied, items, HOW)
    else:
        logger.info("gpudask: %s: registered on a running process; applied %s; nothing needs a restart",
                    what, applied)

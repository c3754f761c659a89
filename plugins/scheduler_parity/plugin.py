"""The scheduler has what the workers need (GPU, driver, CUDA, packages).

The scheduler deserialises some data (``client.submit`` arguments, graphs) and, over UCX, receives
the GPU frames it relays; the client deserialises what it gathers.  The scheduler check compares
two processes' published facts here.  A scheduler without a GPU is a supported shape: a UCX one
that cannot receive GPU frames gets :class:`.relay.RelayGuard`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import (Finding, Option, applied_role, facts_from_dict, fingerprint, hookimpl, parse_name_list,
                               remembered, tls_enables)

if TYPE_CHECKING:
    from distributed import Nanny, Scheduler, Worker

    from gpudask.pluginapi import PlanContext, ProcessPlan, ProcessSide

name = "scheduler-parity"
priority = 200

PACKAGES_KEY = "gpudask.scheduler-parity.packages"
DEFAULT_PACKAGES = ["python", "dask", "distributed", "cupy", "rmm", "cudf", "dask-cudf", "ucxx", "distributed-ucxx",
                    "numba", "nvidia-ml-py"]
# packages[key] = the version of the first of these distributions installed: every key the
# comparison may name (the core probes python, dask, distributed, nvidia-ml-py, gpudask itself)
PACKAGE_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "cupy": ("cupy", "cupy-cuda12x", "cupy-cuda13x"),
    **{p: (p, f"{p}-cu12", f"{p}-cu13") for p in ("rmm", "cudf", "dask-cudf", "ucxx", "distributed-ucxx")},
    "numba": ("numba",),
    "dask-cuda": ("dask-cuda",),
    "torch": ("torch",),
}
UCX = ("ucx", "ucxx")
# Compute capability below which RAPIDS (rmm, cudf) does not run (Volta, 7.0).
RAPIDS_MIN_CC = (7, 0)

# What goes wrong where a package is missing (or has another version).
_MISSING_IMPACT = {
    "cupy": "CuPy arrays deserialised there (arguments passed directly to client.submit, the meta of CuPy-backed "
            "collections, gathered results) fail to load",
    "rmm": "it cannot allocate device buffers (rmm.DeviceBuffer) for the GPU frames UCX receives",
    "cudf": "cuDF objects and the meta of cuDF-backed collections fail to unpickle there",
    "dask-cudf": "dask-cudf collections' graphs fail to unpickle there",
    "ucxx": "the ucx:// protocol is not available there",
    "distributed-ucxx": "the ucx:// protocol is not available there",
    "numba": "Numba CUDA objects fail to deserialise there",
    "nvidia-ml-py": "GPU diagnostics (NVML) are not available there",
}
# GPU libraries a scheduler does without: graphs' GPU objects stay host bytes there, results
# pass as host frames (scheduler-no-gpu); ucxx and distributed-ucxx it needs for ucx://
_GPU_ONLY_PACKAGES = ("cupy", "rmm", "cudf", "dask-cudf", "numba")
_VERSION_IMPACT = {
    "python": "pickled functions and objects may not load across Python versions",
    "dask": "graphs may be built and understood differently (distributed warns as well)",
    "distributed": "messages and graphs may be understood differently (distributed warns as well)",
}
_DEFAULT_VERSION_IMPACT = "objects serialised with one version may fail to load with the other"


@hookimpl
def gpudask_facts_packages() -> dict[str, list[str]]:
    """The packages whose versions the scheduler and the workers are compared on (the keys
    gpudask.scheduler-parity.packages may name)."""
    return {key: list(dists) for key, dists in PACKAGE_DISTRIBUTIONS.items()}


@hookimpl
def gpudask_config_options() -> list[Option]:
    return [Option(PACKAGES_KEY, list(DEFAULT_PACKAGES),
                   "Packages whose versions the scheduler check compares between the scheduler, the workers and the "
                   "client ('python' is the interpreter).", parse_name_list, "a list of package names")]


# ----------------------------------------------------------------------- reading sides
def _label(side: Mapping[str, Any]) -> str:
    return f"the {side.get('role') or 'other process'}"


def _facts(side: Any) -> dict[str, Any]:
    facts = side.get("facts") if isinstance(side, dict) else None
    return facts if isinstance(facts, dict) else {}


def _visible_gpus(side: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The GPUs CUDA shows the process; the list is shared by the checks of the same facts:
    read it, do not change it."""
    # once per facts (the scheduler's side comes with every joining worker): by object first (the
    # memo holds a reference, so the id is not reused), else the indices by fingerprint (equal data)
    facts = _facts(side)
    return remembered("scheduler-parity visible GPUs", id(facts), lambda: (facts, _visible_gpus_of(facts)))[1]


def _visible_gpus_of(facts: dict[str, Any]) -> list[dict[str, Any]]:
    try:
        indices = remembered("scheduler-parity visible indices", fingerprint(facts),
                             lambda: [g.index for g in facts_from_dict(facts, "probed").visible_gpus()])
    except Exception:  # noqa: BLE001 - malformed facts: fall back to the list as it is
        return [g for g in facts.get("gpus") or [] if isinstance(g, dict)]
    by_index = {g.get("index"): g for g in facts.get("gpus") or [] if isinstance(g, dict)}
    return [by_index.get(i, {"index": i}) for i in indices]


def _pair(ref: Mapping[str, Any], other: Mapping[str, Any], a: Any, b: Any, **what: Any) -> dict[str, Any]:
    """A finding's details: what is compared, then each side's value under its role."""
    return {**what, ref.get("role") or "reference": a, other.get("role") or "other": b}


def _gpu_names(gpus: list[dict[str, Any]]) -> str:
    names = sorted({str(g.get("name") or "GPU") for g in gpus})
    return f"{len(gpus)} GPU(s) ({', '.join(names)})"


def _cuda(version: Any) -> str:
    return f"{version // 1000}.{version % 1000 // 10}" if isinstance(version, int) and not isinstance(version, bool) \
        else str(version)


def _min_cc(gpus: list[dict[str, Any]]) -> tuple[int, int] | None:
    ccs = [tuple(g["compute_capability"]) for g in gpus
           if isinstance(g.get("compute_capability"), list) and len(g["compute_capability"]) == 2
           and all(isinstance(x, int) for x in g["compute_capability"])]
    return min(ccs) if ccs else None


def _packages(side: Mapping[str, Any]) -> dict[str, Any]:
    packages = _facts(side).get("packages")
    return packages if isinstance(packages, dict) else {}


# ------------------------------------------------------------------------- comparison
def F(severity: str, code: str, message: str, details: dict[str, Any]) -> Finding:  # noqa: N802
    return Finding(severity, code, message, details=details)


def _gpu_presence(ref: Mapping[str, Any], other: Mapping[str, Any], protocol: str | None,
                  ref_gpus: list[dict[str, Any]], other_gpus: list[dict[str, Any]]) -> list[Finding]:
    if bool(ref_gpus) == bool(other_gpus):
        return []
    has, lacks = (other, ref) if other_gpus else (ref, other)
    gpus = other_gpus or ref_gpus
    role = lacks.get("role")
    over_ucx = protocol in UCX
    head = f"{_label(lacks)} has no GPU visible while {_label(has)} has {_gpu_names(gpus)}"
    details = {"has_gpu": has.get("role"), "no_gpu": role, "protocol": protocol}
    if role == "scheduler":
        relay = (f"; over {protocol} it relays the GPU results a client gathers through it as host bytes, and GPU "
                 f"data scattered through it cannot arrive: gpudask clients (gpudask.initialize()) gather and "
                 f"scatter worker-direct, plain clients scatter with direct=True") if over_ucx else ""
        return [F("info", "scheduler-no-gpu",
                  f"{head}: a supported shape. It reads task graphs without making the GPU objects in them "
                  f"(gpu-graph-data: CuPy/cuDF/RMM/Numba objects stay host bytes there, made on the worker that "
                  f"runs the task), so it needs no GPU, no cupy and no CUDA context{relay}", details)]
    if role == "client":
        if over_ucx:
            return [F("error", "client-no-gpu",
                      f"{head} and the protocol is {protocol}: GPU results sent to this client will fail with "
                      f"cudaErrorNoDevice (UCX receives GPU frames into device buffers)", details)]
        return [F("warning", "client-no-gpu",
                  f"{head}: GPU-backed results gathered into this client (CuPy arrays, cuDF frames) cannot be "
                  f"deserialised here", details)]
    return [F("warning", "worker-no-gpu",
              f"{head}: GPU tasks scheduled on this worker will fail (keep them off it with worker resources)",
              details)]


def _driver_and_cuda(ref: Mapping[str, Any], other: Mapping[str, Any], ref_gpus: list[dict[str, Any]],
                     other_gpus: list[dict[str, Any]]) -> list[Finding]:
    out: list[Finding] = []
    if not (ref_gpus and other_gpus):
        return out  # a side without a GPU is reported above; its driver does not matter
    rf, of = _facts(ref), _facts(other)
    a, b = rf.get("driver_version"), of.get("driver_version")
    if a and b and a != b:
        out.append(F("warning", "driver-mismatch",
                     f"NVIDIA driver differs: {_label(ref)} has {a}, {_label(other)} has {b}; the older driver "
                     f"limits the CUDA version and features both sides can use",
                     _pair(ref, other, a, b, key="driver_version")))
    a, b = rf.get("cuda_driver_version"), of.get("cuda_driver_version")
    if a is not None and b is not None and a != b:
        major = isinstance(a, int) and isinstance(b, int) and a // 1000 != b // 1000
        consequence = ("packages built for one CUDA major version (cupy-cuda13x, rmm-cu13 ...) do not run on the "
                       "other" if major else "code built for the newer CUDA may not run on the older driver")
        out.append(F("warning", "cuda-mismatch",
                     f"CUDA driver version differs: {_label(ref)} has CUDA {_cuda(a)}, {_label(other)} has CUDA "
                     f"{_cuda(b)}; {consequence}", _pair(ref, other, a, b, key="cuda_driver_version")))
    ca, cb = _min_cc(ref_gpus), _min_cc(other_gpus)
    if ca and cb:
        for side, cc in ((ref, ca), (other, cb)):
            pk = _packages(side)
            rapids = [p for p in ("rmm", "cudf") if pk.get(p)]
            if cc < RAPIDS_MIN_CC and rapids:
                out.append(F("warning", "compute-capability",
                             f"{_label(side)}'s GPU has compute capability {cc[0]}.{cc[1]}, below the "
                             f"{RAPIDS_MIN_CC[0]}.{RAPIDS_MIN_CC[1]} that {', '.join(rapids)} need: they fail there",
                             {"key": "compute_capability", "role": side.get("role"), "value": list(cc)}))
        if ca[0] != cb[0]:
            out.append(F("info", "compute-capability",
                         f"compute capability differs: {_label(ref)} {ca[0]}.{ca[1]}, {_label(other)} {cb[0]}.{cb[1]} "
                         f"(fine for relaying and deserialising data; kernels built for one only may not run on the "
                         f"other)", _pair(ref, other, list(ca), list(cb), key="compute_capability")))
    return out


def _package_versions(ref: Mapping[str, Any], other: Mapping[str, Any], names: list[str]) -> list[Finding]:
    out = []
    ra, ob = _packages(ref), _packages(other)
    for pkg in names:
        if pkg not in ra or pkg not in ob:
            continue  # unknown on one side (a facts file that does not list it): nothing to compare
        a, b = ra[pkg], ob[pkg]
        if a == b:
            continue
        details = _pair(ref, other, a, b, package=pkg)
        if a is None or b is None:
            has, lacks, version = (other, ref, b) if a is None else (ref, other, a)
            if lacks.get("role") == "scheduler" and pkg in _GPU_ONLY_PACKAGES:
                continue  # the scheduler reads GPU objects in graphs without them (gpu-graph-data)
            impact = _MISSING_IMPACT.get(pkg, _DEFAULT_VERSION_IMPACT)
            out.append(F("warning", "package-missing",
                         f"{pkg} is installed on {_label(has)} ({version}) but not on {_label(lacks)}: {impact}",
                         details))
        else:
            impact = _VERSION_IMPACT.get(pkg, _DEFAULT_VERSION_IMPACT)
            out.append(F("warning", "package-mismatch",
                         f"{pkg} differs: {_label(ref)} has {a}, {_label(other)} has {b}: {impact}", details))
    return out


@hookimpl
def gpudask_scheduler_check(ctx: PlanContext | None, reference: ProcessSide,
                            subject: ProcessSide | None) -> list[Finding] | None:
    """Compare the subject (a worker, or the client) with the reference process."""
    if not isinstance(reference, dict) or not isinstance(subject, dict):
        return []  # the runner reports processes without (valid) gpudask data itself

    ref, other = reference, subject
    protocols = [p for p in (ref.get("protocol"), other.get("protocol")) if isinstance(p, str)]
    protocol = next((p for p in protocols if p in UCX), protocols[0] if protocols else None)
    findings = []
    if len(set(protocols)) > 1:
        findings.append(F("warning", "protocol-mismatch",
                          f"protocol differs: {_label(ref)} uses {ref.get('protocol')}, {_label(other)} uses "
                          f"{other.get('protocol')}; transports and GPU frame handling differ between them",
                          _pair(ref, other, ref.get("protocol"), other.get("protocol"), key="protocol")))
    ref_gpus, other_gpus = _visible_gpus(ref), _visible_gpus(other)
    findings += _gpu_presence(ref, other, protocol, ref_gpus, other_gpus)
    findings += _driver_and_cuda(ref, other, ref_gpus, other_gpus)
    packages = ctx.setting(PACKAGES_KEY) if ctx is not None else None
    names = list(packages.value) if packages is not None else list(DEFAULT_PACKAGES)
    findings += _package_versions(ref, other, names)
    return findings


# ------------------------------------------------------------------ the relay guard
def relay_problem(ctx: PlanContext, plan: ProcessPlan) -> str | None:
    """Why this UCX scheduler cannot receive GPU frames, or None when it can (or is not UCX)."""
    if not ctx.uses_ucx:
        return None
    if not ctx.gpus:
        return "this scheduler sees no GPU"
    tls = plan.env.get("UCX_TLS")
    if tls and not tls_enables(tls, "cuda_copy"):
        return f"this scheduler's UCX_TLS={tls} has no cuda transport"
    return None


def worker_has_gpus(extra: Any) -> bool:
    """Does the worker's published gpudask facts (``WorkerState.extra["gpudask"]``) show a GPU?"""
    published = extra.get("gpudask") if isinstance(extra, dict) else None
    facts = published.get("facts") if isinstance(published, dict) else None
    return isinstance(facts, dict) and bool(_visible_gpus({"facts": facts}))


@hookimpl
def gpudask_server_setup(ctx: PlanContext, plan: ProcessPlan, server: Scheduler | Worker | Nanny) -> None:
    from distributed import Scheduler

    if plan.role != "scheduler" or not isinstance(server, Scheduler) or applied_role() not in ("scheduler", None):
        return  # a LocalCluster's scheduler lives in the client's process, with the client's GPU
    problem = relay_problem(ctx, plan)
    if problem is None:
        return
    from .relay import NAME, RelayGuard

    if NAME not in server.plugins:
        # a scheduler without a GPU cannot unpickle GPU objects either: graphs holding them err with the line
        server.add_plugin(RelayGuard(problem, ctx.protocol, worker_has_gpus, graphs=not ctx.gpus), name=NAME,
                          idempotent=True)

"""The tcp plugin's facts: the transports this host's UCX offers (``{"transports": [...]}``, null
without UCX), and the ``UCX_*`` variables UCX would not use, both from UCX's own ``ucx_info`` (the
libucx wheel's first, what ucxx loads, then ``PATH``'s).  Its answers -- and failures, for a while --
are cached per boot in the private state directory: every ``dask worker`` start would pay for it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import re
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import FactsSection, StateDirError, plugin_state, read_private, state_dir, write_atomic

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from gpudask.pluginapi import Facts

logger = logging.getLogger("distributed.gpudask")

SECTION = "ucx_info"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "x-accepts": 'an object {"transports": [UCX transports] or null}',
    "required": ["transports"],
    "properties": {
        "transports": {
            "type": ["array", "null"],
            "x-accepts": "a list or null",
            "items": {"type": "string", "x-accepts": "a string"},
            "description": "Transports `ucx_info -d` lists; null when UCX is missing.",
        },
    },
}


def transports(facts: Facts) -> list[str] | None:
    """The transports this host's UCX lists; None when unknown (UCX missing, or a described host that does not say)."""
    section = facts.section(SECTION)
    return None if section is None or section["transports"] is None else list(section["transports"])


def supports(facts: Facts, transport: str) -> bool | None:
    """Whether this host's UCX lists ``transport`` (``rc`` matches rc_verbs/rc_mlx5); None when unknown."""
    found = transports(facts)
    return None if found is None else any(t == transport or t.startswith(transport + "_") for t in found)


def probe(facts: Facts) -> dict[str, Any]:
    # the core has read the UCX packages' versions (the tcp plugin's gpudask_facts_packages):
    # asking importlib.metadata again cost 6 ms a planning process, for its email parser
    installed = any(facts.packages.get(key) is not None for key in ("ucxx", "libucx"))
    return {"transports": probe_ucx_transports(installed)}


SECTIONS = [FactsSection(SECTION, SCHEMA, probe)]

UCX_INFO_TIMEOUT_S = 10
# a failed ucx_info (missing, crashed, timed out under load) is remembered this long, a success for the boot
UCX_FAILURE_TTL_S = 600.0


def _ucx_info_commands() -> list[tuple[str, dict[str, str]]]:
    """Where `ucx_info` may be, with the variables it needs: the libucx wheel first (what ucxx loads), then PATH."""
    import importlib.util
    import shutil

    found = []
    try:
        spec = importlib.util.find_spec("libucx")  # locates the package without importing it
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        pkg = os.path.dirname(spec.origin)
        exe = os.path.join(pkg, "bin", "ucx_info")
        if os.access(exe, os.X_OK):
            # The wheel's binaries carry a build-tree RUNPATH; point them at the wheel's libs.
            lib = os.path.join(pkg, "lib")
            ld = os.environ.get("LD_LIBRARY_PATH")
            found.append((exe, {"LD_LIBRARY_PATH": lib + (os.pathsep + ld if ld else "")}))
    system = shutil.which("ucx_info")
    if system:
        found.append((system, {}))
    if os.environ.get("RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY", "false").lower() != "false":
        found.reverse()  # ucxx then loads the system UCX too
    return found


def probe_ucx_transports(installed: bool) -> list[str] | None:
    """UCX transports `ucx_info -d` lists, or None when UCX is missing (``installed`` false) or fails."""
    found = _cached("transports", _run_ucx_info) if installed else None
    return None if found is None else [str(t) for t in found]


def _ucx_cache_path(kind: str, extra: str) -> pathlib.Path | None:
    """Where this boot's `ucx_info` answer of ``kind`` is kept (~0.4 s a run, seconds under load); None
    without a boot id or a safe state directory (said once).  The answer changes only with the UCX
    build or the hardware (new devices mean a reboot or a driver reload): the key is the boot id,
    the UCX library's identity and ``extra``."""
    import hashlib

    try:
        boot_id = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    ident = [boot_id, extra]
    for exe, _env in _ucx_info_commands():
        try:
            st = os.stat(exe)
        except OSError:
            continue
        ident.append(f"{os.path.realpath(exe)}:{st.st_mtime_ns}:{st.st_size}")
    key = hashlib.sha1("|".join(ident).encode()).hexdigest()[:16]
    try:
        base = state_dir()
    except StateDirError as e:
        if not _UNSAFE_SAID:
            _UNSAFE_SAID.append(str(e))
            logger.warning("gpudask: the ucx_info answer is not cached: %s", e)
        return None
    return base / f"ucx-{kind}-{key}.json"


_UNSAFE_SAID: list[str] = []


def _cached(kind: str, run: Callable[[], list[Any] | None], extra: str = "") -> list[Any] | None:
    """``run()``'s answer, kept for this boot (a failure, None, for :data:`UCX_FAILURE_TTL_S`)."""
    import time

    path = _ucx_cache_path(kind, extra)
    text = read_private(path, "ucx_info cache") if path is not None else None
    if text:
        try:
            data = json.loads(text)
            value, at = data["value"], float(data["at"])
        except (ValueError, KeyError, TypeError):
            value, at = None, -1.0
        if value is None and 0 <= time.time() - at < UCX_FAILURE_TTL_S:
            return None
        if isinstance(value, list) and all(isinstance(v, (str, list)) for v in value):
            return value
    value = run()
    if path is not None:
        with contextlib.suppress(OSError):
            write_atomic(path, json.dumps({"value": value, "at": time.time()}))
    return value


def _runs(args: list[str], base: dict[str, str], override: dict[str, str] | None = None) -> Iterator[Any]:
    """``ucx_info *args`` from each place it may be, in order, for as long as the caller asks (one that
    cannot run is skipped); its environment: ``base``, that place's own variables, then ``override``."""
    import subprocess

    for exe, extra_env in _ucx_info_commands():
        try:
            yield subprocess.run([exe, *args], env={**base, **extra_env, **(override or {})}, stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=UCX_INFO_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            continue


def _run_ucx_info() -> list[str] | None:
    # We want what the host can do, not what this process selected or sees.
    host = {k: v for k, v in os.environ.items() if k not in ("UCX_TLS", "UCX_NET_DEVICES", "CUDA_VISIBLE_DEVICES")}
    for out in _runs(["-d"], host):
        transports = sorted(set(re.findall(r"^#\s*Transport:\s*(\S+)", out.stdout, re.MULTILINE)))
        if out.returncode == 0 and transports:
            return transports
    return None


def ucx_unused_variables(variables: dict[str, str]) -> list[tuple[str, str | None]] | None:
    """The names among ``variables`` (UCX_* the user exported) that UCX would report as unused, with
    UCX's own suggestion ("maybe: UCX_TLS?"), or None when UCX is not here: ``ucx_info -e -u t``
    builds a UCP context with exactly these variables and prints its warnings (cached likewise)."""
    names = {k: v for k, v in variables.items() if k.startswith("UCX_") and k != "UCX_WARN_UNUSED_ENV_VARS"}
    if not names:
        return []
    key = json.dumps(sorted(names.items()))
    known: dict[str, list[tuple[str, str | None]]] = plugin_state("ucx unused variables", dict)  # by variables
    if key not in known:
        found = _cached("unused", lambda: _run_ucx_unused(names), key)
        if found is None:
            return None
        known[key] = [(str(n), str(m) if m else None) for n, m in found]
    return known[key]


def _run_ucx_unused(names: dict[str, str]) -> list[tuple[str, str | None]] | None:
    no_ucx = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    for out in _runs(["-e", "-u", "t"], no_ucx, dict(names, UCX_WARN_UNUSED_ENV_VARS="y")):
        found = re.findall(r"unused environment variable: (UCX_\w+)(?: \(maybe: (UCX_\w+)\?\))?",
                           out.stdout + out.stderr)
        return [(name, maybe or None) for name, maybe in found if name in names]
    return None

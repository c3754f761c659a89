"""The public plugin API: its shared rules, and that plugins import nothing else of gpudask."""

from __future__ import annotations

import ast
import pathlib

import pytest

from gpudask import pluginapi
from gpudask.pluginapi import cpu_ranges, parse_ucx_tls, tls_enables, ucxx_creates_cuda_context, workers_sharing_gpu

ROOT = pathlib.Path(__file__).parent.parent
HOSTS = ROOT / "tests" / "hosts"

# the names other code is written against (docs/plugin-authoring.md's table promises them).
# parse_optional_float, PluginError, HostPlan and parse_ucx_tls are used by no plugin of this
# repository: they stay for that promise alone.
FIXED = ["hookimpl", "Option", "parse_bool", "parse_optional_bool", "parse_optional_float", "parse_name_list",
         "choice", "GpudaskError", "ConfigError", "PluginError", "PlanContext", "ProcessPlan", "HostPlan", "Finding",
         "parse_ucx_tls", "cpu_ranges", "workers_sharing_gpu", "format_bytes", "parse_bytes",
         # the published shape of a process (docs/plugin-authoring.md, "What a worker publishes")
         "PUBLISHED_KEY", "Published", "PublishedPlan", "PublishedReason", "AppliedState", "CudaContextState",
         "PlannedActual", "Mismatch", "PluginInfo"]


def test_the_fixed_names_are_exported():
    missing = [n for n in FIXED if not hasattr(pluginapi, n) or n not in pluginapi.__all__]
    assert missing == []


def _plugin_sources() -> str:
    files = [p for p in (ROOT / "plugins").rglob("*.py")] + [p for p in (ROOT / "contrib").rglob("*.py")
                                                             if "tests" not in p.parts]
    return "\n".join(p.read_text() for p in files)


def test_the_plugin_api_holds_only_what_plugins_use_or_the_docs_promise():
    """pluginapi shrinks to what plugins use: a name no built-in or contrib plugin imports,
    and that docs/plugin-authoring.md does not promise (FIXED), goes."""
    import re

    sources = _plugin_sources()
    unused = [n for n in pluginapi.__all__ if n not in FIXED and not re.search(rf"\b{n}\b", sources)]
    assert unused == [], f"gpudask.pluginapi exports names no plugin uses: {unused}"


def test_every_exported_name_is_in_the_docs_table():
    text = (ROOT / "docs" / "plugin-authoring.md").read_text()
    table = text[text.index("### The plugin API"):text.index("### Choosing a priority")]
    missing = [n for n in pluginapi.__all__ if f"`{n}`" not in table and f"`{n}(" not in table]
    assert missing == [], f"docs/plugin-authoring.md's plugin API table does not list {missing}"


def test_parse_ucx_tls():
    assert parse_ucx_tls(" TCP, cuda_copy ,,") == ["tcp", "cuda_copy"]
    assert parse_ucx_tls("^cuda,tcp") == ["^cuda", "tcp"]  # negation kept as given
    assert parse_ucx_tls(None) == [] and parse_ucx_tls("") == []


@pytest.mark.parametrize("tls, transport, uses", [
    ("tcp,cuda_copy", "cuda_copy", True), ("tcp,cuda_copy", "cuda_ipc", False), ("all", "rc", True),
    ("cuda", "cuda_ipc", True), ("rc_mlx5,tcp", "rc", True), ("^cuda", "cuda_copy", False), ("^cuda", "tcp", True),
    ("^tcp,rc", "rc", False), ("^tcp,rc", "cuda_ipc", True), ("dc,cuda_copy", "rc", True), ("ud", "rc", False),
    ("DC_MLX5", "rc", True), (None, "tcp", True),
])
def test_tls_enables(tls, transport, uses):
    assert tls_enables(tls, transport) is uses


def test_ucxx_context_rule_is_distributed_ucxx_substring_rule():
    for tls in ("tcp,cuda_copy", "^cuda", "cuda", "tcp", "^tcp,cuda_ipc", "", None, "CUDA_IPC"):
        text = (tls or "").lower()
        assert ucxx_creates_cuda_context(tls) is ("cuda" in text and "^cuda" not in text), tls


def test_cpu_ranges():
    assert cpu_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11" and cpu_ranges([]) == ""


def _plan(facts: str, protocol: str = "ucx", nworkers: int | None = None, env: dict | None = None,
          disable: str = "") -> object:
    import os

    from gpudask.bootstrap import plan_host

    old = os.environ.get("GPUDASK_DISABLE_PLUGINS")
    os.environ["GPUDASK_DISABLE_PLUGINS"] = disable
    try:
        return plan_host(protocol, nworkers, facts_path=str(HOSTS / facts), user_env=dict(env or {}))
    finally:
        if old is None:
            os.environ.pop("GPUDASK_DISABLE_PLUGINS")
        else:
            os.environ["GPUDASK_DISABLE_PLUGINS"] = old


def test_workers_sharing_gpu_round_robin():
    host = _plan("workstation-2gpu-pcie.json", nworkers=5)
    assert [workers_sharing_gpu(host.ctx, w) for w in host.workers[:2]] == [[0, 2, 4], [1, 3]]
    assert workers_sharing_gpu(host.ctx, host.client) == [0, 2, 4]  # the first visible GPU
    assert workers_sharing_gpu(host.ctx, host.scheduler) == [0, 2, 4]  # the scheduler relays on its first GPU
    assert workers_sharing_gpu(host.ctx, host.nanny) == []


def test_unpinned_workers_all_share_device_0_for_nvlink_and_rmm_alike():
    host = _plan("workstation-2gpu-pcie.json", nworkers=2, disable="gpu-pinning")
    assert [workers_sharing_gpu(host.ctx, w) for w in host.workers] == [[0, 1], [0, 1]]
    for w in host.workers:
        assert w.gpu_index is None
        assert "cuda_ipc" in w.ucx_transports  # nvlink: another worker on the same GPU
        gpu0 = host.facts.gpus[0]
        rmm = w.sections["rmm"]
        assert rmm["gpu"] == gpu0.uuid and rmm["initial_pool_size"] == gpu0.memory_total // 4 // 256 * 256


def test_infiniband_and_rmm_read_a_users_ucx_tls_the_same_way():
    """UCX_TLS=dc,cuda_copy: DC is InfiniBand; both plugins say so (they used to disagree)."""
    host = _plan("hgx-4gpu-2ib.json", env={"UCX_TLS": "dc,cuda_copy"})
    w = host.workers[0]
    ib = [r.why for r in w.reasons if r.plugin == "infiniband" and r.decision == "UCX transport rc"]
    assert ib and "names rc" in ib[0]
    rmm = [r.why for r in w.reasons if r.plugin == "rmm" and r.decision.startswith("memory: allocator=pool")]
    assert rmm and "InfiniBand (rc)" in rmm[0] and "NVLink" not in rmm[0]
    assert w.env["UCX_TLS"] == "dc,cuda_copy"


# --------------------------------------------------------------------------- import rule
def _package(path: pathlib.Path) -> str | None:
    """The installed package of a file of plugins/ (plugins/rmm/plugin.py: gpudask.plugins.rmm)."""
    if not path.is_relative_to(ROOT / "plugins"):
        return None
    return ".".join(("gpudask", "plugins") + path.relative_to(ROOT / "plugins").parts[:-1])


def _gpudask_imports(path: pathlib.Path, package: str | None = None) -> list[tuple[int, str]]:
    """The gpudask modules ``path`` imports; a relative import is resolved against ``package``
    (the file's installed package), so ``from .rules import x`` counts as
    ``gpudask.plugins.ucx.rules`` and ``from .. import tcp`` as ``gpudask.plugins.tcp``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            parts = (package or "").split(".")
            base = ".".join(parts[:len(parts) - node.level + 1]) if package and node.level <= len(parts) else ""
            if not base:  # a relative import out of the package: name it so that it is refused
                found.append((node.lineno, "gpudask." + "." * node.level + (node.module or "")))
            elif node.module:
                found.append((node.lineno, f"{base}.{node.module}"))
            else:  # from . import x: x is a module (or a name) of the package
                found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in ("gpudask", "gpudask.plugins"):
                # from gpudask(.plugins) import x: x is a module (or a name) of that package
                found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name == "gpudask" or name.startswith("gpudask.")]


def _allowed(name: str, own: str | None) -> bool:
    if name == "gpudask.pluginapi":
        return True
    # a built-in plugin folder's modules may import each other (rmm/plugin.py -> gpudask.plugins.rmm.setup)
    return own is not None and (name == f"gpudask.plugins.{own}" or name.startswith(f"gpudask.plugins.{own}."))


PLUGIN_FILES = sorted(p for p in (ROOT / "plugins").rglob("*.py") if p.name != "__init__.py")


def _owner(path: pathlib.Path) -> str | None:
    """What a file of plugins/ may import besides the plugin API: its own folder (rmm for
    rmm/plugin.py, rmm/setup.py), nothing for a one-module plugin."""
    if not path.is_relative_to(ROOT / "plugins"):
        return None
    folder = path.relative_to(ROOT / "plugins").parts
    return folder[0] if len(folder) > 1 else None


# contrib/gpudask-bench is no plugin but a command (the `gpudask.commands` group): its own rule below
BENCH = ROOT / "contrib" / "gpudask-bench"
CONTRIB_FILES = sorted(p for p in (ROOT / "contrib").rglob("*.py") if "tests" not in p.parts
                       and BENCH not in p.parents)
# what the bench takes from gpudask besides the plugin API: the process helper, the facts and
# the plan of a host (its raw-ucxx column places two processes as gpudask's workers), the table
BENCH_IMPORTS = {"gpudask.testing", "gpudask.testing.processes", "gpudask.facts", "gpudask.bootstrap",
                 "gpudask.plan.planner", "gpudask.cli.report"}


@pytest.mark.parametrize("path", PLUGIN_FILES + CONTRIB_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_import_only_the_plugin_api(path):
    bad = [f"line {line}: {name}" for line, name in _gpudask_imports(path, _package(path))
           if not _allowed(name, _owner(path))]
    assert bad == [], f"{path.relative_to(ROOT)} imports gpudask internals (use gpudask.pluginapi): {bad}"


@pytest.mark.parametrize("path", sorted(BENCH.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_bench_imports_only_what_it_is_allowed(path):
    bad = [f"line {line}: {name}" for line, name in _gpudask_imports(path)
           if not _allowed(name, None) and name not in BENCH_IMPORTS]
    assert bad == [], f"{path.relative_to(ROOT)} imports gpudask internals outside BENCH_IMPORTS: {bad}"


def test_the_import_rule_sees_violations(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from gpudask import hookimpl\nimport gpudask.plan\nfrom gpudask.plugins import tcp\n"
                   "def f():\n    from gpudask.check import x\n")
    names = [n for _, n in _gpudask_imports(bad)]
    assert names == ["gpudask.hookimpl", "gpudask.plan", "gpudask.plugins.tcp", "gpudask.check"]
    assert not any(_allowed(n, "nvlink") for n in names)
    assert _allowed("gpudask.plugins.rmm.setup", "rmm") and not _allowed("gpudask.plugins.rmm.setup", "ucx")
    assert not _allowed("gpudask.plugins.rmm_setup", "rmm")  # a folder, not a name prefix
    assert _owner(ROOT / "plugins" / "rmm" / "plugin.py") == "rmm" and _owner(ROOT / "plugins" / "gpu_pinning.py") is None


def test_the_import_rule_resolves_relative_imports(tmp_path):
    """The folders import each other relatively (so that mypy follows them as plugins.*): a
    relative import is held to the same rule as the absolute one it stands for."""
    mod = tmp_path / "mod.py"
    mod.write_text("from .rules import mode\nfrom . import setup\nfrom .. import forkserver\n"
                   "from ..rmm.options import shown\nfrom ... import config\nfrom .... import x\n")
    names = [n for _, n in _gpudask_imports(mod, "gpudask.plugins.ucx")]
    assert names == ["gpudask.plugins.ucx.rules", "gpudask.plugins.ucx.setup", "gpudask.plugins.forkserver",
                     "gpudask.plugins.rmm.options", "gpudask.config", "gpudask....."]
    assert [_allowed(n, "ucx") for n in names] == [True, True, False, False, False, False]
    assert _package(ROOT / "plugins" / "ucx" / "tcp.py") == "gpudask.plugins.ucx"
    assert _package(ROOT / "plugins" / "gpu_pinning.py") == "gpudask.plugins"

"""Imports go one way through the stages, and no gpudask module imports itself back.

Stages, earliest first: base -> facts -> plan -> checks -> apply -> cli -> bench (see
docs/architecture.md).  A module may import from its own stage or an earlier one, never
from a later one; function-level imports count the same as top-level ones.  ``gpudask``
itself (the package's ``__init__``) and ``gpudask.pluginapi`` are facades: they may import
any stage, and the core never imports ``pluginapi``.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpudask"

STAGES = ("base", "facts", "plan", "checks", "apply", "cli", "bench")
FACADES = {"gpudask", "gpudask.pluginapi"}
# the first name under gpudask. -> its stage
STAGE_OF = {
    "_version": "base", "errors": "base", "config": "base", "findings": "base",
    "facts": "facts",
    # the hook contract and the manager that calls it are typed with the plan's types
    "plan": "plan", "hookspecs": "plan", "manager": "plan", "transport": "plan",
    "checks": "checks",
    "apply": "apply", "session": "apply", "preload": "apply", "runtime": "apply", "distributed_plugins": "apply",
    "cluster": "apply",
    "cli": "cli",
    "bench": "bench",
}

# Modules that import a later stage today, each with the reason; strict: once fixed, the
# entry must go.
KNOWN: dict[str, str] = {}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def stage(module: str) -> str | None:
    if module in FACADES:
        return None
    return STAGE_OF.get(module.split(".")[1])


def imports(module: str) -> set[str]:
    """The gpudask modules ``module`` imports, anywhere in its code."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from a import b` imports the module a.b when there is one, else names of a
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # `import gpudask.x.y` names a module or a package
                name = name.rpartition(".")[0]
            if name.startswith("gpudask") and name != module:
                found.add(name)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_has_a_stage():
    missing = [m for m in MODULES if m not in FACADES and stage(m) is None]
    assert not missing, f"give these modules a stage in tests/test_stages.py (and docs/architecture.md): {missing}"


def _backward(module: str) -> list[str]:
    mine = stage(module)
    if mine is None:
        return []
    out = []
    for target in sorted(GRAPH[module]):
        theirs = stage(target)
        if target == "gpudask.pluginapi":
            out.append(f"{module} imports gpudask.pluginapi (the plugins' API, never the core's)")
        elif theirs is not None and STAGES.index(theirs) > STAGES.index(mine):
            out.append(f"{module} ({mine}) imports {target} ({theirs})")
    return out


@pytest.mark.parametrize("module", [
    pytest.param(m, marks=pytest.mark.xfail(reason=KNOWN[m], strict=True)) if m in KNOWN else m
    for m in sorted(MODULES) if m not in FACADES])
def test_imports_go_one_way(module):
    assert _backward(module) == []


def test_known_violations_name_existing_modules():
    assert set(KNOWN) <= set(MODULES)


def _cycles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), facades left out."""
    graph = {m: {t for t in targets if t not in FACADES} for m, targets in GRAPH.items() if m not in FACADES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_no_import_cycle():
    assert _cycles() == []


def test_the_checker_sees_imports_inside_functions():
    """The rule reads function-level imports: gpudask.checks plans through gpudask.plan.host in one."""
    assert "gpudask.plan.host" in GRAPH["gpudask.checks.runner"]
    assert "gpudask.checks.runner" in GRAPH["gpudask.checks.client"]

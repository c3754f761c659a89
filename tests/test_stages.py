"""Imports go one way through the stages, and no gpudask module imports itself back.

Stages, earliest first: base -> facts -> plan -> bootstrap -> compat -> checks -> dashboard ->
apply -> cluster -> cli -> testing (see docs/architecture.md).  A module may import from its own
stage or an earlier one, never from a later one; function-level imports count the same as
top-level ones.  ``gpudask`` itself (the package's ``__init__``) and ``gpudask.pluginapi`` are facades: they may import
any stage, and the core never imports ``pluginapi``.  The facades are in the cycle check
all the same: a module that imports ``gpudask`` while ``gpudask`` imports it (its lazy
names, ``_LAZY``, included) is a cycle.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpudask"

STAGES = ("base", "facts", "plan", "bootstrap", "compat", "checks", "dashboard", "apply", "cluster", "cli", "testing")
FACADES = {"gpudask", "gpudask.pluginapi"}
# the first name under gpudask. -> its stage
STAGE_OF = {
    "_version": "base", "errors": "base", "config": "base", "config_files": "base", "findings": "base",
    "session": "base",  # what gpudask holds for this process, in one object
    "plaindata": "base", "printable": "base",  # what a plugin returns as plain data; outside text made printable
    "textwidth": "base",  # the terminal's width and prose wrapped to it: every command's output
    "facts": "facts",
    # the plugin machinery (gpudask/plugin/): the hook contract, the plugins' registration, the
    # manager that calls them (each call isolated, its result checked, traced), typed with the
    # plan's types
    "plan": "plan", "plugin": "plan",
    # config, plugins, settings, the user's view and facts, once per process
    "bootstrap": "bootstrap",
    # another project's API (dask-cuda's arguments and options) as gpudask settings: reads the
    # bootstrap's plugins, decides nothing; used by the apply stage and LocalGPUCluster
    "compat": "compat",
    "checks": "checks",
    # the /gpudask page and the /metrics gauges: read what the workers published and the
    # check's report; installed by the apply stage, which they never import
    "dashboard": "dashboard",
    "apply": "apply",
    # LocalGPUCluster, a user's way in like the dask commands: uses the apply stage
    "cluster": "cluster",
    "cli": "cli",
    # the process helper and pytest plugin of gpudask's (and plugins') tests: last, so that
    # nothing of the runtime imports it
    "testing": "testing",
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


# modules of a stage's folder that belong to an earlier stage
STAGE_OF_MODULE = {
    # distributed's internals, in one place: imports nothing of gpudask, so the core, the
    # checks and the plugin API (which re-exports what plugins need) all may use it
    "gpudask.compat.distributed": "base",
    "gpudask.compat.distributed_ucxx": "base",
    "gpudask.compat.forkserver": "base",
}


def stage(module: str) -> str | None:
    if module in FACADES:
        return None
    return STAGE_OF_MODULE.get(module) or STAGE_OF.get(module.split(".")[1])


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


def lazy_imports(module: str) -> set[str]:
    """The modules a facade's ``_LAZY`` table ({name: (module, attribute)}) imports on access."""
    tree = ast.parse(MODULES[module].read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "_LAZY" and node.value is not None:
            table = ast.literal_eval(node.value)
            return {name for name, _attr in table.values()}
    return set()


GRAPH = {m: imports(m) | (lazy_imports(m) if m in FACADES else set()) for m in MODULES}


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


def test_stage_table_names_existing_modules():
    present = {m.split(".")[1] for m in MODULES if m.count(".") >= 1}
    assert sorted(set(STAGE_OF) - present) == []


def _cycles(graph: dict[str, set[str]] | None = None) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), the facades included."""
    graph = GRAPH if graph is None else graph
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


def test_the_cycle_check_covers_the_package_face():
    """``gpudask/__init__`` is a node: it imports the preload (and, lazily, the names of
    ``_LAZY``), so a module under it importing ``gpudask`` back closes a cycle."""
    assert "gpudask" in GRAPH and "gpudask.apply.preload" in GRAPH["gpudask"]
    assert {"gpudask.checks", "gpudask.cluster", "gpudask.apply.server_plugins"} <= GRAPH["gpudask"]
    back = {m: set(t) for m, t in GRAPH.items()}
    back["gpudask.apply.process"].add("gpudask")  # `from gpudask import __version__`, as it once was
    assert any({"gpudask", "gpudask.apply.preload", "gpudask.apply.process"} <= set(g) for g in _cycles(back))


def test_the_runtime_never_imports_the_testing_stage_or_the_bench():
    """gpudask.testing is the last stage (the rule above keeps the runtime from it), and the
    bench is another distribution (contrib/gpudask-bench) that no runtime module names."""
    assert STAGES[-1] == "testing" and {"gpudask.testing.processes", "gpudask.testing.plugin"} <= set(MODULES)
    assert not [m for m in MODULES if m.startswith("gpudask.bench")]
    named = [str(p.relative_to(ROOT)) for d in ("gpudask", "plugins") for p in sorted((ROOT / d).rglob("*.py"))
             if "gpudask_bench" in p.read_text() or "gpudask.bench" in p.read_text()]
    assert named == []
    assert _backward("gpudask.cli") == [] and "gpudask.testing.processes" in GRAPH["gpudask.testing.plugin"]


def test_the_checker_sees_imports_inside_functions():
    """The rule reads function-level imports: gpudask.checks plans through gpudask.bootstrap in one."""
    assert "gpudask.bootstrap" in GRAPH["gpudask.checks.runner"]
    assert "gpudask.checks.runner" in GRAPH["gpudask.checks.client"]


# A guide, not a rule (issue 33): a module is cut where its responsibilities part, not at a
# line count -- one idea split across files by size (a class split by inheritance, a ctx handed
# back and forth) costs more than a long module.  The test reports the modules over the guide
# so a reviewer looks at them; it never fails on a length.
GUIDE_LINES = 400


def test_modules_over_the_length_guide_are_reported():
    over = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > GUIDE_LINES}
    if over:
        import warnings

        listed = ", ".join(f"{m} ({n})" for m, n in sorted(over.items(), key=lambda kv: -kv[1]))
        warnings.warn(f"modules over the {GUIDE_LINES}-line guide (look for a seam of responsibility, not of "
                      f"size): {listed}", UserWarning, stacklevel=1)


def test_the_plugin_api_depends_on_nothing_above_the_plan_stage():
    """Issue 33: the stable API a plugin imports pulls in the plan stage and below, not the
    bootstrap, the checks or the apply stage (the apply stage answers applied_role() through
    gpudask.plan.applied)."""
    above = STAGES[STAGES.index("plan") + 1:]
    reached, todo = set(), ["gpudask.pluginapi"]
    while todo:
        module = todo.pop()
        for target in imports(module):
            if target in MODULES and target not in reached:
                reached.add(target)
                todo.append(target)
    assert sorted(m for m in reached if stage(m) in above) == []

"""Hooks are public API: each one has its reference docstring in the hookspecs (rendered by the
docs build) and a section of the guide in docs/hooks.md."""

from __future__ import annotations

import inspect
import pathlib

import pytest

from gpudask.plugin import hookspecs
from gpudask.plugin.manager import HOOKS

DOCS = pathlib.Path(__file__).parents[1] / "docs"


@pytest.mark.parametrize("name", HOOKS)
def test_every_hookspec_has_a_reference_docstring(name):
    doc = inspect.getdoc(getattr(hookspecs, name)) or ""
    assert len(doc.split()) >= 25, f"{name} needs a docstring saying when, where and what it returns"
    assert ":return:" in doc or ":raises" in doc, f"{name}: the docstring must state its return contract"
    assert any(w in doc for w in ("Called", "called")), f"{name}: the docstring must say when it is called"


@pytest.mark.parametrize("name", HOOKS)
def test_every_hook_has_a_section_in_docs_hooks_md(name):
    """Like datasette: the hand-written hooks page has a section per hook."""
    headings = [line for line in (DOCS / "hooks.md").read_text().splitlines() if line.startswith("#")]
    assert any(name in h for h in headings), f"docs/hooks.md has no section for {name}"


def test_the_five_core_hooks_exist():
    for name in ("gpudask_context_init", "gpudask_setup_memory", "gpudask_select_transport",
                 "gpudask_server_setup", "gpudask_scheduler_check"):
        assert name in HOOKS


def _section(text: str, name: str) -> str:
    start = text.index(f"\n## {name}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


@pytest.mark.parametrize("name", HOOKS)
def test_the_generated_reference_shows_each_hooks_signature_and_the_guide_does_not(name):
    """The contract is written once: the reference, generated from the hookspecs at docs build
    time, shows every hook's exact signature; the guide (docs/hooks.md) links to it instead of
    restating it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "_hooks" / "gen_reference.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    reference = _section(gen.hookspecs_markdown(), name)
    expected = f"def {name}{inspect.signature(getattr(hookspecs, name))}"
    assert expected in reference, f"the hook reference, section {name}: expected {expected!r}"
    guide = _section((DOCS / "hooks.md").read_text(), name)
    assert [line for line in guide.splitlines() if line.strip().startswith(name + "(")] == []
    assert f"](reference/hookspecs.md#{name})" in guide


def test_every_hookspec_is_annotated():
    for name in HOOKS:
        sig = inspect.signature(getattr(hookspecs, name))
        assert sig.return_annotation is not inspect.Signature.empty, name
        assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values()), name


# ------------------------------------------------------------ implementations are typed
def _implementations():
    """(plugin, hook, function) of every built-in plugin and contrib/ plugin."""
    import importlib
    import sys

    from gpudask.plugin.manager import BUILTIN_PLUGINS

    root = pathlib.Path(__file__).parents[1]
    found = []
    for name, module in BUILTIN_PLUGINS:
        mod = importlib.import_module(module)
        found += [(name, hook, getattr(mod, hook)) for hook in HOOKS if hasattr(mod, hook)]
    for path in sorted((root / "contrib").glob("*/gpudask_*.py")):
        sys.path.insert(0, str(path.parent))
        try:
            mod = importlib.import_module(path.stem)
        finally:
            sys.path.remove(str(path.parent))
        found += [(path.stem, hook, getattr(mod, hook)) for hook in HOOKS if hasattr(mod, hook)]
    return found


IMPLEMENTATIONS = _implementations()


def test_there_are_implementations_to_check():
    assert len(IMPLEMENTATIONS) >= 40
    assert {hook for _, hook, _ in IMPLEMENTATIONS} == set(HOOKS)


@pytest.mark.parametrize("plugin, hook, fn", IMPLEMENTATIONS, ids=[f"{p}.{h}" for p, h, _ in IMPLEMENTATIONS])
def test_every_implementation_is_annotated_with_its_specs_types(plugin, hook, fn):
    """pluggy checks at registration that an implementation's parameter names are the spec's
    (tests/test_manager.py); this holds the types: each parameter annotated as in the spec,
    a return type given."""
    spec = inspect.signature(getattr(hookspecs, hook))
    sig = inspect.signature(fn)
    assert set(sig.parameters) <= set(spec.parameters), f"{plugin}: {hook}{sig}"
    wrong = {name: p.annotation for name, p in sig.parameters.items()
             if p.annotation != spec.parameters[name].annotation}
    assert wrong == {}, f"{plugin}.{hook}: annotate as the spec: {hook}{spec}"
    assert sig.return_annotation is not inspect.Signature.empty, f"{plugin}.{hook} has no return annotation"


def test_the_annotation_check_sees_an_untyped_implementation():
    def gpudask_validate(ctx):
        return None

    sig = inspect.signature(gpudask_validate)
    assert sig.parameters["ctx"].annotation != inspect.signature(hookspecs.gpudask_validate).parameters["ctx"].annotation


# ------------------------------------------------- helpers take the plan's types, not Any
# mypy's strict tier (pyproject.toml, run by .ci/run after pytest) refuses an unannotated
# function in plugins/ and the contrib plugins; what it cannot see is a helper that takes the
# plan context or a plan as ``Any``, which switches the checking of its body off (it hid
# unnarrowed ``ctx.setting(key)`` values in rmm).  So: a parameter named ctx or plan is
# annotated, and not as Any (PlanContext, ProcessPlan; gpudask_report_rows's plan is the
# published one, a Mapping), in every function of those modules.
PLAN_PARAMETERS = ("ctx", "plan")
UNCHECKED = (None, "Any", "Any | None", "object")
ROOT = pathlib.Path(__file__).parents[1]
TYPED_SOURCES = sorted([*(ROOT / "plugins").rglob("*.py"), *(ROOT / "contrib").glob("*/gpudask_*.py")])


def _plan_parameters_not_typed(path: pathlib.Path) -> list[str]:
    import ast

    wrong = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                shown = ast.unparse(arg.annotation) if arg.annotation is not None else None
                if arg.arg in PLAN_PARAMETERS and shown in UNCHECKED:
                    wrong.append(f"line {node.lineno}: {node.name}({arg.arg}: {shown})")
    return wrong


@pytest.mark.parametrize("path", TYPED_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_helpers_take_the_plan_context_and_plans_typed(path):
    wrong = _plan_parameters_not_typed(path)
    assert wrong == [], f"{path.relative_to(ROOT)}: annotate ctx as PlanContext, plan as ProcessPlan, not Any: {wrong}"


def test_the_plan_types_check_sees_any_and_missing_annotations(tmp_path):
    mod = tmp_path / "mod.py"
    mod.write_text("def a(ctx: Any, plan: ProcessPlan) -> None: ...\ndef b(ctx, plan: Any): ...\n"
                   "async def c(*, ctx: PlanContext | None = None, plan: Mapping[str, Any]) -> None: ...\n")
    assert _plan_parameters_not_typed(mod) == ["line 1: a(ctx: Any)", "line 2: b(ctx: None)", "line 2: b(plan: Any)"]
    assert len(TYPED_SOURCES) >= 20 and any(p.name == "gpudask_prometheus.py" for p in TYPED_SOURCES)

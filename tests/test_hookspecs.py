"""Hooks are public API: each one has reference docs in the hookspecs and in docs/."""

from __future__ import annotations

import inspect
import pathlib

import pytest

from gpudask import hookspecs
from gpudask.manager import HOOKS

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


def signature_line(name: str) -> str:
    """``gpudask_x(ctx: PlanContext, plan: ProcessPlan) -> None`` from the hookspec's annotations."""
    fn = getattr(hookspecs, name)
    params = ", ".join(f"{p.name}: {p.annotation}" for p in inspect.signature(fn).parameters.values())
    return f"{name}({params}) -> {inspect.signature(fn).return_annotation}"


def _section(text: str, name: str) -> str:
    start = text.index(f"\n## {name}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


@pytest.mark.parametrize("name", HOOKS)
def test_docs_hooks_md_shows_each_hooks_signature(name):
    """Like datasette's documentation test: the hand-written page shows every hook's exact
    signature (name, parameters, types); a hook added or changed without the page fails."""
    section = _section((DOCS / "hooks.md").read_text(), name)
    expected = signature_line(name)
    shown = [line.strip() for line in section.splitlines() if line.strip().startswith(name + "(")]
    assert shown == [expected], f"docs/hooks.md, section {name}: expected the line {expected!r}, found {shown}"


def test_every_hookspec_is_annotated():
    for name in HOOKS:
        sig = inspect.signature(getattr(hookspecs, name))
        assert sig.return_annotation is not inspect.Signature.empty, name
        assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values()), name


def test_the_signature_check_sees_a_difference():
    section = "\n## gpudask_validate\n\n```python\ngpudask_validate(ctx) -> None\n```\n"
    shown = [line for line in _section(section, "gpudask_validate").splitlines() if line.startswith("gpudask_")]
    assert shown != [signature_line("gpudask_validate")]

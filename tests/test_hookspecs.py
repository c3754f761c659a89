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
                 "gpudask_preload", "gpudask_scheduler_check"):
        assert name in HOOKS

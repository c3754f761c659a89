"""The docs read well in a fresh clone: every relative link names a committed file (or a page
the build generates), the generated reference page that is committed is the one the code
generates now, and the hook reference is not committed (its one source is gpudask/plugin/hookspecs.py)."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _gen_reference():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "_hooks" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tracked() -> set[str] | None:
    """Files git tracks (what a fresh clone has); None outside a git checkout."""
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    return set(out.stdout.splitlines()) if out.returncode == 0 and out.stdout else None


def _pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)]


def test_every_relative_link_names_a_committed_file():
    tracked = _tracked()
    generated = {(DOCS / path).resolve() for path in _gen_reference().GENERATED_AT_BUILD}
    broken = []
    for page in _pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not links
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (page.parent / target.split("#")[0]).resolve()
            if path in generated:
                continue  # made by the build (mkdocs build --strict checks these links)
            relative = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
            if not path.is_file() or (tracked is not None and relative not in tracked):
                broken.append(f"{page.relative_to(ROOT)}: ({target})")
    assert not broken, "links to files a fresh clone does not have:\n" + "\n".join(broken)


def test_links_to_the_reference_are_checked():
    """The check above sees the links to the generated pages (so it would catch them dead)."""
    text = (DOCS / "configuration.md").read_text()
    assert "](reference/configuration.md)" in text and LINK.search(text)


@pytest.mark.parametrize("name", ["configuration"])
def test_committed_reference_page_is_up_to_date(name, monkeypatch):
    gen = _gen_reference()
    for variable in ("GPUDASK_PLUGINS", "GPUDASK_DISABLE_PLUGINS"):
        monkeypatch.delenv(variable, raising=False)
    generated = getattr(gen, f"{name}_markdown")()
    committed = (DOCS / "reference" / f"{name}.md").read_text()
    assert committed == generated, (f"docs/reference/{name}.md is out of date: run "
                                    "`python docs/_hooks/gen_reference.py` and commit it")


def test_the_hook_reference_is_generated_at_build_time_only():
    """The hook contract has one source, the docstrings: the reference page is made by the
    build, not committed, and the guide (hooks.md) links to it for every hook."""
    gen = _gen_reference()
    tracked = _tracked()
    assert "reference/hookspecs.md" in gen.GENERATED_AT_BUILD
    if tracked is not None:
        assert "docs/reference/hookspecs.md" not in tracked
    from gpudask.plugin.manager import HOOKS

    guide = (DOCS / "hooks.md").read_text()
    assert [h for h in HOOKS if f"](reference/hookspecs.md#{h})" not in guide] == []
    assert "<!-- not run: a signature -->" not in guide  # the signatures are the reference's

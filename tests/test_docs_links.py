"""The docs read well in a fresh clone: every relative link names a committed file, and the
generated reference pages that are committed are the ones the code generates now."""

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
    broken = []
    for page in _pages():
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not links
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (page.parent / target.split("#")[0]).resolve()
            relative = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
            if not path.is_file() or (tracked is not None and relative not in tracked):
                broken.append(f"{page.relative_to(ROOT)}: ({target})")
    assert not broken, "links to files a fresh clone does not have:\n" + "\n".join(broken)


def test_links_to_the_reference_are_checked():
    """The check above sees the links to the generated pages (so it would catch them dead)."""
    text = (DOCS / "configuration.md").read_text()
    assert "](reference/configuration.md)" in text and LINK.search(text)


@pytest.mark.parametrize("name", ["configuration", "hookspecs"])
def test_committed_reference_page_is_up_to_date(name, monkeypatch):
    gen = _gen_reference()
    for variable in ("GPUDASK_PLUGINS", "GPUDASK_DISABLE_PLUGINS"):
        monkeypatch.delenv(variable, raising=False)
    generated = getattr(gen, f"{name}_markdown")()
    committed = (DOCS / "reference" / f"{name}.md").read_text()
    assert committed == generated, (f"docs/reference/{name}.md is out of date: run "
                                    "`python docs/_hooks/gen_reference.py` and commit it")

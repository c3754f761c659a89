"""The documentation site builds with `mkdocs build --strict` and its generated reference is complete."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]
DOCS = ROOT / "docs"


def _gen_reference():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "_hooks" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def builtin_manager(monkeypatch):
    """The core and the built-in plugins: what the documentation describes (third-party
    plugins installed in this environment are not part of gpudask's docs)."""
    from gpudask.plugin.manager import PluginManager

    monkeypatch.setenv("GPUDASK_DISABLE_PLUGIN_AUTOLOAD", "1")
    return PluginManager.from_environment()


def _option_keys(manager) -> list[str]:
    keys = [opt.key for opt in manager.config_options()]
    assert keys, "no options at all: the core declares gpudask.plugins.*"
    return keys


def test_configuration_reference_lists_every_option(builtin_manager):
    text = _gen_reference().configuration_markdown()
    for key in _option_keys(builtin_manager):
        assert f"### {key} " in text, f"the configuration reference has no section for {key}"


def test_configuration_reference_names_the_plugin_and_legacy_keys():
    gen = _gen_reference()
    rows = {r["key"]: r for r in gen.option_rows()}
    text = gen.configuration_markdown()
    for key, row in rows.items():
        assert row["plugin"] != "?", f"{key}: no plugin declares it"
        for legacy in row["legacy"]:
            assert f"`{legacy}`" in text


def test_hookspec_reference_has_every_hook():
    from gpudask.plugin.manager import HOOKS

    text = _gen_reference().hookspecs_markdown()
    for name in HOOKS:
        assert f"## {name}\n" in text


def test_architecture_lists_the_builtin_plugins_with_their_priorities(builtin_manager):
    text = (DOCS / "architecture.md").read_text()
    for plugin in builtin_manager.plugins:
        if plugin.source == "builtin":
            assert f"| {plugin.name} | {plugin.priority} |" in text, (
                f"docs/architecture.md: the plugin table needs a row '| {plugin.name} | {plugin.priority} | ...'")


def test_every_page_in_docs_is_in_the_nav():
    import yaml

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for value in node.values():
                yield from pages(value)
        elif isinstance(node, list):
            for item in node:
                yield from pages(item)

    nav = set(pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    written = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if not p.relative_to(DOCS).as_posix().startswith("reference/")}
    assert written <= nav, f"pages missing from the nav in mkdocs.yml: {sorted(written - nav)}"
    missing = {p for p in nav - written if not p.startswith("reference/")}
    assert not missing, f"nav names pages that do not exist: {sorted(missing)}"


@pytest.mark.process
def test_mkdocs_build_strict(tmp_path, builtin_manager):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    # the build writes its generated reference pages next to the sources: build a copy
    shutil.copytree(DOCS, tmp_path / "docs", ignore=shutil.ignore_patterns("reference", "__pycache__"))
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
                           "-f", str(tmp_path / "mkdocs.yml"), "-d", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    built = (site / "reference" / "configuration" / "index.html").read_text()
    for key in _option_keys(builtin_manager):
        assert key in built, f"the built configuration reference does not list {key}"
    assert (site / "reference" / "hookspecs" / "index.html").is_file()
    assert not (site / "_hooks").exists(), "the hooks module must not be published"


def test_no_table_is_split_by_a_blank_line():
    """Rows after a blank line without a header and a rule of their own are not a table:
    markdown shows them as text with the pipes (docs/configuration.md had one)."""
    pages = [*DOCS.rglob("*.md"), ROOT / "README.md"]
    orphans = []
    for page in pages:
        lines, fenced = page.read_text().splitlines(), False
        for i, line in enumerate(lines):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            if fenced or not line.startswith("|") or (i and lines[i - 1].startswith("|")):
                continue
            rule = lines[i + 1] if i + 1 < len(lines) else ""
            if not rule.replace("|", "").replace("-", "").replace(":", "").strip() == "" or "-" not in rule:
                orphans.append(f"{page.relative_to(ROOT)}:{i + 1}: {line[:60]}")
    assert orphans == []


def test_the_facts_page_example_of_info_json_has_a_workers_real_fields():
    """docs/facts.md's `gpudask info --json` example: a worker's fields are the ones a plan
    has (it showed a per-worker `memory` field after plans moved it into `sections`)."""
    import re

    from gpudask.bootstrap import plan_host

    example = (DOCS / "facts.md").read_text().split('"workers": [', 1)[1].split("```", 1)[0]
    shown = set(re.findall(r'^ {3,4}\{?"(\w+)":', example, re.M))
    real = set(plan_host("ucx", 1, facts_path=str(ROOT / "tests" / "hosts" / "h200-single.json")).workers[0].to_dict())
    assert shown and shown <= real, shown - real


def test_the_readme_says_how_to_install_what_mkdocs_needs():
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e '.[docs]'" in readme and "mkdocs serve" in readme

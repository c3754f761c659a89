"""The plan ``gpudask info --json`` prints for every described host, held against golden files.

The files in ``tests/golden/`` were written before the stage packages moved; a difference
is a behaviour change and needs the issue that explains it, in the same commit.  They are
kept per plugin where they can be: each case's plan without its ``plugins`` list, and each
built-in plugin's entry of that list in ``tests/golden/plugins/NAME.json`` (a new plugin or
hook changes its own file).  Regenerate them with ``python tests/regenerate_golden.py``
(autoload off: no installed third-party plugin gets in; it lists what changed, by key path).
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest
from click.testing import CliRunner

from regenerate_golden import PLUGINS, assemble

ROOT = pathlib.Path(__file__).parent.parent
GOLDEN = sorted((ROOT / "tests" / "golden").glob("*.json"))


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_plan_matches_golden(path, monkeypatch):
    from gpudask.cli import main

    host, protocol, nworkers = path.stem.split("--")
    for name in list(os.environ):
        if name.startswith(("UCX_", "DASK_", "UCXPY_", "RAPIDS_")) or name in ("CUDA_VISIBLE_DEVICES", "CUDF_SPILL"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(ROOT)
    args = ["info", "--facts", f"tests/hosts/{host}.json", "--protocol", protocol, "--json"]
    if nworkers != "default":
        args += ["--nworkers", nworkers]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == assemble(path)


def test_there_are_golden_plans():
    assert len(GOLDEN) >= 70


def test_each_builtin_plugin_has_its_golden_entry_and_nothing_else_has_one():
    from gpudask.plugin.registration import BUILTIN_PLUGINS

    assert sorted(p.stem for p in PLUGINS.glob("*.json")) == sorted(name for name, _ in BUILTIN_PLUGINS)

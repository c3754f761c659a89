"""The plan ``gpudask info --json`` prints for every described host, held against golden files.

The files in ``tests/golden/`` were written before the stage packages moved; a difference
is a behaviour change and needs the issue that explains it, in the same commit.  Regenerate
one with ``gpudask info --facts tests/hosts/H.json --protocol P [--nworkers N] --json`` from
the repository root, with no ``UCX_*``, ``DASK_*`` or ``CUDA_VISIBLE_DEVICES`` exported.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest
from click.testing import CliRunner

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
    assert json.loads(result.output) == json.loads(path.read_text())


def test_there_are_golden_plans():
    assert len(GOLDEN) >= 70

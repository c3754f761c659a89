"""The suite relies on pytest-xdist's ``--dist loadgroup`` (pyproject addopts): tests that take
dask's default ports run one at a time, and a module's shared install runs once.  pytest 9.2
silently broke it for pytest-xdist 3.8 (its issue 1386), hence the pin in the test extra; this
test fails if grouping stops taking effect again."""

from __future__ import annotations

import os

import pytest


@pytest.mark.xdist_group("default-ports")
def test_loadgroup_puts_a_grouped_test_in_its_group(request):
    if not os.environ.get("PYTEST_XDIST_WORKER") or request.config.getoption("dist", "no") != "no":
        pytest.skip("not in an xdist test process")
    # a worker runs with dist "no"; loadgroup shows in the nodeid suffix that its scheduler reads
    assert request.node.nodeid.endswith("@default-ports"), (
        f"{request.node.nodeid}: --dist loadgroup no longer groups tests (pytest-xdist issue 1386)")

"""The suite's own isolation of tests that open UCX in the test process (tests/conftest.py,
ISOLATE_UCX_CLIENTS): under pytest-xdist such a test runs alone in a fresh pytest process."""

from __future__ import annotations

import os

import pytest

from conftest import IN_ISOLATED_CHILD, _ucx_initialised


@pytest.mark.process
@pytest.mark.ucx_client
def test_a_ucx_client_test_runs_alone_in_a_fresh_pytest_process_under_xdist(monkeypatch):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("without pytest-xdist (the device scripts) a ucx_client test runs in place")
    # the child pytest, not the xdist test process: it carries the marker of the parent that started it, and
    # the xdist worker's name (so its own temporary and state directories)
    assert os.environ.get(IN_ISOLATED_CHILD) == "1"
    monkeypatch.setenv("UCX_TLS", "tcp")
    monkeypatch.setenv("UCX_WARN_UNUSED_ENV_VARS", "n")
    from distributed_ucxx import ucxx

    ucxx.init_once()  # real UCX, here: it ends with this process
    assert _ucx_initialised()

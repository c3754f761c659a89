"""UCX_TLS that UCX cannot start with, and a --protocol gpudask info cannot print a worker
command line for: one line naming the bad names and the accepted ones."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import base_env, host, plan_on

from gpudask.errors import ConfigError
from gpudask.plan.ucx_tls import check_user_tls

TWO_GPUS = host("workstation-2gpu-pcie.json")


def test_check_user_tls_accepts_ucx_names_aliases_exclusion_and_the_hosts_transports():
    for value in (None, "tcp", "TCP,cuda_copy", "^cuda,tcp", "sm,self", "ud:aux,rc", "all", "tcp,my_tl"):
        check_user_tls(value, ["tcp", "my_tl"])


@pytest.mark.parametrize("value,bad", [("garbage", "'garbage'"), ("tcp,cuda_cpy,nvlink", "'cuda_cpy', 'nvlink'")])
def test_unknown_ucx_tls_names_are_one_line_naming_them_and_what_the_host_offers(value, bad):
    with pytest.raises(ConfigError) as e:
        check_user_tls(value, ["cma", "self", "tcp"])
    text = str(e.value)
    assert f"names unknown transport(s) {bad};" in text and "this host's UCX offers cma, self, tcp" in text
    assert "cuda_copy" in text and "\n" not in text


def test_an_empty_ucx_tls_says_what_ucx_does_with_it():
    with pytest.raises(ConfigError, match=r"UCX_TLS is set but empty: UCX then has no transport"):
        check_user_tls("  ", None)


def test_the_plan_refuses_a_bad_ucx_tls_only_with_ucx(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "garbage")
    with pytest.raises(ConfigError, match="UCX_TLS='garbage' names unknown"):
        plan_on(TWO_GPUS, "ucx")
    plan_on(TWO_GPUS, "tcp")  # UCX is not used: its variables are none of gpudask's business


def _info(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudask.cli", "info", *args], capture_output=True, text=True,
                          timeout=120, cwd=str(tmp_path), env=base_env(GPUDASK_FACTS=TWO_GPUS, **env))


@pytest.mark.process
def test_gpudask_info_refuses_several_protocols_and_unknown_ones_in_one_line(tmp_path):
    for protocol, expected in (("ucx,tcp", "--protocol 'ucx,tcp': gpudask info plans for the one protocol"),
                               ("bogus", "protocol 'bogus' is not valid; accepted: ")):
        out = _info(tmp_path, "--protocol", protocol)
        lines = (out.stdout + out.stderr).strip().splitlines()
        assert out.returncode != 0 and len(lines) == 1 and expected in lines[0], out.stdout + out.stderr
        assert "://" not in out.stdout  # never an invalid `dask worker ucx,tcp://...` line
    out = _info(tmp_path, "--protocol", "ucx", UCX_TLS="garbage")
    assert out.returncode != 0 and "UCX_TLS='garbage' names unknown transport(s) 'garbage'" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.process
@pytest.mark.parametrize("tls,expected", [("garbage", "UCX_TLS='garbage' names unknown transport(s) 'garbage'"),
                                          ("", "UCX_TLS is set but empty")])
def test_dask_scheduler_over_ucx_with_a_bad_ucx_tls_exits_with_one_line(tmp_path, tls, expected):
    out = subprocess.run([sys.executable, "-m", "distributed.cli.dask_scheduler", "--protocol", "ucx", "--host",
                          "127.0.0.1", "--port", "0", "--no-dashboard", "--preload", "gpudask"], capture_output=True,
                         text=True, timeout=120, cwd=str(tmp_path), env=base_env(GPUDASK_FACTS=TWO_GPUS, UCX_TLS=tls))
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "Traceback" not in text, text
    lines = [x for x in text.splitlines() if x.strip() and " - INFO - " not in x]
    assert len(lines) == 1 and lines[0].startswith("Error: gpudask: ") and expected in lines[0], text

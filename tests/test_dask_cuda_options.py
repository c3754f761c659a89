"""dask-cuda's worker options on stock ``dask worker`` / ``dask scheduler --preload gpudask``
(docs/migrating-from-dask-cuda.md): real processes on loopback, a described 4-GPU host."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import base_env, host


HGX = host("hgx-4gpu-2ib.json")
# the options a dask-cuda user types, and the settings the migration guide maps them to
OPTIONS = ["--rmm-pool-size", "1GB", "--rmm-managed-memory", "--enable-cudf-spill", "--set-rmm-allocator-for-libs",
           "cupy,torch"]
MAPPED = {"DASK_GPUDASK__RMM__POOL_SIZE": "1GB", "DASK_GPUDASK__RMM__MANAGED_MEMORY": "true",
          "DASK_GPUDASK__SPILL__CUDF": "true", "DASK_GPUDASK__RMM__LIBRARIES": "[\"cupy\", \"torch\"]"}


def _info(**env: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--json", "--facts", HGX, "--nworkers", "2"],
                         capture_output=True, text=True, timeout=120, env=base_env(**env))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.process
def test_dask_cuda_options_on_dask_worker_and_scheduler_are_the_mapped_settings(cluster):
    expected = _info(**MAPPED)
    env = base_env(GPUDASK_FACTS=HGX)
    cluster.scheduler("--preload", "gpudask", "--enable-cudf-spill", env=env)
    cluster.worker("--nworkers", "2", "--nthreads", "1", "--preload", "gpudask", *OPTIONS, env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=60)
        workers = client.scheduler_info(n_workers=-1)["workers"]
        plans = {w["gpudask"]["plan"]["index"]: json.loads(json.dumps(w["gpudask"]["plan"])) for w in workers.values()}
        import dask.config

        seen = client.run(lambda: dask.config.get("gpudask.rmm.pool-size"))
        scheduler_env = client.run_on_scheduler(lambda: __import__("os").environ.get("CUDF_SPILL"))
    for i in (0, 1):
        assert plans[i]["sections"]["rmm"] == expected["workers"][i]["sections"]["rmm"]
        assert plans[i]["env"] == expected["workers"][i]["env"]
    rmm = plans[0]["sections"]["rmm"]
    assert rmm["initial_pool_size"] == 10**9 and rmm["managed_memory"] and rmm["libraries"] == ["cupy", "torch"]
    assert plans[0]["env"]["CUDF_SPILL"] == "1" and scheduler_env == "1"
    assert set(seen.values()) == {"1GB"}  # the worker processes run with the settings too
    # the reasons name the option as the user typed it
    assert any("(from dask worker --rmm-pool-size 1GB)" in r["why"] for r in plans[0]["reasons"])


@pytest.mark.process
@pytest.mark.parametrize("command,args,expected", [
    ("worker", ["--rmm-pool-sizee", "1GB"], "gpudask: --rmm-pool-sizee: not an option of dask worker --preload "
                                             "gpudask; did you mean --rmm-pool-size?"),
    ("worker", ["--rmm-pool-size", "lots"], "gpudask: gpudask.rmm.pool-size = 'lots' (from dask worker "
                                             "--rmm-pool-size lots) is not valid; accepted: a size"),
    ("scheduler", ["--rmm-pool-size"], "gpudask: dask scheduler --preload gpudask --rmm-pool-size: Option "
                                        "'--rmm-pool-size' requires an argument"),
    ("worker", ["--pre-import", "cudf"], "gpudask: --pre-import (a dask cuda worker option) is not taken by dask "
                                          "worker --preload gpudask; instead: stock --preload"),
])
def test_a_wrong_dask_cuda_option_is_one_line(tmp_path, command, args, expected):
    address = ["tcp://127.0.0.1:9"] if command == "worker" else ["--port", "0", "--no-dashboard"]
    out = subprocess.run([sys.executable, "-m", "dask", command, *address, "--preload", "gpudask", *args],
                         capture_output=True, text=True, timeout=120, env=base_env(GPUDASK_FACTS=HGX),
                         cwd=str(tmp_path))
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if "Error" in line or "Traceback" in line]
    assert len(errors) == 1 and errors[0].startswith("Error: " + expected), out.stderr


def test_every_option_gpudask_takes_is_a_row_of_the_migration_guide_naming_its_setting():
    import pathlib
    import re

    from gpudask.compat import dask_cuda

    text = (pathlib.Path(__file__).parent.parent / "docs" / "migrating-from-dask-cuda.md").read_text()
    table = text.split("## `dask cuda worker` options", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`--"):
            for name in re.findall(r"`(--[a-z-]+)", cells[0]):
                rows[name] = cells[1]
    options = dask_cuda.cli_options()
    assert len(options) >= 15
    for option in options:
        assert option.names[0] in rows, option.spelling
        assert option.argument.key in rows[option.names[0]], (option.spelling, rows[option.names[0]])


@pytest.mark.process
def test_a_worker_without_nanny_takes_them_too(cluster):
    cluster.scheduler("--preload", "gpudask")
    cluster.worker("--no-nanny", "--preload", "gpudask", "--rmm-pool-size", "2GB", env=base_env(GPUDASK_FACTS=HGX))
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        (published,) = [w["gpudask"] for w in client.scheduler_info()["workers"].values()]
    assert published["plan"]["sections"]["rmm"]["initial_pool_size"] == 2 * 10**9


def _guide_options() -> dict[str, str]:
    """Every `dask cuda worker` option of the migration guide's table: {option: its row}."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parent.parent / "docs" / "migrating-from-dask-cuda.md").read_text()
    table = text.split("## `dask cuda worker` options", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`--"):
            for name in re.findall(r"(--[a-z][a-z-]+)", cells[0]):
                rows[name] = cells[1]
    return rows


def test_every_dask_cuda_option_is_honoured_refused_with_what_to_do_or_warned_about():
    """Walk the guide's table of dask-cuda's worker options: each is stock `dask worker`'s, a gpudask
    setting, refused in one line naming the alternative (not "did you mean" another option), or
    UCX-only and named in the one warning when the protocol is not UCX."""
    from distributed.cli.dask_worker import main as dask_worker

    from gpudask import bootstrap
    from gpudask.compat import dask_cuda
    from gpudask.errors import ConfigError

    stock = {name for p in dask_worker.params for name in [*p.opts, *p.secondary_opts]}
    taken = {name: o for o in dask_cuda.cli_options() for name in o.names}
    refused = dask_cuda.refused_options()
    options = bootstrap.inputs().settings.options
    rows = _guide_options()
    assert {"--enable-jit-unspill", "--shared-filesystem", "--multiprocessing-method", "--pre-import"} <= set(rows)
    outcomes = {}
    for name, row in rows.items():
        if name in taken:
            key = taken[name].argument.key
            outcomes[name] = "warned over tcp" if options[key].ucx_only else "a gpudask setting"
            assert key in row, (name, row)
        elif name in refused:
            with pytest.raises(ConfigError) as e:
                dask_cuda.take_cli_argv([name, "x"] if name in ("--multiprocessing-method", "--pre-import")
                                        else [name], "worker")
            line = str(e.value)
            assert "\n" not in line and "did you mean" not in line and len(line) < 400, line
            assert f"{name} (a dask cuda worker option) is not taken" in line and "; instead: " in line, line
            assert "refused" in row or "stock" in row, (name, row)  # the guide says so too
            outcomes[name] = "refused"
        else:
            assert name in stock, f"{name}: neither stock, a gpudask setting nor refused ({row})"
            assert row.startswith("stock"), (name, row)
            outcomes[name] = "stock"
    assert {n for n, o in outcomes.items() if o == "warned over tcp"} == {
        "--enable-tcp-over-ucx", "--disable-tcp-over-ucx", "--enable-infiniband", "--disable-infiniband",
        "--enable-nvlink", "--disable-nvlink", "--enable-rdmacm", "--disable-rdmacm"}


def test_the_ucx_transport_options_over_tcp_are_named_in_one_warning():
    from gpudask.bootstrap import plan_host
    from gpudask.compat import dask_cuda

    given = {"gpudask.transport.infiniband": "--enable-infiniband", "gpudask.transport.tcp": "--enable-tcp-over-ucx",
             "gpudask.transport.rdmacm": "--enable-rdmacm", "gpudask.transport.nvlink": "--enable-nvlink"}
    (line,) = [w for w in dask_cuda.without_effect(plan_host("tcp", 2, facts_path=HGX), given) if "UCX" in w]
    assert line.startswith("--enable-infiniband, --enable-tcp-over-ucx, --enable-rdmacm, --enable-nvlink have no "
                           "effect: the protocol is tcp"), line
    assert not [w for w in dask_cuda.without_effect(plan_host("ucx", 2, facts_path=HGX), given)
                if "the protocol is" in w]


@pytest.mark.process
def test_transport_options_on_a_tcp_worker_are_warned_about_once(cluster):
    env = base_env(GPUDASK_FACTS=HGX)
    cluster.scheduler("--preload", "gpudask", env=env)
    cluster.worker("--nworkers", "2", "--nthreads", "1", "--preload", "gpudask", "--enable-infiniband",
                   "--enable-tcp-over-ucx", "--enable-rdmacm", "--enable-nvlink", env=env)
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=90)
    warned = [line for line in cluster.log("worker").splitlines() if "have no effect: the protocol is tcp" in line]
    assert len(warned) == 1, cluster.log("worker")
    assert all(o in warned[0] for o in ("--enable-infiniband", "--enable-tcp-over-ucx", "--enable-rdmacm",
                                        "--enable-nvlink"))

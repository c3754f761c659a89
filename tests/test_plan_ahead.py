"""A ``dask worker`` started before its scheduler plans and applies for the likely protocol while
it waits (``gpudask_likely_protocol``, ``gpudask_listen_ahead``), and plans again when the
scheduler listens on another one.

Plan tests of the hooks' answers and checks; live tests with real ``dask worker`` processes
started before their ``dask scheduler`` on a described GPU host (UCX over TCP on this CPU).
"""

from __future__ import annotations

import os
import sys
import time
import types

import cloudpickle
import pytest
from conftest import HOSTS, base_env, host

from gpudask import bootstrap, hookimpl
from gpudask.errors import PluginError
from gpudask.plugin.manager import PluginManager

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TWO_GPUS = host("workstation-2gpu-pcie.json")


def _likely(facts_file: str) -> str | None:
    inputs = bootstrap.inputs(facts_path=HOSTS / facts_file)
    return inputs.manager.likely_protocol(inputs.facts)


def test_a_gpu_host_with_distributed_ucxx_is_likely_ucx_and_a_cpu_host_has_no_guess():
    assert _likely("single-gpu.json") == "ucx"
    assert _likely("no-gpu.json") is None


def _plugin(**hooks):
    return types.SimpleNamespace(name="third", priority=300, **{k: hookimpl(v) for k, v in hooks.items()})


@pytest.mark.parametrize("result", [3, "", "UCX with spaces", "x" * 40, ["ucx"]])
def test_a_likely_protocol_that_is_not_a_protocol_name_is_refused_in_one_line(result):
    manager = PluginManager.from_environment(extra=[_plugin(gpudask_likely_protocol=lambda facts: result)])
    facts = bootstrap.inputs(facts_path=HOSTS / "no-gpu.json").facts
    with pytest.raises(PluginError, match="third.*failed in gpudask_likely_protocol") as raised:
        manager.likely_protocol(facts)
    assert "expected None or a protocol name" in str(raised.value) and "\n" not in str(raised.value)


def test_the_first_plugin_in_priority_order_with_an_answer_names_the_protocol():
    manager = PluginManager.from_environment(extra=[_plugin(gpudask_likely_protocol=lambda facts: "tcp")])
    assert manager.likely_protocol(bootstrap.inputs(facts_path=HOSTS / "single-gpu.json").facts) == "ucx"
    assert manager.likely_protocol(bootstrap.inputs(facts_path=HOSTS / "no-gpu.json").facts) == "tcp"


def test_a_failing_listen_ahead_is_a_debug_line_and_the_other_plugins_still_run(caplog):
    ran = []

    def fails(ctx, plan):
        raise RuntimeError("no transport here")

    extra = [_plugin(gpudask_listen_ahead=fails),
             types.SimpleNamespace(name="fourth", priority=400,
                                   gpudask_listen_ahead=hookimpl(lambda ctx, plan: ran.append(1)))]
    host_plan = bootstrap.plan_host("tcp", 1, facts_path=HOSTS / "no-gpu.json", extra_plugins=extra)
    with caplog.at_level("DEBUG", logger="distributed.gpudask"):
        host_plan.ctx.manager.listen_ahead(host_plan.ctx, host_plan.for_role("nanny"))
    assert ran == [1]
    assert any("third" in r.getMessage() and "no transport here" in r.getMessage() for r in caplog.records)


# -- live: dask worker first, then its scheduler ------------------------------------------
def _start_worker_first(cluster, env):
    """``dask worker`` for a scheduler not started yet, once it has done its work ahead (the
    trace line of ``gpudask_listen_ahead``, written after the call)."""
    worker = cluster.worker("--preload", "gpudask", "--nworkers", "2", "--nthreads", "1", env=env)
    deadline = time.monotonic() + 90
    while "gpudask_listen_ahead" not in cluster.log("worker"):
        assert worker.poll() is None and time.monotonic() < deadline, cluster.log("worker")
        time.sleep(0.1)
    return worker


def _trace_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in base_env().items() if not k.startswith("UCX_") or k == "UCX_WARN_UNUSED_ENV_VARS"}
    env.update(GPUDASK_FACTS=TWO_GPUS, GPUDASK_TRACE_PLUGINS="1", **extra)
    return env


def _nanny_state():
    from gpudask.compat.distributed_ucxx import ucx_started

    return ucx_started()


@pytest.mark.process
@pytest.mark.ucx_client
def test_a_worker_started_before_its_ucx_scheduler_starts_ucx_while_it_waits(cluster):
    env = _trace_env()
    _start_worker_first(cluster, env)
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(2, timeout=120)
        assert client.submit(sum, [1, 2], pure=False).result(timeout=60) == 3
        workers = client.scheduler_info(n_workers=-1)["workers"]
        assert set(client.run(_nanny_state, nanny=True).values()) == {True}
    log = cluster.log("worker")
    # the hook ran before the nanny listened, which found UCX started
    assert log.index("gpudask_listen_ahead") < log.index("Start Nanny at:"), log
    assert "(nanny, protocol ucx, planned while the scheduler started)" in log, log
    assert "planning for" not in log
    for w in workers.values():
        assert w["gpudask"]["protocol"] == "ucx", w["gpudask"]["protocol"]


@pytest.mark.process
def test_a_worker_that_planned_ahead_for_ucx_plans_again_for_a_tcp_scheduler(cluster):
    env = _trace_env()
    _start_worker_first(cluster, env)
    cluster.scheduler("--preload", "gpudask", protocol="tcp", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(2, timeout=120)
        assert client.submit(sum, [1, 2], pure=False).result(timeout=60) == 3
        workers = client.scheduler_info(n_workers=-1)["workers"]
        live = client.run(lambda: {k: v for k, v in os.environ.items() if k.startswith("UCX_TLS")})
    log = cluster.log("worker")
    assert "planned ahead for ucx while the scheduler started; it listens on tcp: planning for tcp" in log, log
    assert "(nanny, protocol tcp): plugins" in log, log
    for address, w in workers.items():
        plan = w["gpudask"]["plan"]
        assert w["gpudask"]["protocol"] == "tcp" and "UCX_TLS" not in plan["env"], plan
        assert live[address] == {}, live  # nothing of the UCX plan was left in the workers' environment


@pytest.mark.process
def test_plan_ahead_false_waits_for_the_scheduler_before_planning(cluster):
    env = _trace_env(DASK_GPUDASK__START__PLAN_AHEAD="false")
    worker = cluster.worker("--preload", "gpudask", "--nworkers", "1", "--nthreads", "1", env=env)
    time.sleep(3)
    assert worker.poll() is None and "gpudask_listen_ahead" not in cluster.log("worker"), cluster.log("worker")
    cluster.scheduler("--preload", "gpudask", protocol="tcp", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(1, timeout=120)
    log = cluster.log("worker")
    assert "(nanny, protocol tcp): plugins" in log and "planned ahead" not in log and "listen_ahead" not in log, log


@pytest.mark.process
@pytest.mark.ucx_client
def test_a_preload_after_gpudask_keeps_the_transport_for_the_nannys_own_listen(cluster, tmp_path):
    """A preload imported after gpudask may set what UCX reads at its start: the plan is still made
    ahead, the transport is left to the nanny's own listen."""
    (tmp_path / "users_own_preload.py").write_text("VALUE = 1\n")
    env = _trace_env(PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), base_env().get("PYTHONPATH")])))
    worker = cluster.worker("--preload", "gpudask", "--preload", "users_own_preload", "--nworkers", "1",
                            "--nthreads", "1", env=env)
    time.sleep(3)
    assert worker.poll() is None, cluster.log("worker")
    cluster.scheduler("--preload", "gpudask", protocol="ucx", env=env)
    with cluster.client(timeout=60) as client:
        client.wait_for_workers(1, timeout=120)
    log = cluster.log("worker")
    assert "(nanny, protocol ucx, planned while the scheduler started)" in log, log
    assert "gpudask_listen_ahead" not in log, log

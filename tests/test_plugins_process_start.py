"""Process start on described hosts: GPU pinning, CPU affinity, forkserver, CUDA-context rules.

Plans come from ``gpudask.apply.process.plan_host`` -- the function behind ``gpudask info`` and
behind every preloaded process -- with the built-in plugins loaded from entry points.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import base_env, host, described, plan_on, sections_with

from gpudask.errors import GpudaskError

HGX = host("hgx-4gpu-2ib.json")  # 4 GPUs, CPUs 0-23 (GPU 0,1) and 24-47 (GPU 2,3), 2 ACTIVE IB ports
MIG = host("mig.json")
MIG_A, MIG_B = "MIG-b4ad9298-9b3b-52c9-a8dd-7886d1718e6d", "MIG-c0deef2d-20cc-53cf-bbe0-909f53d01f84"
UUID_0, UUID_1 = "GPU-4a4a7cc0-dccc-5f35-a637-296e51e8883b", "GPU-5a1ce6b0-981e-5c3c-adfe-eec30a070d42"


@pytest.fixture(autouse=True)
def _user_env(monkeypatch):
    """The user exported none of the variables these plugins decide."""
    for name in ("CUDA_VISIBLE_DEVICES", "UCX_TLS", "RAPIDS_NO_INITIALIZE", "UCX_IB_FORK_INIT",
                 "PTXCOMPILER_CHECK_NUMBA_CODEGEN_PATCH_NEEDED"):
        monkeypatch.delenv(name, raising=False)


def plan(facts, protocol="tcp", nworkers=None, **config):
    return plan_on(facts, protocol, nworkers, **config)


def cvds(host_plan):
    return [w.env.get("CUDA_VISIBLE_DEVICES") for w in host_plan.workers]


def reasons(process_plan, plugin):
    return [(r.decision, r.why) for r in process_plan.reasons if r.plugin == plugin]


# -- one GPU per worker -----------------------------------------------------------------
def test_each_worker_sees_its_gpu_first_then_the_others():
    h = plan(HGX)
    assert h.nworkers == 4
    assert cvds(h) == ["0,1,2,3", "1,2,3,0", "2,3,0,1", "3,0,1,2"]
    assert [(w.gpu_index, w.gpu) for w in h.workers] == [(i, h.facts.gpu_by_index(i).uuid) for i in range(4)]
    assert all(w.cuda_visible_devices == w.env["CUDA_VISIBLE_DEVICES"] for w in h.workers)
    decision, why = reasons(h.workers[1], "gpu-pinning")[0]
    assert decision == "CUDA_VISIBLE_DEVICES=1,2,3,0" and "worker 1 owns GPU 1" in why and "rotation" in why
    # only workers are pinned; no warning when every worker has a GPU of its own
    assert all("CUDA_VISIBLE_DEVICES" not in p.env for p in (h.scheduler, h.nanny, h.client))
    assert h.warnings == []


def test_fewer_workers_than_gpus_still_see_every_gpu():
    assert cvds(plan(HGX, nworkers=2)) == ["0,1,2,3", "1,2,3,0"]


def test_a_subset_named_by_the_user_is_rotated_within_itself(tmp_path):
    h = plan(host("subset-visible.json"))  # cuda_visible_devices "2,3"
    assert cvds(h) == ["2,3", "3,2"] and [w.gpu_index for w in h.workers] == [2, 3]
    assert "CUDA_VISIBLE_DEVICES=2,3 (the user's list" in reasons(h.workers[0], "gpu-pinning")[0][1]
    h = plan(described(tmp_path, "hgx-4gpu-2ib.json", cuda_visible_devices="3,1"))
    assert cvds(h) == ["3,1", "1,3"] and [w.gpu_index for w in h.workers] == [3, 1]


def test_uuid_entries_keep_their_form_and_the_users_order():
    h = plan(host("uuid-visible.json"))  # GPU 1's UUID listed first
    assert cvds(h) == [f"{UUID_1},{UUID_0}", f"{UUID_0},{UUID_1}"]
    assert [(w.gpu_index, w.gpu) for w in h.workers] == [(1, UUID_1), (0, UUID_0)]


def test_uuid_prefixes_are_kept_as_written(tmp_path):
    h = plan(described(tmp_path, "uuid-visible.json", cuda_visible_devices="GPU-4a4a7cc0,GPU-5a1ce6b0"))
    assert cvds(h) == ["GPU-4a4a7cc0,GPU-5a1ce6b0", "GPU-5a1ce6b0,GPU-4a4a7cc0"]
    assert [w.gpu for w in h.workers] == [UUID_0, UUID_1]


def test_negative_entry_ends_the_list_and_empty_means_no_gpu(tmp_path):
    h = plan(described(tmp_path, "hgx-4gpu-2ib.json", cuda_visible_devices="2,-1,3"))
    assert h.nworkers == 1 and cvds(h) == ["2"]
    h = plan(described(tmp_path, "hgx-4gpu-2ib.json", cuda_visible_devices=""), nworkers=2)
    assert cvds(h) == [None, None]
    assert reasons(h.workers[0], "gpu-pinning") == [("skipped", "no GPU visible")]


def test_mig_instances_are_gpus_of_their_own_named_by_uuid():
    h = plan(MIG, nworkers=2)
    assert cvds(h) == [f"{MIG_A},{MIG_B}", f"{MIG_B},{MIG_A}"]
    assert [(w.gpu_index, w.gpu) for w in h.workers] == [(0, MIG_A), (0, MIG_B)]
    assert h.warnings == []  # two instances, two workers: nothing shared
    assert "MIG instance" in reasons(h.workers[1], "gpu-pinning")[0][1]


def test_mig_entries_set_by_the_user_keep_their_form(tmp_path):
    h = plan(described(tmp_path, "mig.json", cuda_visible_devices=f"{MIG_B},{MIG_A}"))
    assert cvds(h) == [f"{MIG_B},{MIG_A}"]  # one visible GPU: one worker by default
    assert h.workers[0].gpu == MIG_B
    h = plan(described(tmp_path, "mig.json", cuda_visible_devices="MIG-c0deef2d,MIG-b4ad9298"), nworkers=2)
    assert cvds(h) == ["MIG-c0deef2d,MIG-b4ad9298", "MIG-b4ad9298,MIG-c0deef2d"]
    assert [w.gpu for w in h.workers] == [MIG_B, MIG_A]  # the full UUID of the instance named by a prefix
    old_form = "MIG-GPU-4ee8ecee-e2c6-5c2b-89de-36a5e2bd5738/2/0"  # driver < 470: MIG-<GPU uuid>/<gi>/<ci>
    h = plan(described(tmp_path, "mig.json", cuda_visible_devices=old_form))
    assert cvds(h) == [old_form] and h.workers[0].gpu == MIG_B


def test_more_workers_than_gpus_share_round_robin_with_a_warning():
    h = plan(host("workstation-2gpu-pcie.json"), nworkers=3)
    assert cvds(h) == ["0,1", "1,0", "0,1"] and [w.gpu_index for w in h.workers] == [0, 1, 0]
    assert any("3 workers on 2 visible GPU(s)" in w and "round-robin" in w for w in h.warnings)
    assert "3 workers share 2 GPU(s) round-robin" in reasons(h.workers[2], "gpu-pinning")[0][1]
    assert all(w.resources == {"GPU": 1} for w in h.workers)


def test_every_worker_advertises_one_gpu_unless_the_user_set_resources():
    h = plan(HGX, nworkers=2)
    assert [w.resources for w in h.workers] == [{"GPU": 1}, {"GPU": 1}]
    assert h.nanny.resources == {} and h.scheduler.resources == {}
    h = plan(HGX, nworkers=2, **{"distributed.worker.resources": {"GPU": 2, "MEM": 1}})
    assert [w.resources for w in h.workers] == [{}, {}]
    (decision, why), = [r for r in reasons(h.workers[0], "gpu-pinning") if r[0].startswith("no GPU resource")]
    assert "set by the user" in why and "'GPU': 2" in why


def test_no_gpu_every_process_plugin_skips():
    h = plan(host("no-gpu.json"), nworkers=2)
    for w in h.workers:
        assert w.gpu is None and w.cuda_visible_devices is None and w.resources == {} and w.cpu_affinity is None
        for plugin in ("gpu-pinning", "cpu-affinity", "cuda-context"):
            assert ("skipped", "no GPU visible") in reasons(w, plugin), plugin
        assert "RAPIDS_NO_INITIALIZE" not in w.env
    assert h.warnings == []


# -- CPU affinity -----------------------------------------------------------------------
def test_workers_are_bound_to_the_cpus_local_to_their_gpu():
    h = plan(HGX)
    assert [w.cpu_affinity for w in h.workers] == [list(range(24))] * 2 + [list(range(24, 48))] * 2
    decision, why = reasons(h.workers[2], "cpu-affinity")[0]
    assert decision == "cpu_affinity=24-47" and "GPU 2 (NUMA node 1)" in why and "within those the process may use" in why
    # described: recorded, and said not to be applied on this machine
    assert any(d == "CPU binding not applied here" for d, _ in reasons(h.workers[2], "cpu-affinity"))
    assert h.nanny.cpu_affinity is None and h.scheduler.cpu_affinity is None


def test_shared_gpus_share_their_cpus(tmp_path):
    h = plan(described(tmp_path, "hgx-4gpu-2ib.json", cuda_visible_devices="2"), nworkers=2)
    assert [w.cpu_affinity for w in h.workers] == [list(range(24, 48))] * 2


def test_cpu_affinity_can_be_turned_off():
    h = plan(HGX, nworkers=1, **{"gpudask.cpu-affinity.enabled": False})
    assert h.workers[0].cpu_affinity is None
    assert reasons(h.workers[0], "cpu-affinity") == [
        ("skipped", "gpudask.cpu-affinity.enabled=false (from dask config)")]


def test_gpu_without_nvml_affinity_is_skipped(tmp_path):
    with open(HGX) as f:
        data = json.load(f)
    data["gpus"][1]["cpu_affinity"] = []
    path = tmp_path / "noaff.json"
    path.write_text(json.dumps(data))
    h = plan(str(path), nworkers=2)
    assert h.workers[0].cpu_affinity == list(range(24)) and h.workers[1].cpu_affinity is None
    assert reasons(h.workers[1], "cpu-affinity") == [("skipped", "NVML reports no CPU affinity for GPU 1")]


BIND = textwrap.dedent("""
    import os, sys, threading, logging, types
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from gpudask.apply.process import bind_cpus
    ctx = types.SimpleNamespace(facts=types.SimpleNamespace(described=False))
    started, stop = threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: (started.set(), stop.wait()))
    t.start(); started.wait()
    allowed = sorted(os.sched_getaffinity(0))
    bind_cpus([allowed[0], 100000], ctx)   # 100000: no such CPU here, dropped by the intersection
    def cpus(tid):
        for line in open(f"/proc/self/task/{tid}/status"):
            if line.startswith("Cpus_allowed_list:"):
                return line.split()[1]
    print("BOUND", sorted({cpus(tid) for tid in os.listdir("/proc/self/task")}), allowed[0])
    bind_cpus([100000], ctx)               # nothing allowed: a warning, not a failure
    stop.set(); t.join()
""")


@pytest.mark.process
def test_cpu_binding_covers_existing_threads_and_only_warns_when_impossible():
    out = subprocess.run([sys.executable, "-c", BIND], capture_output=True, text=True, timeout=60, env=base_env())
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("BOUND"))
    assert line == f"BOUND ['{line.split()[-1]}'] {line.split()[-1]}"  # every thread on the one CPU
    assert "CPU affinity [100000] not applied: none of these CPUs is allowed" in out.stderr


# -- forkserver -------------------------------------------------------------------------
def test_forkserver_with_ucx_over_infiniband():
    h = plan(HGX, "ucx", nworkers=2)
    assert h.nanny.multiprocessing_method == "forkserver" and h.client.multiprocessing_method == "forkserver"
    assert [w.multiprocessing_method for w in h.workers] == ["forkserver"] * 2
    assert h.scheduler.multiprocessing_method is None
    assert "mlx5_0:1, mlx5_1:1" in reasons(h.nanny, "forkserver")[0][1]
    assert all(w.env["PTXCOMPILER_CHECK_NUMBA_CODEGEN_PATCH_NEEDED"] == "0" for w in h.workers)
    assert "UCX_IB_FORK_INIT" not in h.workers[0].env  # diagnostics are opt-in


def test_forkserver_on_gpu_hosts_for_a_faster_start_whatever_the_protocol():
    for facts, protocol in ((HGX, "tcp"), (host("workstation-2gpu-pcie.json"), "ucx"), (host("h200-single.json"), "tcp")):
        h = plan(facts, protocol, nworkers=2)
        assert h.nanny.multiprocessing_method == h.client.multiprocessing_method == "forkserver"
        assert [w.multiprocessing_method for w in h.workers] == ["forkserver"] * 2
        assert all(w.env["PTXCOMPILER_CHECK_NUMBA_CODEGEN_PATCH_NEEDED"] == "0" for w in h.workers)
        why = reasons(h.nanny, "forkserver")[0][1]
        assert "already imported distributed" in why and "InfiniBand" not in why
    # a start method the user chose wins, without a warning where no InfiniBand is involved
    # (spawn is distributed's default, indistinguishable from no choice: the way back to spawn
    # is gpudask.forkserver.enabled=false)
    h = plan(host("h200-single.json"), "tcp", nworkers=1, **{"distributed.worker.multiprocessing-method": "fork"})
    assert h.nanny.multiprocessing_method is None and not h.warnings
    assert "set by the user (explicit settings win)" in reasons(h.nanny, "forkserver")[0][1]
    h = plan(host("h200-single.json"), "tcp", nworkers=1, **{"gpudask.forkserver.enabled": False})
    assert h.nanny.multiprocessing_method is None and h.workers[0].multiprocessing_method is None


def test_no_forkserver_without_a_gpu_unless_ucx_uses_active_infiniband(tmp_path):
    h = plan(host("no-gpu.json"), "tcp", nworkers=1)
    assert h.nanny.multiprocessing_method is None and h.workers[0].multiprocessing_method is None
    assert "PTXCOMPILER_CHECK_NUMBA_CODEGEN_PATCH_NEEDED" not in h.workers[0].env
    assert reasons(h.nanny, "forkserver")[0] == ("forkserver not used", "no GPU visible and no active InfiniBand "
                                                 "port: worker processes start as distributed's config says")
    # one DOWN InfiniBand port, one RoCE port and one ACTIVE InfiniBand port: the last one counts
    no_peers = sections_with("ib-down-and-roce.json", nvlink={"peers": {}})  # the host without its GPUs
    roce = described(tmp_path, "ib-down-and-roce.json", gpus=[], sections=no_peers)
    h = plan(roce, "ucx")
    assert h.nanny.multiprocessing_method == "forkserver" and "mlx5_2:1" in reasons(h.nanny, "forkserver")[0][1]
    with open(host("ib-down-and-roce.json")) as f:
        ports = [d for d in json.load(f)["sections"]["infiniband"]["ports"] if d["name"] != "mlx5_2"]
    h = plan(described(tmp_path, "ib-down-and-roce.json", gpus=[], sections={**no_peers, "infiniband": {"ports": ports}}),
             "ucx")
    assert h.nanny.multiprocessing_method is None
    assert "no active InfiniBand port" in reasons(h.nanny, "forkserver")[0][1]


def test_forkserver_when_asked_and_never_when_refused():
    h = plan(host("no-gpu.json"), "tcp", nworkers=1, **{"gpudask.forkserver.enabled": True})
    assert h.nanny.multiprocessing_method == "forkserver" and h.workers[0].multiprocessing_method == "forkserver"
    assert "gpudask.forkserver.enabled=true" in reasons(h.nanny, "forkserver")[0][1]
    h = plan(HGX, "ucx", nworkers=1, **{"gpudask.forkserver.enabled": False})
    assert h.nanny.multiprocessing_method is None
    assert "not fork-safe" in reasons(h.nanny, "forkserver")[0][1]


def test_an_explicit_start_method_wins_over_detection_with_a_warning():
    h = plan(HGX, "ucx", nworkers=1, **{"distributed.worker.multiprocessing-method": "fork"})
    assert h.nanny.multiprocessing_method is None
    assert "set by the user (explicit settings win)" in reasons(h.nanny, "forkserver")[0][1]
    assert any("multiprocessing-method='fork'" in w for w in h.warnings)


def test_fork_diagnostics_are_opt_in():
    h = plan(HGX, "ucx", nworkers=1, **{"gpudask.forkserver.diagnose-fork": True})
    for p in (h.nanny, h.client, h.workers[0]):
        assert p.env["UCX_IB_FORK_INIT"] == "n"
    assert "UCX_IB_FORK_INIT" not in h.scheduler.env


def test_bad_forkserver_setting_is_one_clear_line():
    with pytest.raises(GpudaskError, match=r"gpudask.forkserver.enabled = 'sometimes' .*true, false or null"):
        plan(HGX, "ucx", **{"gpudask.forkserver.enabled": "sometimes"})


DIAGNOSE = textwrap.dedent("""
    import logging, os, sys
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import dask
    dask.config.set({"gpudask.forkserver.diagnose-fork": True})
    from gpudask.apply.process import plan_host
    host = plan_host("ucx", 1, facts_path=sys.argv[1])
    host.ctx.manager.context_init(host.ctx, host.workers[0])
    from distributed_ucxx import ucxx
    ucxx.init_once()            # real UCX (UCX_TLS=tcp)
    def fork_in_a_task():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    fork_in_a_task()
    print("FORKED")
""")


@pytest.mark.process
def test_fork_after_ucx_init_is_named_in_diagnostic_mode():
    out = subprocess.run([sys.executable, "-c", DIAGNOSE, HGX], capture_output=True, text=True, timeout=120,
                         env=base_env(UCX_TLS="tcp"))
    assert out.returncode == 0 and "FORKED" in out.stdout, out.stderr
    assert "fork diagnostics on in worker 0" in out.stderr
    assert "worker 0 (pid" in out.stderr and "is forking after UCX initialised" in out.stderr
    assert "in fork_in_a_task" in out.stderr  # the Python code that forked


# -- CUDA context -----------------------------------------------------------------------
def test_no_cuda_context_at_import_outside_and_inside_workers():
    h = plan(HGX, "ucx", nworkers=2)
    for p in (h.scheduler, h.nanny, *h.workers):
        assert p.env["RAPIDS_NO_INITIALIZE"] == "1", p.role
    assert "RAPIDS_NO_INITIALIZE" not in h.client.env  # the client's environment is the user's
    assert any("must hold no CUDA context" in why for _, why in reasons(h.nanny, "cuda-context"))
    # described: nothing touching a device runs, and the reasons say so
    for p in (h.scheduler, h.nanny, *h.workers):
        assert any(d == "CUDA context check not run here" for d, _ in reasons(p, "cuda-context")), p.role


def test_the_worker_context_is_created_first_when_ucx_needs_one(monkeypatch):
    h = plan(HGX, "ucx", nworkers=2, **{"distributed-ucxx.create-cuda-context": True})
    decisions = [d for d, _ in reasons(h.workers[1], "cuda-context")]
    assert f"CUDA context on {h.workers[1].gpu} before UCX" in decisions
    monkeypatch.setenv("UCX_TLS", "tcp,cuda_copy")  # the user's UCX_TLS names a cuda transport
    h = plan(HGX, "ucx", nworkers=1)
    assert any(d.startswith("CUDA context on") for d, _ in reasons(h.workers[0], "cuda-context"))
    monkeypatch.setenv("UCX_TLS", "tcp")
    h = plan(HGX, "ucx", nworkers=1)
    assert not any(d.startswith("CUDA context on") for d, _ in reasons(h.workers[0], "cuda-context"))
    h = plan(HGX, "tcp", nworkers=1, **{"distributed-ucxx.create-cuda-context": True})
    assert not any(d.startswith("CUDA context on") for d, _ in reasons(h.workers[0], "cuda-context"))


def test_on_existing_policy_is_validated():
    assert plan(HGX, nworkers=1, **{"gpudask.context.on-existing": "error"}).ctx.settings[
        "gpudask.context.on-existing"] == "error"
    with pytest.raises(GpudaskError, match=r"gpudask.context.on-existing = 'ignore' .*warn \| error"):
        plan(HGX, nworkers=1, **{"gpudask.context.on-existing": "ignore"})


@pytest.mark.process
def test_gpudask_info_prints_the_same_plan():
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--json", "--facts", HGX, "--protocol", "ucx",
                          "--nworkers", "2"], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in base_env().items() if k != "UCX_TLS"})
    assert out.returncode == 0, out.stderr
    workers = json.loads(out.stdout)["workers"]
    h = plan(HGX, "ucx", nworkers=2)
    for printed, planned in zip(workers, h.workers):
        for field in ("gpu", "cuda_visible_devices", "cpu_affinity", "multiprocessing_method", "resources"):
            assert printed[field] == planned.to_dict()[field], field
    assert workers[1]["cuda_visible_devices"] == "1,2,3,0" and workers[1]["multiprocessing_method"] == "forkserver"
    assert workers[0]["env"]["RAPIDS_NO_INITIALIZE"] == "1"


def test_ucxx_warning_about_gpudasks_own_context_only_is_dropped():
    import logging

    from gpudask.plugins.cuda_context import _OwnContextFilter

    own = "GPU-00000000-0000-0000-0000-000000000001"
    f = _OwnContextFilter([own, "00000000-0000-0000-0000-000000000001"])

    def record(text):
        return logging.LogRecord("distributed_ucxx.ucxx", logging.WARNING, __file__, 1, text, None, None)

    suffix = "This is often the result of a CUDA-enabled library calling a CUDA runtime function..."
    assert not f.filter(record(f"A CUDA context for device 1 ({own}) already exists on process ID {os.getpid()}. "
                               + suffix))
    other = "GPU-00000000-0000-0000-0000-000000000000"
    assert f.filter(record(f"A CUDA context for device 0 ({other}) already exists on process ID {os.getpid()}. "
                           + suffix))
    assert f.filter(record(f"A CUDA context for device 1 ({own}) already exists on process ID 1. " + suffix))
    assert f.filter(record("Worker with process ID 5 should have a CUDA context assigned to device 1"))

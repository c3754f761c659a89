"""Transport selection on described hosts: the tcp, nvlink and infiniband plugins (docs/transports.md).

Plans come from ``gpudask.apply.process.plan_host`` -- what ``gpudask info`` prints and what every
preloaded process applies -- with the built-in plugins loaded from entry points.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import dask
import pytest
from conftest import base_env, host, described, plan_on, sections_with

from gpudask.errors import GpudaskError
from gpudask.plugins.ucx.infiniband import nearest_ports
from gpudask.plugins.ucx.infiniband_facts import ports as infiniband_ports
from gpudask.pluginapi import tls_enables
from gpudask.apply.process import plan_host

HGX = host("hgx-4gpu-2ib.json")  # 4 GPUs full NVLink mesh; GPU 0,1 under mlx5_0's switch, GPU 2,3 under mlx5_1's
DGX = host("dgx-8gpu-nvswitch-4ib.json")  # 8 GPUs on NVSwitch, 4 ports, two GPUs per PCIe switch
PARTIAL = host("partial-nvlink.json")  # NVLink pairs 0-1 and 2-3, no IB
PCIE = host("workstation-2gpu-pcie.json")  # 2 GPUs, no NVLink, no IB
ROCE = host("ib-down-and-roce.json")  # mlx5_0 DOWN, mlx5_1 RoCE, mlx5_2 ACTIVE InfiniBand
NUMA_ONLY = host("ib-numa-only.json")  # PCI paths unknown: GPU 0,1 + mlx5_0,1 on node 0; GPU 2,3 + mlx5_2 on node 1
CPU_IB = host("cpu-ib.json")  # no GPU, one active InfiniBand port, distributed-ucxx installed
SINGLE = host("single-gpu.json")
SUBSET = host("subset-visible.json")  # the hgx host with cuda_visible_devices "2,3"
MIG = host("mig.json")
NO_UCXX = host("ucx-missing.json")  # CUDA 12 driver, distributed-ucxx not installed
UCX_FLAGS = ("tcp", "cuda-copy", "nvlink", "infiniband", "rdmacm")


@pytest.fixture(autouse=True)
def _user_env(monkeypatch):
    """The user exported none of the variables these plugins decide; dask config restored after each test."""
    for name in ("CUDA_VISIBLE_DEVICES", "UCX_TLS", "UCX_NET_DEVICES", "UCX_SOCKADDR_TLS_PRIORITY",
                 "UCX_MAX_RNDV_RAILS", "UCX_MEMTYPE_REG_WHOLE_ALLOC_TYPES"):
        monkeypatch.delenv(name, raising=False)
    saved = copy.deepcopy(dask.config.config)
    yield
    dask.config.config.clear()
    dask.config.config.update(saved)


def plan(facts, protocol="ucx", nworkers=None, **config):
    return plan_on(facts, protocol, nworkers, **config)


def tls(p):
    return p.env.get("UCX_TLS")


def why(p, plugin, decision):
    found = [r.why for r in p.reasons if r.plugin == plugin and r.decision == decision]
    assert found, (plugin, decision, [(r.plugin, r.decision) for r in p.reasons])
    return found[0]


def flags(p):
    return {k: p.config.get(f"distributed-ucxx.{k}") for k in (*UCX_FLAGS, "create-cuda-context")}


def all_plans(h):
    return [h.scheduler, h.nanny, h.client, *h.workers]


# -- NVLink / CUDA IPC ---------------------------------------------------------------
def test_nvlink_full_mesh_gives_every_worker_cuda_ipc_and_the_cuda_context():
    h = plan(HGX)
    for w in h.workers:
        assert tls(w) == "rc,tcp,cuda_copy,cuda_ipc"
        assert w.ucx_transports == ["rc", "tcp", "cuda_copy", "cuda_ipc"]
        assert flags(w) == {"tcp": True, "cuda-copy": True, "nvlink": True, "infiniband": True, "rdmacm": True,
                            "create-cuda-context": True}
    peers = why(h.workers[2], "nvlink", "UCX transport cuda_ipc")
    assert peers.startswith("GPU 2 has NVLink peers 0, 1, 3 among the visible GPUs: CUDA IPC is allowed for every "
                            "peer of this host")
    assert "worker 0 uses GPU 0" in why(h.workers[0], "nvlink", "UCX transport cuda_copy")


def test_partial_nvlink_counts_only_peers_that_are_visible(tmp_path):
    h = plan(PARTIAL)  # pairs 0-1, 2-3: every GPU has a visible peer
    assert [tls(w) for w in h.workers] == ["tcp,cuda_copy,cuda_ipc"] * 4
    assert why(h.workers[0], "nvlink", "UCX transport cuda_ipc").startswith(
        "GPU 0 has NVLink peer 1 among the visible GPUs: ")
    # not peers of each other, and each peer is outside CUDA_VISIBLE_DEVICES -- another command's
    # workers may use them (one command per GPU pair): cuda_ipc stays allowed
    h = plan(described(tmp_path, "partial-nvlink.json", cuda_visible_devices="0,2"))
    assert [w.gpu_index for w in h.workers] == [0, 2]
    assert [tls(w) for w in h.workers] == ["tcp,cuda_copy,cuda_ipc"] * 2
    assert all(flags(w)["nvlink"] is True and flags(w)["create-cuda-context"] is True for w in h.workers)
    assert why(h.workers[1], "nvlink", "UCX transport cuda_ipc").startswith(
        "GPU 2: its NVLink peer 3 is not visible here (other processes may use them): CUDA IPC is allowed")


def test_pcie_only_still_allows_cuda_ipc_for_every_peer():
    """No NVLink: CUDA IPC still reaches processes on the same GPU (a client, the scheduler, another
    command's workers) and PCIe peers; UCX uses it where it works."""
    h = plan(PCIE)
    assert [tls(w) for w in h.workers] == ["tcp,cuda_copy,cuda_ipc"] * 2
    assert why(h.workers[1], "nvlink", "UCX transport cuda_ipc").startswith(
        "GPU 1: no NVLink peer and no other worker of this command on it: CUDA IPC is allowed for every peer")
    assert all("UCX_NET_DEVICES" not in w.env and w.interface is None for w in h.workers)


def test_workers_sharing_a_gpu_get_cuda_ipc():
    h = plan(SINGLE, nworkers=2)
    assert [tls(w) for w in h.workers] == ["tcp,cuda_copy,cuda_ipc"] * 2
    assert "GPU 0 is shared by workers 0, 1 of this command" in why(h.workers[1], "nvlink", "UCX transport cuda_ipc")
    # three workers on two PCIe GPUs: GPU 0 is shared by workers 0 and 2, GPU 1 by nobody -- all have cuda_ipc
    h = plan(PCIE, nworkers=3)
    assert [tls(w) for w in h.workers] == ["tcp,cuda_copy,cuda_ipc"] * 3


def test_mig_instances_get_no_cuda_ipc():
    h = plan(MIG, nworkers=2)
    assert all(tls(w) == "tcp,cuda_copy" for w in h.workers)
    assert "MIG instances" in why(h.workers[0], "nvlink", "no UCX transport cuda_ipc")


# -- InfiniBand: nearest port -----------------------------------------------------------
def test_several_gpus_per_port_use_the_port_under_their_pcie_switch():
    h = plan(HGX)
    assert [w.env["UCX_NET_DEVICES"] for w in h.workers] == ["mlx5_0:1", "mlx5_0:1", "mlx5_1:1", "mlx5_1:1"]
    assert [w.interface for w in h.workers] == ["ib0", "ib0", "ib1", "ib1"]
    assert why(h.workers[1], "infiniband", "UCX_NET_DEVICES=mlx5_0:1") == \
        "mlx5_0 shares the PCIe switch 0000:01:00.0 with GPU 1"
    assert "ib1 is the IP interface of mlx5_1:1" in why(h.workers[3], "infiniband", "interface=ib1")
    for w in h.workers:
        assert w.env["UCX_SOCKADDR_TLS_PRIORITY"] == "rdmacm"
        assert w.env["UCX_MAX_RNDV_RAILS"] == "1" and w.env["UCX_MEMTYPE_REG_WHOLE_ALLOC_TYPES"] == "cuda"


def test_dgx_pairs_each_gpu_with_the_port_on_its_switch():
    h = plan(DGX)
    assert [w.env["UCX_NET_DEVICES"] for w in h.workers] == [f"mlx5_{i // 2}:1" for i in range(8)]
    assert [w.interface for w in h.workers] == ["ibp26s0"] * 2 + ["ibp59s0"] * 2 + ["ibp156s0"] * 2 + ["ibp189s0"] * 2


def test_equally_near_ports_are_spread_by_numa_node_when_paths_are_unknown():
    h = plan(NUMA_ONLY)
    assert [w.env["UCX_NET_DEVICES"] for w in h.workers] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_2:1"]
    text = why(h.workers[1], "infiniband", "UCX_NET_DEVICES=mlx5_1:1")
    assert text.startswith("mlx5_1 shares NUMA node 0 with GPU 1 (PCI path unknown); equally near: mlx5_0:1, mlx5_1:1")


def test_equally_near_ports_under_one_switch_are_spread(tmp_path):
    with open(HGX) as f:
        data = json.load(f)
    ports = data["sections"]["infiniband"]["ports"]
    extra = dict(ports[0], name="mlx5_2", netdev="ib2",
                 pci_path="/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:11.0/0000:09:00.0")
    sections = sections_with("hgx-4gpu-2ib.json", infiniband={"ports": [*ports, extra]})
    h = plan(described(tmp_path, "hgx-4gpu-2ib.json", sections=sections,
                       net_interfaces={**data["net_interfaces"], "ib2": ["192.168.12.4"]}))
    assert [w.env["UCX_NET_DEVICES"] for w in h.workers] == ["mlx5_0:1", "mlx5_2:1", "mlx5_1:1", "mlx5_1:1"]
    assert [w.interface for w in h.workers] == ["ib0", "ib2", "ib1", "ib1"]


def test_spreading_never_leaves_an_equally_near_port_idle_while_another_serves_two():
    facts = plan_host("ucx", facts_path=NUMA_ONLY).facts
    ports = infiniband_ports(facts)
    chosen = nearest_ports(facts.gpus, ports)
    load = {}
    for port, _ in chosen.values():
        load[port.name] = load.get(port.name, 0) + 1
    assert load == {"mlx5_0": 1, "mlx5_1": 1, "mlx5_2": 2}


def test_down_and_roce_ports_are_not_infiniband():
    h = plan(ROCE)
    for p in all_plans(h):
        assert tls(p).startswith("rc,tcp")
        assert why(p, "infiniband", "not InfiniBand") == (
            "mlx5_0:1 is DOWN; mlx5_1:1 has link layer Ethernet (RoCE): only ACTIVE ports with link layer "
            "InfiniBand are used")
    assert {w.env["UCX_NET_DEVICES"] for w in h.workers} == {"mlx5_2:1"}
    assert {w.interface for w in h.workers} == {"ibp72s0"}
    assert why(h.workers[0], "infiniband", "UCX_NET_DEVICES=mlx5_2:1") == \
        "mlx5_2 is under another PCI root complex than GPU 0 (no active port is nearer)"
    assert why(h.workers[3], "infiniband", "UCX_NET_DEVICES=mlx5_2:1") == \
        "mlx5_2 shares the PCIe switch 0000:41:00.0 with GPU 3"


def test_without_an_active_infiniband_port_there_is_no_rc(tmp_path):
    with open(ROCE) as f:
        ports = json.load(f)["sections"]["infiniband"]["ports"][:2]  # only the DOWN and the RoCE port
    h = plan(described(tmp_path, "ib-down-and-roce.json",
                       sections=sections_with("ib-down-and-roce.json", infiniband={"ports": ports})))
    for p in all_plans(h):
        assert "rc" not in tls(p).split(",")
        assert not {"UCX_NET_DEVICES", "UCX_SOCKADDR_TLS_PRIORITY", "UCX_MAX_RNDV_RAILS"} & set(p.env)
        assert flags(p)["infiniband"] is False and flags(p)["rdmacm"] is False
    assert [w.interface for w in h.workers] == [None] * 4


def test_subset_of_visible_gpus_uses_their_ports():
    h = plan(SUBSET)
    assert h.nworkers == 2 and [w.gpu_index for w in h.workers] == [2, 3]
    assert [w.env["UCX_NET_DEVICES"] for w in h.workers] == ["mlx5_1:1", "mlx5_1:1"]
    assert [tls(w) for w in h.workers] == ["rc,tcp,cuda_copy,cuda_ipc"] * 2  # 2 and 3 are NVLink peers
    assert why(h.workers[0], "nvlink", "UCX transport cuda_ipc").startswith("GPU 2 has NVLink peer 3 among the visible GPUs")


def test_interface_is_left_alone_when_the_port_has_no_ip(tmp_path):
    with open(HGX) as f:
        nets = json.load(f)["net_interfaces"]
    h = plan(described(tmp_path, "hgx-4gpu-2ib.json", net_interfaces={**nets, "ib1": []}))
    assert [w.interface for w in h.workers] == ["ib0", "ib0", None, None]
    assert why(h.workers[2], "infiniband", "interface not set") == \
        "ib1, the interface of mlx5_1, has no IPv4 address"


# -- processes that move no GPU data ----------------------------------------------------
def test_nanny_gets_no_cuda_transport_and_no_cuda_context():
    for facts in (HGX, PARTIAL, SINGLE):
        p = plan(facts).nanny
        assert not any(t.startswith("cuda") for t in tls(p).split(","))
        assert flags(p)["create-cuda-context"] is False
        assert flags(p)["cuda-copy"] is False and flags(p)["nvlink"] is False
        assert "UCX_NET_DEVICES" not in p.env and p.interface is None
    h = plan(HGX)
    assert tls(h.nanny) == "rc,tcp"
    assert "the nanny moves no GPU data" in \
        why(h.nanny, "nvlink", "distributed-ucxx.create-cuda-context=False")


def test_scheduler_with_a_gpu_relays_cuda_copy_cuda_ipc_and_its_context():
    """With direct-to-workers null every gathered result and GPU argument of submit passes through the scheduler."""
    h = plan(HGX)  # NVLink mesh: GPU 0 has peers
    s = h.scheduler
    assert tls(s) == "rc,tcp,cuda_copy,cuda_ipc"
    assert flags(s)["create-cuda-context"] is True and flags(s)["cuda-copy"] is True and flags(s)["nvlink"] is True
    assert "the scheduler relays GPU frames" in why(s, "nvlink", "UCX transport cuda_copy")
    assert "NVLink peers" in why(s, "nvlink", "UCX transport cuda_ipc")
    assert "UCX_NET_DEVICES" not in s.env and s.interface is None  # it talks to every worker: every port
    assert s.env["UCX_MEMTYPE_REG_WHOLE_ALLOC_TYPES"] == "cuda"
    assert "rmm" not in s.sections  # no RMM pool unless asked
    assert any(r.plugin == "cuda-context" and "520 MiB" in r.why for r in s.reasons)
    assert "CUDA_VISIBLE_DEVICES" not in s.env and s.gpu is None  # not pinned: device 0 of what it sees
    s = plan(SINGLE).scheduler  # one GPU, shared with worker 0 of this host
    assert tls(s) == "tcp,cuda_copy,cuda_ipc"
    assert "the scheduler and worker(s) 0 of this host use GPU 0" in why(s, "nvlink", "UCX transport cuda_ipc")
    s = plan(PCIE, nworkers=1).scheduler  # GPU 0 used by worker 0; no NVLink
    assert tls(s) == "tcp,cuda_copy,cuda_ipc"


def test_scheduler_without_a_gpu_gets_no_cuda_and_says_why():
    s = plan(CPU_IB).scheduler
    assert tls(s) == "rc,tcp" and flags(s)["create-cuda-context"] is False
    assert "cannot pass through this scheduler" in why(s, "nvlink", "skipped")
    assert "the scheduler sees no GPU" in why(s, "nvlink", "distributed-ucxx.create-cuda-context=False")


def test_scheduler_with_a_gpu_over_tcp_plans_no_ucx():
    s = plan(HGX, "tcp").scheduler
    assert "UCX_TLS" not in s.env and "distributed-ucxx.create-cuda-context" not in s.config


def test_explicit_ucx_tls_for_the_scheduler_wins_and_warns_when_it_cannot_relay(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "tcp")
    h = plan(SINGLE)
    assert tls(h.scheduler) == "tcp" and flags(h.scheduler)["cuda-copy"] is False
    assert "explicit settings win" in why(h.scheduler, "gpudask", "UCX_TLS=tcp")
    assert "distributed-ucxx.create-cuda-context" not in h.scheduler.config
    assert any("the scheduler has GPU 0 but no CUDA transport" in w for w in h.warnings)
    monkeypatch.setenv("UCX_TLS", "tcp,cuda_copy")
    h = plan(SINGLE)
    assert tls(h.scheduler) == "tcp,cuda_copy" and flags(h.scheduler)["create-cuda-context"] is True
    assert not any("no CUDA transport" in w for w in h.warnings)


@pytest.mark.parametrize("value", [True, False])
def test_explicit_create_cuda_context_is_the_plan_set_by_you(monkeypatch, value):
    monkeypatch.setenv("DASK_DISTRIBUTED_UCXX__CREATE_CUDA_CONTEXT", str(value))
    dask.config.refresh()
    h = plan(SINGLE)
    for p in (h.scheduler, h.nanny, *h.workers):
        assert flags(p)["create-cuda-context"] is value, p.role
        assert "set by you" in why(p, "nvlink", f"distributed-ucxx.create-cuda-context={value}")
    assert any("creates a CUDA context in the nanny" in w for w in h.warnings) is value
    s = plan(CPU_IB).scheduler  # no GPU: the user's value still wins, and is said
    assert flags(s)["create-cuda-context"] is value


def test_client_with_a_gpu_gets_cuda_transports_and_the_port_of_its_gpu():
    h = plan(HGX)
    assert tls(h.client) == "rc,tcp,cuda_copy,cuda_ipc"
    assert h.client.env["UCX_NET_DEVICES"] == "mlx5_0:1" and h.client.interface is None
    assert flags(h.client)["create-cuda-context"] is True
    h = plan(PCIE)  # the client shares GPU 0 with worker 0
    assert tls(h.client) == "tcp,cuda_copy,cuda_ipc"


def test_explicit_true_does_not_put_cuda_into_the_nanny():
    h = plan(HGX, **{"gpudask.transport.nvlink": True})
    assert tls(h.nanny) == "rc,tcp"
    assert "gpudask.transport.nvlink=True applies to processes with a GPU" in \
        why(h.nanny, "nvlink", "distributed-ucxx.nvlink=False")


# -- no GPU -----------------------------------------------------------------------------
def test_no_gpu_keeps_the_protocol_and_uses_no_cuda_transport(tmp_path):
    no_gpu_ucx = described(tmp_path, "no-gpu.json",
                           sections=sections_with("no-gpu.json", ucx_info={"transports": ["self", "tcp", "posix"]}),
                           packages={"distributed-ucxx": "0.52.0", "ucxx": "0.52.0"})
    h = plan(no_gpu_ucx, protocol="tcp")
    assert h.protocol == "tcp"
    assert all("UCX_TLS" not in p.env for p in all_plans(h))
    assert ("skipped", "no GPU visible") in [(r.decision, r.why) for r in h.workers[0].reasons
                                             if r.plugin == "nvlink"]
    h = plan(no_gpu_ucx, protocol="ucx")
    assert h.protocol == "ucx"
    for p in all_plans(h):
        assert tls(p) == "tcp"
        assert flags(p)["create-cuda-context"] is False and flags(p)["cuda-copy"] is False
    for p in (h.client, h.workers[0]):
        assert why(p, "nvlink", "skipped") == "no GPU visible"
        assert why(p, "infiniband", "skipped") == "no active InfiniBand port"


def test_no_gpu_with_infiniband_uses_rc_on_every_port():
    h = plan(CPU_IB, **{"gpudask.transport.nvlink": True})  # shared config of a GPU cluster
    for p in all_plans(h):
        assert tls(p) == "rc,tcp" and p.env["UCX_SOCKADDR_TLS_PRIORITY"] == "rdmacm"
        assert "UCX_NET_DEVICES" not in p.env and "UCX_MEMTYPE_REG_WHOLE_ALLOC_TYPES" not in p.env
    assert why(h.workers[0], "nvlink", "skipped") == "no GPU visible"


# -- explicit settings win --------------------------------------------------------------
def test_gpudask_option_turns_nvlink_off_and_says_so():
    h = plan(HGX, **{"gpudask.transport.nvlink": False})
    assert [tls(w) for w in h.workers] == ["rc,tcp,cuda_copy"] * 4
    text = why(h.workers[0], "nvlink", "no UCX transport cuda_ipc")
    assert text.startswith("gpudask.transport.nvlink=False (from dask config): explicit settings win")
    assert "(detection: GPU 0 has NVLink peers 1, 2, 3" in text
    assert flags(h.workers[0])["nvlink"] is False


@pytest.mark.parametrize("key", ["distributed.comm.ucx.infiniband", "distributed-ucxx.infiniband"])
def test_legacy_infiniband_key_is_honoured(key):
    h = plan(HGX, **{key: False})
    for w in h.workers:
        assert tls(w) == "tcp,cuda_copy,cuda_ipc" and "UCX_NET_DEVICES" not in w.env and w.interface is None
    assert f"(from legacy key {key}): explicit settings win" in why(h.workers[0], "infiniband", "no UCX transport rc")


def test_sockaddr_priority_in_the_environment_wins(monkeypatch):
    monkeypatch.setenv("UCX_SOCKADDR_TLS_PRIORITY", "tcp")
    h = plan(HGX)
    assert {p.env["UCX_SOCKADDR_TLS_PRIORITY"] for p in all_plans(h)} == {"tcp"}
    assert flags(h.workers[0])["rdmacm"] is False
    assert "set in the environment (explicit settings win)" in \
        why(h.workers[0], "infiniband", "UCX_SOCKADDR_TLS_PRIORITY=tcp")


def test_legacy_rdmacm_off_sets_tcp_connection_setup():
    h = plan(HGX, **{"distributed.comm.ucx.rdmacm": False})
    assert {p.env["UCX_SOCKADDR_TLS_PRIORITY"] for p in all_plans(h)} == {"tcp"}
    assert flags(h.workers[0])["rdmacm"] is False


def test_legacy_cuda_copy_and_nvlink_keys(monkeypatch):
    monkeypatch.setenv("DASK_DISTRIBUTED__COMM__UCX__CUDA_COPY", "False")
    monkeypatch.setenv("DASK_DISTRIBUTED__COMM__UCX__NVLINK", "False")
    h = plan(PCIE)
    assert [tls(w) for w in h.workers] == ["tcp"] * 2
    assert "legacy key distributed.comm.ucx.cuda-copy" in why(h.workers[0], "nvlink", "no UCX transport cuda_copy")


def test_ucx_tls_in_the_environment_wins(monkeypatch):
    monkeypatch.setenv("UCX_TLS", "tcp,cuda_copy")
    h = plan(HGX)
    for w in h.workers:
        assert tls(w) == "tcp,cuda_copy"
        assert flags(w) == {"tcp": True, "cuda-copy": True, "nvlink": False, "infiniband": False, "rdmacm": False,
                            "create-cuda-context": True}
    assert "UCX_TLS=tcp,cuda_copy set in the environment leaves out cuda_ipc (explicit settings win; detection: GPU 0" \
        in why(h.workers[0], "nvlink", "no UCX transport cuda_ipc")
    assert "set by you in the environment: explicit settings win" in why(h.workers[0], "gpudask", "UCX_TLS=tcp,cuda_copy")
    assert tls(h.nanny) == "tcp,cuda_copy"  # the environment is the user's: it wins in the nanny too, with a warning
    assert any("distributed-ucxx creates a CUDA context in the nanny process" in w for w in h.warnings)


def test_ucx_net_devices_in_the_environment_wins(monkeypatch):
    monkeypatch.setenv("UCX_NET_DEVICES", "mlx5_1:1")
    h = plan(HGX)
    assert {w.env["UCX_NET_DEVICES"] for w in h.workers} == {"mlx5_1:1"}
    assert "set in the environment (explicit settings win; detection chose mlx5_0:1)" in \
        why(h.workers[0], "gpudask", "UCX_NET_DEVICES=mlx5_1:1")


def test_net_devices_and_interface_options():
    h = plan(HGX, **{"gpudask.transport.net-devices": ["mlx5_1:1", "mlx5_0:1"],
                     "gpudask.transport.interface": "eth0"})
    assert [w.env["UCX_NET_DEVICES"] for w in h.workers] == ["mlx5_1:1", "mlx5_0:1"] * 2
    assert "UCX_NET_DEVICES" not in h.nanny.env  # a list is per worker
    assert [p.interface for p in all_plans(h)] == [*["eth0"] * 2, None, *["eth0"] * 4]
    h = plan(HGX, **{"gpudask.transport.net-devices": ["mlx5_1:1", "mlx5_0:1"]})
    assert [w.interface for w in h.workers] == ["ib1", "ib0"] * 2  # the interface of the port named
    h = plan(HGX, **{"distributed.comm.ucx.net-devices": "mlx5_1:1"})
    assert {p.env["UCX_NET_DEVICES"] for p in all_plans(h)} == {"mlx5_1:1"}
    assert {w.interface for w in h.workers} == {"ib1"}
    h = plan(HGX, **{"gpudask.transport.net-devices": "eth0"})
    assert [w.interface for w in h.workers] == [None] * 4
    assert why(h.workers[0], "infiniband", "interface not set") == \
        "gpudask.transport.net-devices='eth0' names no active InfiniBand port of this host"


def test_interface_not_on_the_host_is_a_warning():
    h = plan(HGX, **{"gpudask.transport.interface": "ib7"})
    assert any("ib7 is not an interface of hgx4" in w for w in h.warnings)


def test_explicit_mode_uses_only_what_the_user_turned_on():
    h = plan(HGX, **{"gpudask.transport.mode": "explicit"})
    assert all("UCX_TLS" not in p.env for p in all_plans(h))  # nothing turned on: UCX's own default
    h = plan(HGX, **{"gpudask.transport.mode": "explicit", "distributed.comm.ucx.nvlink": True})
    for w in h.workers:
        assert tls(w) == "tcp,cuda_copy,cuda_ipc"  # tcp and cuda_copy implied, as in distributed-ucxx
        assert "UCX_NET_DEVICES" not in w.env
    assert "implied by gpudask.transport.nvlink=True (from legacy key distributed.comm.ucx.nvlink)" in \
        why(h.workers[0], "nvlink", "UCX transport cuda_copy")
    assert tls(h.nanny) == "tcp"
    h = plan(HGX, **{"gpudask.transport.mode": "explicit", "gpudask.transport.infiniband": True})
    assert tls(h.workers[0]) == "rc,tcp" and h.workers[0].env["UCX_SOCKADDR_TLS_PRIORITY"] == "tcp"


def test_ucx_auto_lets_ucx_choose_with_the_context_first():
    h = plan(HGX, **{"gpudask.transport.mode": "ucx-auto"})
    for w in (*h.workers, h.client):
        assert tls(w) == "all" and flags(w)["create-cuda-context"] is True
        assert "UCX_NET_DEVICES" not in w.env
    assert tls(h.nanny) == "^cuda" and flags(h.nanny)["create-cuda-context"] is False
    assert tls(h.scheduler) == "all" and flags(h.scheduler)["create-cuda-context"] is True  # it relays GPU frames
    assert "gpudask.transport.mode=ucx-auto (from dask config)" in why(h.workers[0], "tcp", "UCX_TLS=all")
    s = plan(CPU_IB, **{"gpudask.transport.mode": "ucx-auto"}).scheduler
    assert tls(s) == "^cuda" and flags(s)["create-cuda-context"] is False


def test_connect_timeout_reaches_distributed_comm_timeouts():
    h = plan(HGX, **{"gpudask.transport.connect-timeout": "45s"})
    assert {p.config["distributed.comm.timeouts.connect"] for p in all_plans(h)} == {"45s"}
    assert "fixed 5 s" in why(h.workers[0], "tcp", "distributed.comm.timeouts.connect='45s'")
    # no legacy key: distributed.comm.ucx.connect-timeout exists in no schema
    assert "distributed.comm.timeouts.connect" not in plan(HGX, **{"distributed.comm.ucx.connect-timeout": 7}) \
        .workers[0].config
    h = plan(HGX)
    assert "distributed.comm.timeouts.connect" not in h.workers[0].config
    with pytest.raises(GpudaskError, match="gpudask.transport.connect-timeout = 'soon'.*accepted: a positive number"):
        plan(HGX, **{"gpudask.transport.connect-timeout": "soon"})


def test_bad_transport_option_is_one_clear_error():
    with pytest.raises(GpudaskError, match=r"gpudask.transport.mode = 'fast'.*auto \| explicit \| ucx-auto"):
        plan(HGX, **{"gpudask.transport.mode": "fast"})
    with pytest.raises(GpudaskError, match=r"gpudask.transport.nvlink = 'maybe'.*true, false or null"):
        plan(HGX, **{"gpudask.transport.nvlink": "maybe"})


# -- protocol ---------------------------------------------------------------------------
def test_tcp_protocol_plans_no_ucx_and_says_why():
    h = plan(HGX, protocol="tcp")
    for p in all_plans(h):
        assert not any(k.startswith("UCX_") for k in p.env)
        assert not any(k.startswith("distributed-ucxx.") and k in p.config for k in
                       (f"distributed-ucxx.{f}" for f in UCX_FLAGS))
    assert "--protocol ucx uses them" in why(h.workers[0], "infiniband", "no UCX")
    assert "--protocol ucx uses cuda_copy/cuda_ipc" in why(h.workers[0], "nvlink", "no UCX")


# the version the ucx extras pin (pyproject.toml), read from the installed metadata
@pytest.mark.parametrize("cuda, package", [(12080, r"pip install 'distributed-ucxx-cu12==0\.52\.\*'$"),
                                           (13000, r"pip install 'distributed-ucxx-cu13==0\.52\.\*'$"),
                                           (None, r"'distributed-ucxx-cu12==0\.52\.\*' or 'distributed-ucxx-cu13==0\.52\.\*'")])
def test_ucx_without_distributed_ucxx_is_one_clear_error(tmp_path, cuda, package):
    facts = described(tmp_path, "ucx-missing.json", cuda_driver_version=cuda)
    for protocol in ("ucx", "ucxx"):
        with pytest.raises(GpudaskError, match=rf"protocol '{protocol}' needs distributed-ucxx, which is not "
                                               rf"installed on no-ucx .*{package}"):
            plan(facts, protocol=protocol)
    assert plan(facts, protocol="tcp").protocol == "tcp"


@pytest.mark.process
def test_missing_distributed_ucxx_through_the_cli():
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--facts", NO_UCXX, "--protocol", "ucx"],
                         capture_output=True, text=True, timeout=120, env=base_env())
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "gpudask: error: gpudask plugin 'tcp' (from gpudask) failed in gpudask_validate: protocol 'ucx' needs "
        "distributed-ucxx, which is not installed on no-ucx (CUDA 12 driver): pip install 'distributed-ucxx-cu12==0.52.*'"]


# -- distributed-ucxx's own view agrees -------------------------------------------------
@pytest.mark.parametrize("facts", [HGX, DGX, PARTIAL, PCIE, ROCE, NUMA_ONLY, CPU_IB, SINGLE, SUBSET, MIG])
def test_distributed_ucxx_flags_give_the_same_transports_as_ucx_tls(facts, monkeypatch):
    """distributed-ucxx turns its flags into UCX options (the environment wins over them): both agree."""
    from distributed_ucxx.ucxx import _prepare_ucx_config

    h = plan(facts)
    for p in all_plans(h):
        with dask.config.set(p.config):
            options, _ = _prepare_ucx_config()
        assert sorted(options["TLS"].split(",")) == sorted(tls(p).split(",")), (p.role, p.index)
        expected = "rdmacm" if "rc" in p.ucx_transports else "tcp"
        assert options["SOCKADDR_TLS_PRIORITY"] == expected
        assert p.env.get("UCX_SOCKADDR_TLS_PRIORITY", "tcp").split(",")[0] == expected


def test_tls_enables_reads_ucx_syntax():
    assert tls_enables("tcp,cuda_copy", "cuda_copy") and not tls_enables("tcp,cuda_copy", "cuda_ipc")
    assert tls_enables("all", "rc") and tls_enables("cuda", "cuda_ipc") and tls_enables("rc_mlx5,tcp", "rc")
    assert not tls_enables("^cuda", "cuda_copy") and tls_enables("^cuda", "tcp")
    assert not tls_enables("^tcp,rc", "rc") and tls_enables("^tcp,rc", "cuda_ipc")


@pytest.mark.process
def test_info_json_shows_the_decisions_with_their_plugins():
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--json", "--facts", DGX, "--protocol", "ucx"],
                         capture_output=True, text=True, timeout=120, env=base_env())
    assert out.returncode == 0, out.stderr
    worker = json.loads(out.stdout)["workers"][5]
    assert worker["env"]["UCX_NET_DEVICES"] == "mlx5_2:1" and worker["interface"] == "ibp156s0"
    assert worker["config"]["distributed-ucxx.nvlink"] is True
    assert {"plugin": "infiniband", "decision": "UCX_NET_DEVICES=mlx5_2:1",
            "why": "mlx5_2 shares the PCIe switch 0000:98:00.0 with GPU 5"} in worker["reasons"]


def test_ucx_processes_quiet_ucxs_own_warning_and_a_user_setting_wins(monkeypatch):
    for name in [n for n in os.environ if n.startswith("UCX_")]:
        monkeypatch.delenv(name)
    h = plan(HGX)
    for p in all_plans(h):
        assert p.env["UCX_WARN_UNUSED_ENV_VARS"] == "n"
    assert "ucxx itself sets" in why(h.workers[0], "tcp", "UCX_WARN_UNUSED_ENV_VARS=n")
    assert "UCX_WARN_UNUSED_ENV_VARS" not in plan(HGX, protocol="tcp").workers[0].env
    monkeypatch.setenv("UCX_WARN_UNUSED_ENV_VARS", "y")
    assert plan(HGX).workers[0].env.get("UCX_WARN_UNUSED_ENV_VARS") in (None, "y")


def test_distributed_ucxx_environment_wins_over_what_gpudask_would_export(monkeypatch):
    for name in [n for n in os.environ if n.startswith("UCX_")]:
        monkeypatch.delenv(name)
    detected = plan(HGX).workers[0].env
    assert "UCX_NET_DEVICES" in detected and "UCX_MAX_RNDV_RAILS" in detected
    h = plan(HGX, **{"distributed-ucxx.environment": {"net-devices": "mlx5_1:1", "max-rndv-rails": 2}})
    w = h.workers[0]
    assert "UCX_NET_DEVICES" not in w.env and "UCX_MAX_RNDV_RAILS" not in w.env
    assert "distributed-ucxx.environment sets it to 'mlx5_1:1'" in why(w, "gpudask", "UCX_NET_DEVICES not exported")


def test_explicit_tcp_over_ucx_keeps_cuda_copy_for_gpu_processes_as_dask_cuda_does(monkeypatch):
    for name in [n for n in os.environ if n.startswith("UCX_")]:
        monkeypatch.delenv(name)
    h = plan(HGX, **{"gpudask.transport.mode": "explicit", "gpudask.transport.tcp": True})
    assert tls(h.workers[0]) == "tcp,cuda_copy"  # no cuda_ipc, no rc: only what was named, plus cuda_copy
    assert "implied by gpudask.transport.tcp=True" in why(h.workers[0], "nvlink", "UCX transport cuda_copy")
    assert tls(h.scheduler) == "tcp,cuda_copy"  # the scheduler relays GPU frames, as the client

"""Tests of gpudask.facts: facts files, visible GPUs, probing (real CPU host, fake NVML, fake sysfs)."""

from __future__ import annotations

import dataclasses
import glob
import importlib.metadata as md
import json
import os
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTS = os.path.join(ROOT, "tests", "hosts")


from gpudask import facts as F  # noqa: E402
from gpudask.facts import probe as P  # noqa: E402
from gpudask.plugins.ucx import ucx_info as U  # noqa: E402

FactsError = F.FactsError


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for var in ("GPUDASK_FACTS", "GPUDASK_PROBED_FACTS", "GPUDASK_SYSFS_ROOT", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    F.clear_cache()
    yield
    F.clear_cache()


def host(name: str) -> str:
    return os.path.join(HOSTS, name)


def write(tmp_path, data, name="host.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def raw(name: str) -> dict:
    with open(host(name)) as f:
        return json.load(f)


def with_sections(facts):
    """``facts`` with the built-in plugins' sections (validated by their plugins)."""
    from gpudask.facts.sections import with_sections as add
    from gpudask.plugin.manager import PluginManager

    return add(facts, PluginManager.from_environment().facts_sections())


def loaded(path: str):
    return with_sections(F.load_facts(path))


# ------------------------------------------------------------------- described hosts

HOST_FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(HOSTS, "*.json")))


def test_host_files_present():
    expected = {
        "single-gpu.json", "dgx-8gpu-nvswitch-4ib.json", "ib-down-and-roce.json", "partial-nvlink.json",
        "mig.json", "subset-visible.json", "uuid-visible.json", "ucx-missing.json",
        "h200-single.json", "hgx-4gpu-2ib.json", "no-gpu.json", "workstation-2gpu-pcie.json",
    }
    assert expected <= set(HOST_FILES)


@pytest.mark.parametrize("name", HOST_FILES)
def test_load_and_round_trip(name):
    """The shipped hosts are schema 2: read (each plugin validating its section) and written,
    they read back the same."""
    from gpudask.plugins.ucx.nvlink_facts import peers

    assert raw(name)["schema"] == 2
    facts = loaded(host(name))
    assert facts.origin == host(name) and facts.described and facts.schema == 2
    data = facts.to_dict()
    assert "origin" not in data
    assert data == raw(name)
    again = with_sections(F.facts_from_dict(json.loads(json.dumps(data)), host(name)))
    assert again == facts
    # every file's peers are symmetric and name other GPUs
    for g in facts.gpus:
        for p in peers(facts, g.index) or []:
            assert g.index in (peers(facts, p) or [])


def test_dgx():
    from gpudask.plugins.ucx.infiniband_facts import active_ports, ports
    from gpudask.plugins.ucx.nvlink_facts import peers

    f = loaded(host("dgx-8gpu-nvswitch-4ib.json"))
    assert len(f.gpus) == 8 and f.cuda_major == 12
    assert all(peers(f, g.index) == [p for p in range(8) if p != g.index] for g in f.gpus)
    assert [d.name for d in active_ports(f)] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert {g.numa_node for g in f.gpus} == {0, 1}
    # each port shares the PCIe switch (first four path components) with exactly two GPUs
    for d in ports(f):
        switch = d.pci_path.split("/")[:6]
        assert sum(g.pci_path.split("/")[:6] == switch for g in f.gpus) == 2
    assert "rc_mlx5" in U.transports(f) and U.supports(f, "rc") is True


def test_ib_down_and_roce():
    from gpudask.plugins.ucx.infiniband_facts import ports

    f = loaded(host("ib-down-and-roce.json"))
    by = {d.name: d for d in ports(f)}
    assert not by["mlx5_0"].is_infiniband and by["mlx5_0"].state == "DOWN"
    assert not by["mlx5_1"].is_infiniband and by["mlx5_1"].link_layer == "Ethernet"
    assert by["mlx5_2"].is_infiniband
    root_port = by["mlx5_2"].pci_path.split("/")[:5]
    assert [g.index for g in f.gpus if g.pci_path.split("/")[:5] == root_port] == [2, 3]


def test_partial_nvlink_and_mig_and_ucx_missing():
    from gpudask.plugins.ucx.nvlink_facts import peers

    f = loaded(host("partial-nvlink.json"))
    assert [peers(f, g.index) for g in f.gpus] == [[1], [0], [3], [2]]
    m = F.load_facts(host("mig.json")).gpus[0]
    assert m.mig["enabled"] and len(m.mig["instances"]) == 2
    assert all(i["uuid"].startswith("MIG-") for i in m.mig["instances"])
    u = loaded(host("ucx-missing.json"))
    assert u.section("ucx_info") == {"transports": None} and U.transports(u) is None and U.supports(u, "tcp") is None
    assert u.packages["distributed-ucxx"] is None
    n = F.load_facts(host("no-gpu.json"))
    assert n.gpus == [] and n.cuda_major is None and n.visible_gpus() == []
    assert F.load_facts(host("h200-single.json")).cuda_major == 13


# ------------------------------------------------------------------ malformed files


def test_wrong_type(tmp_path):
    data = raw("hgx-4gpu-2ib.json")
    data["gpus"][1]["memory_total"] = "abc"
    path = write(tmp_path, data)
    with pytest.raises(FactsError) as e:
        F.load_facts(path)
    assert str(e.value) == f"{path}: key 'gpus[1].memory_total' must be an integer >= 0 (bytes), got 'abc'"


def test_a_schema_1_file_is_refused_in_one_line_naming_the_key(tmp_path):
    """The pre-release format is not read: the schema's const says so."""
    data = raw("hgx-4gpu-2ib.json")
    data["schema"] = 1
    path = write(tmp_path, data)
    with pytest.raises(FactsError) as e:
        F.load_facts(path)
    assert str(e.value) == f"{path}: key 'schema' must be 2, got 1"


def test_missing_key_in_a_section(tmp_path):
    """A port without its link layer: the infiniband plugin's schema fragment says it."""
    data = raw("hgx-4gpu-2ib.json")
    del data["sections"]["infiniband"]["ports"][1]["link_layer"]
    path = write(tmp_path, data)
    with pytest.raises(FactsError) as e:
        loaded(path)
    assert str(e.value) == (f"{path}: key 'sections.infiniband.ports[1].link_layer' is missing (expected a string) "
                            "(facts section of plugin 'infiniband')")


@pytest.mark.parametrize(
    "change, key, expected",
    [
        (lambda d: d.update(cpu_count=True), "cpu_count", "an integer"),  # JSON true is not a number
        (lambda d: d.update(gpus={}), "gpus", "a list"),
        (lambda d: d["gpus"][0].update(compute_capability=[9]), "gpus[0].compute_capability", "[major, minor]"),
        (lambda d: d["gpus"][0]["cpu_affinity"].append("x"), "gpus[0].cpu_affinity[24]", "an integer"),
        (lambda d: d["gpus"][3].update(index=0), "gpus[3].index", "unique"),
        (lambda d: d["gpus"][0]["mig"].update(enabled="no"), "gpus[0].mig.enabled", "true or false"),
        (lambda d: d["gpus"][0]["mig"]["instances"].append({"uuid": "MIG-x"}), "gpus[0].mig.instances[0].memory_total", "missing"),
        (lambda d: d.update(net_interfaces={"eth0": "10.0.0.1"}), "net_interfaces.eth0", "a list"),
        (lambda d: d["packages"].update(cupy=14), "packages.cupy", "a string or null"),
        (lambda d: d.pop("hostname"), "hostname", "missing"),
        (lambda d: d.update(driver_version=570), "driver_version", "a version such as \"535.104.05\" (digits and dots) or null"),
        # issue 11: values that were silently accepted
        (lambda d: d["gpus"][1].update(memory_total=-5), "gpus[1].memory_total", "an integer >= 0 (bytes), got -5"),
        (lambda d: d["gpus"][0].update(cpu_affinity=[999]), "gpus[0].cpu_affinity[0]", "a CPU below cpu_count (48), got 999"),
        (lambda d: d.update(cpu_count=0), "cpu_count", "an integer >= 1, got 0"),
        (lambda d: d["gpus"][0].update(memory_total=1.5e9), "gpus[0].memory_total", "an integer"),
    ],
)
def test_bad_values(tmp_path, change, key, expected):
    data = raw("hgx-4gpu-2ib.json")
    change(data)
    path = write(tmp_path, data)
    with pytest.raises(FactsError) as e:
        F.load_facts(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: key {key!r} ") and expected in msg and "\n" not in msg


@pytest.mark.parametrize("change, key, expected", [
    (lambda d: d["sections"]["nvlink"]["peers"].update({"2": [0, 7]}),
     "sections.nvlink.peers.2[1]", "must be the index of another GPU (0, 1, 2, 3), got 7 (facts section of plugin 'nvlink')"),
    (lambda d: d["sections"]["nvlink"]["peers"].update({"1": [1]}),
     "sections.nvlink.peers.1[0]", "must be the index of another GPU (0, 1, 2, 3), got 1"),
    (lambda d: d["sections"].update(rmm={"memory_free": {"0": d["gpus"][0]["memory_total"] + 1}}),
     "sections.rmm.memory_free.0", "must be at most memory_total (85520809984)"),
    (lambda d: d["sections"]["ucx_info"].update(transports="tcp"), "sections.ucx_info.transports", "a list"),
])
def test_a_section_contradicting_the_core_facts_is_one_line(tmp_path, change, key, expected):
    """What a section's schema or check says, in one line naming the plugin."""
    data = raw("hgx-4gpu-2ib.json")
    change(data)
    path = write(tmp_path, data)
    with pytest.raises(FactsError) as e:
        loaded(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: key {key!r} ") and expected in msg and "\n" not in msg, msg


@pytest.mark.parametrize("name", HOST_FILES)
def test_every_host_file_is_valid_against_the_shipped_schema(name):
    """The shipped hosts are valid against the shipped schema (the core's keys; each section
    is its plugin's to check, test_load_and_round_trip)."""
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(F.schema())
    jsonschema.validate(raw(name), F.schema(), cls=jsonschema.Draft202012Validator)


def test_schema_is_shipped_next_to_the_loader():
    assert F.SCHEMA_PATH.name == "facts.schema.json" and F.SCHEMA_PATH.parent.name == "facts"
    assert F.schema()["properties"]["schema"]["const"] == F.SCHEMA_VERSION == 2
    assert [p.name for p in F.SCHEMA_PATH.parent.glob("*.json")] == ["facts.schema.json"]


def test_the_core_schema_names_no_plugin_fact():
    """Schema 2 holds the core's facts only; the plugins' are their sections' fragments."""
    text = F.SCHEMA_PATH.read_text().lower()
    assert not any(word in text for word in ("nvlink", "infiniband", "ib_device", "memory_free"))


def test_a_probe_is_not_held_to_cpu_count():
    # NVML reports the CPUs it knows; a probe is data, not a hand-written file
    data = raw("hgx-4gpu-2ib.json")
    data["gpus"][0]["cpu_affinity"] = [999]
    assert F.facts_from_dict(data, "probed").gpus[0].cpu_affinity == [999]


def test_unknown_keys_ignored_and_optional_cvd(tmp_path):
    data = raw("single-gpu.json")
    data["comment"] = "hand-written"
    data["gpus"][0]["temperature"] = 40
    del data["cuda_visible_devices"]
    facts = F.load_facts(write(tmp_path, data))
    assert facts.cuda_visible_devices is None
    assert "comment" not in facts.to_dict() and "temperature" not in facts.to_dict()["gpus"][0]


def test_bad_json(tmp_path):
    path = write(tmp_path, '{\n  "schema": 2,\n  "hostname": "x",,\n}')
    with pytest.raises(FactsError, match=r"invalid JSON at line 3 column 19") as e:
        F.load_facts(path)
    assert str(e.value).startswith(path + ":")


def test_not_an_object(tmp_path):
    path = write(tmp_path, "[1, 2]")
    with pytest.raises(FactsError, match=r"must hold a JSON object"):
        F.load_facts(path)


@pytest.mark.parametrize("version", [3, 0, "1", True])
def test_a_schema_this_gpudask_does_not_read(tmp_path, version):
    data = raw("no-gpu.json")
    data["schema"] = version
    path = write(tmp_path, data)
    with pytest.raises(FactsError) as e:
        F.load_facts(path)
    shown = repr(version) if isinstance(version, str) else json.dumps(version)
    assert str(e.value) == f"{path}: key 'schema' must be 2, got {shown}"


def test_missing_schema(tmp_path):
    data = raw("no-gpu.json")
    del data["schema"]
    with pytest.raises(FactsError, match=r"key 'schema' is missing \(expected the integer 2\)"):
        F.load_facts(write(tmp_path, data))


def test_nonexistent_file(tmp_path):
    path = str(tmp_path / "nope.json")
    with pytest.raises(FactsError, match=r"cannot read facts file") as e:
        F.load_facts(path)
    assert str(e.value).startswith(path + ":")


def test_bad_cuda_visible_devices_in_file(tmp_path):
    data = raw("hgx-4gpu-2ib.json")
    data["cuda_visible_devices"] = "0,7"
    path = write(tmp_path, data)
    with pytest.raises(FactsError) as e:
        F.load_facts(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: key 'cuda_visible_devices' entry '7' names no GPU")
    assert "0, 1, 2, 3" in msg


def test_facts_from_dict_names_origin():
    with pytest.raises(FactsError, match=r"^somewhere: key 'hostname' must be a string, got null$"):
        F.facts_from_dict({**raw("no-gpu.json"), "hostname": None}, "somewhere")


# ------------------------------------------------------------------ visible GPUs


def with_cvd(name, value):
    data = raw(name)
    data["cuda_visible_devices"] = value
    return F.facts_from_dict(data, host(name))


def idx(gpus):
    return [g.index for g in gpus]


def test_visible_integers_and_subsets():
    assert idx(with_cvd("hgx-4gpu-2ib.json", None).visible_gpus()) == [0, 1, 2, 3]
    assert idx(with_cvd("hgx-4gpu-2ib.json", "3,1").visible_gpus()) == [3, 1]
    assert idx(with_cvd("hgx-4gpu-2ib.json", " 2 , 0 ").visible_gpus()) == [2, 0]
    assert idx(with_cvd("hgx-4gpu-2ib.json", "").visible_gpus()) == []
    assert idx(with_cvd("hgx-4gpu-2ib.json", "1,-1,2").visible_gpus()) == [1]  # CUDA stops at -1
    assert idx(F.load_facts(host("subset-visible.json")).visible_gpus()) == [2, 3]


def test_visible_uuids():
    f = F.load_facts(host("uuid-visible.json"))
    assert idx(f.visible_gpus()) == [1, 0]
    uuid1 = f.gpus[1].uuid
    assert idx(with_cvd("uuid-visible.json", uuid1[:12]).visible_gpus()) == [1]  # prefix, as CUDA allows
    assert idx(with_cvd("uuid-visible.json", f"{uuid1.upper()},0").visible_gpus()) == [1, 0]
    with pytest.raises(FactsError, match=r"entry 'GPU-' is ambiguous"):
        with_cvd("uuid-visible.json", "GPU-")
    with pytest.raises(FactsError, match=r"entry 'GPU-ffff' names no GPU"):
        with_cvd("uuid-visible.json", "GPU-ffff")


def test_visible_mig():
    f = F.load_facts(host("mig.json"))
    a, b = (i["uuid"] for i in f.gpus[0].mig["instances"])
    assert idx(with_cvd("mig.json", a).visible_gpus()) == [0]
    assert idx(with_cvd("mig.json", f"{b},{a}").visible_gpus()) == [0]  # one parent, listed once
    old_style = f"MIG-{f.gpus[0].uuid}/1/0"
    assert idx(with_cvd("mig.json", old_style).visible_gpus()) == [0]
    with pytest.raises(FactsError, match=r"entry 'MIG-00000000' names no GPU"):
        with_cvd("mig.json", "MIG-00000000")


def test_visible_error_on_probed_facts_is_lazy():
    data = raw("workstation-2gpu-pcie.json")
    data["cuda_visible_devices"] = "5"
    f = F.facts_from_dict(data, "probed")  # the environment of a probed process is not a file error
    with pytest.raises(FactsError, match=r"^probed host: CUDA_VISIBLE_DEVICES entry '5' names no GPU"):
        f.visible_gpus()


def test_gpu_by_index():
    f = F.load_facts(host("hgx-4gpu-2ib.json"))
    assert f.gpu_by_index(2).pci_bus_id == "0000:43:00.0"
    with pytest.raises(FactsError, match=r"no GPU with index 9"):
        f.gpu_by_index(9)


# ------------------------------------------------------------------ probing this host


def test_probe_this_host():
    f = F.probe_facts()
    assert f.origin == "probed" and not f.described
    assert f.cpu_count == os.cpu_count()
    try:
        distributed = md.version("distributed")
    except md.PackageNotFoundError:
        distributed = None
    assert f.packages["distributed"] == distributed
    assert f.packages["python"] and "gpudask" in f.packages
    assert "127.0.0.1" in f.net_interfaces.get("lo", [])
    if not os.path.exists("/dev/nvidiactl"):  # the CPU CI machine
        assert f.gpus == [] and f.driver_version is None and f.cuda_driver_version is None
    try:
        md.version("libucx-cu13")
    except md.PackageNotFoundError:
        pass
    else:
        # the tcp plugin's section: what the real ucx_info of libucx lists (UCX over TCP here), probed
        # where the UCX packages the tcp plugin names are installed
        from gpudask.plugins.ucx import tcp

        assert U.transports(with_sections(f)) is None  # the core's packages alone name no UCX
        found = U.transports(with_sections(F.probe_facts(tcp.gpudask_facts_packages())))
        assert found and "tcp" in found and found == sorted(set(found))
    assert "ucx_transports" not in f.to_dict() and f.section("ucx_info") is None  # the core probes no UCX
    # what was probed is a valid schema-2 file
    assert F.facts_from_dict(json.loads(json.dumps(f.to_dict())), "probed") == f


def test_ucx_missing():
    # the core's packages name no UCX package: ucx_info is not run
    assert U.probe(F.probe_facts()) == {"transports": None} and U.probe_ucx_transports(False) is None


def test_ucx_info_parsing_and_failure(tmp_path, monkeypatch):
    script = tmp_path / "ucx_info"
    script.write_text(
        "#!/bin/sh\n"
        'echo "# Memory domain: posix"\n'
        'echo "#      Transport: posix"\n'
        'echo "#      Transport: tcp"\n'
        'echo "#      Transport: tcp"\n'
        'echo "#      Transport: rc_mlx5"\n'
        'echo "#      Transport: cuda_copy"\n'
    )
    script.chmod(0o755)
    monkeypatch.setattr(U, "_ucx_info_commands", lambda: [(str(script), {})])
    assert U.probe_ucx_transports(True) == ["cuda_copy", "posix", "rc_mlx5", "tcp"]
    monkeypatch.setattr(U, "_ucx_info_commands", lambda: [("/bin/false", {})])
    assert U.probe_ucx_transports(True) is None
    monkeypatch.setattr(U, "_ucx_info_commands", lambda: [(str(tmp_path / "missing"), {})])
    assert U.probe_ucx_transports(True) is None


# ------------------------------------------------------------------ fake sysfs + NVML


def _mkfile(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


def _pci_device(root, path, numa, cpulist="0-7"):
    """A PCI function under <root>/devices/..., linked from <root>/bus/pci/devices/<bus id>."""
    full = os.path.join(root, path.lstrip("/"))
    _mkfile(os.path.join(full, "numa_node"), str(numa))
    _mkfile(os.path.join(full, "local_cpulist"), cpulist)
    link = os.path.join(root, "bus", "pci", "devices", os.path.basename(full))
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(full, link)
    return full


def _ib_device(root, name, device_dir, ports, nets=()):
    """ports: {n: (state file text, link_layer)}; nets: [(netdev, dev_port)]."""
    dev = os.path.join(root, "class", "infiniband", name)
    os.makedirs(dev)
    if device_dir:
        os.symlink(device_dir, os.path.join(dev, "device"))
        for netdev, dev_port in nets:
            _mkfile(os.path.join(device_dir, "net", netdev, "dev_port"), str(dev_port))
    for n, (state, link_layer) in ports.items():
        _mkfile(os.path.join(dev, "ports", str(n), "state"), state)
        _mkfile(os.path.join(dev, "ports", str(n), "link_layer"), link_layer)


def test_infiniband_from_fake_sysfs(tmp_path, monkeypatch):
    root = str(tmp_path / "sys")
    sw = "/devices/pci0000:15/0000:15:01.0/0000:16:00.0"
    d0 = _pci_device(root, f"{sw}/0000:17:10.0/0000:1a:00.0", 0)
    d1 = _pci_device(root, f"{sw}/0000:17:11.0/0000:1b:00.0", -1)
    d2 = _pci_device(root, "/devices/pci0000:40/0000:40:01.0/0000:41:00.0", 1)
    _ib_device(root, "mlx5_0", d0, {1: ("4: ACTIVE", "InfiniBand")}, [("ibp26s0", 0)])
    _ib_device(root, "mlx5_1", d1, {1: ("1: DOWN", "InfiniBand")})
    _ib_device(root, "mlx5_2", d2, {1: ("4: ACTIVE", "Ethernet"), 2: ("4: ACTIVE", "Ethernet")},
               [("enp65s0f0np0", 0), ("enp65s0f1np1", 1)])
    _ib_device(root, "rxe0", None, {1: ("4: ACTIVE", "Ethernet")})  # soft RoCE: no PCI device
    monkeypatch.setenv("GPUDASK_SYSFS_ROOT", root)

    from gpudask.plugins.ucx import infiniband_facts as IB

    got = {(d.name, d.port): d for d in IB.probe_ports()}
    assert list(got) == [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1), ("mlx5_2", 2), ("rxe0", 1)]
    m0 = got["mlx5_0", 1]
    assert (m0.state, m0.link_layer, m0.netdev, m0.numa_node) == ("ACTIVE", "InfiniBand", "ibp26s0", 0)
    assert m0.pci_path == f"/sys{sw}/0000:17:10.0/0000:1a:00.0" and m0.is_infiniband
    m1 = got["mlx5_1", 1]
    assert m1.state == "DOWN" and m1.numa_node is None and m1.netdev is None and not m1.is_infiniband
    assert not got["mlx5_2", 1].is_infiniband
    assert (got["mlx5_2", 1].netdev, got["mlx5_2", 2].netdev) == ("enp65s0f0np0", "enp65s0f1np1")
    assert got["rxe0", 1].pci_path is None

    # the probed ports are the infiniband plugin's section of a probed host, valid as a whole
    f = with_sections(F.probe_facts())
    assert [d.name for d in IB.active_ports(f)] == ["mlx5_0"]
    assert f.section("infiniband") == {"ports": [dataclasses.asdict(d) for d in got.values()]}
    assert with_sections(F.facts_from_dict(json.loads(json.dumps(f.to_dict())), "probed")) == f


def test_no_infiniband_dir(tmp_path, monkeypatch):
    from gpudask.plugins.ucx import infiniband_facts as IB

    monkeypatch.setenv("GPUDASK_SYSFS_ROOT", str(tmp_path))
    assert IB.probe_ports() == []
    assert IB.probe(F.probe_facts()) == {"ports": []}


class _FakeNVML(types.ModuleType):
    """Enough of pynvml for _probe_nvml: 4 GPUs; 0-1 linked directly, 2-3 through an NVSwitch,
    GPU 3 in MIG mode with one instance; GPU 1 gives no CPU affinity (sysfs fallback)."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 4
    NVML_NVLINK_DEVICE_TYPE_GPU = 0
    NVML_NVLINK_DEVICE_TYPE_IBMNPU = 1
    NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    NVML_DEVICE_MIG_ENABLE = 1
    BUSES = ["00000000:18:00.0", "00000000:19:00.0", "00000000:9A:00.0", "00000000:9B:00.0"]

    class NVMLError(Exception):
        pass

    def __init__(self):
        super().__init__("pynvml")
        self.shutdown = False
        self.calls = []

    def _ns(self, **kw):
        return types.SimpleNamespace(**kw)

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetCount(self):
        return 4

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if isinstance(uuid, str) and uuid.startswith("GPU-00000000-0000-0000-0000-00000000000"):
            return ("gpu", int(uuid[-1]))
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetPciInfo(self, h):
        return self._ns(busId=self.BUSES[h[1]].encode())

    def nvmlDeviceGetMemoryInfo(self, h):
        if h[0] == "mig":
            return self._ns(total=20 * 2**30)
        return self._ns(total=80 * 2**30, free=(70 - h[1]) * 2**30)

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetCpuAffinity(self, h, size):
        if h[1] == 1:
            raise self.NVMLError("Not Supported")
        return [0b1111 << (4 * h[1])] + [0] * (size - 1)

    def nvmlDeviceGetNumaNodeId(self, h):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetUUID(self, h):
        if h[0] == "mig":
            return "MIG-aaaaaaaa-0000-0000-0000-000000000003"
        return f"GPU-00000000-0000-0000-0000-00000000000{h[1]}".encode()  # old bindings give bytes

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMigMode(self, h):
        return [1, 1] if h[1] == 3 else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 2

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        if j == 1:
            raise self.NVMLError("Not Found")
        return ("mig", h[1])

    def nvmlDeviceGetGpuInstanceId(self, h):
        return 1

    def nvmlDeviceGetComputeInstanceId(self, h):
        return 0

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= 2:
            raise self.NVMLError("Invalid Argument")
        return 1

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return 0 if h[1] < 2 else 2

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        if h[1] < 2:
            return self._ns(busId=self.BUSES[1 - h[1]])
        return self._ns(busId="00000000:C0:00.0")  # the switch


def test_probe_with_fake_nvml(tmp_path, monkeypatch):
    root = str(tmp_path / "sys")
    paths = [
        "/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
        "/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0",
        "/devices/pci0000:97/0000:97:01.0/0000:9a:00.0",
        # GPU 3 has no sysfs entry (a VM hiding PCI): its PCIe fields stay unknown
    ]
    for i, p in enumerate(paths):
        _pci_device(root, p, 0 if i < 2 else -1, cpulist="0-3,8-9")
    monkeypatch.setenv("GPUDASK_SYSFS_ROOT", root)
    fake = _FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)

    driver, cuda, gpus = P._probe_nvml()
    assert fake.shutdown
    assert (driver, cuda) == ("580.159.04", 13000)
    assert [g.pci_bus_id for g in gpus] == ["0000:18:00.0", "0000:19:00.0", "0000:9a:00.0", "0000:9b:00.0"]
    assert [g.pci_path for g in gpus] == ["/sys" + p for p in paths] + [None]
    assert [g.numa_node for g in gpus] == [0, 0, None, None]
    assert gpus[0].cpu_affinity == [0, 1, 2, 3]
    assert gpus[1].cpu_affinity == [0, 1, 2, 3, 8, 9]  # from sysfs local_cpulist
    assert gpus[3].cpu_affinity == [12, 13, 14, 15]
    assert gpus[0].uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert gpus[0].compute_capability == (9, 0) and gpus[0].memory_total == 80 * 2**30
    assert gpus[0].mig == {"enabled": False, "instances": []}
    assert gpus[3].mig == {
        "enabled": True,
        "instances": [{"uuid": "MIG-aaaaaaaa-0000-0000-0000-000000000003", "memory_total": 20 * 2**30,
                       "gpu_instance_id": 1, "compute_instance_id": 0}],
    }

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-aaaaaaaa,1")
    f = F.probe_facts()
    assert idx(f.visible_gpus()) == [3, 1]
    assert F.facts_from_dict(json.loads(json.dumps(f.to_dict())), "probed") == f

    # the plugins' probes, through the same NVML: NVLink peers (nvlink), free memory (rmm)
    from gpudask.plugins.rmm import shares as RF
    from gpudask.plugins.ucx import nvlink_facts as NF

    f = with_sections(f)
    assert f.section("nvlink") == {"peers": {"0": [1], "1": [0], "2": [3], "3": [2]}}
    assert [NF.peers(f, g.index) for g in f.gpus] == [[1], [0], [3], [2]]
    assert f.section("rmm") == {"memory_free": {str(i): (70 - i) * 2**30 for i in range(4)}}
    assert RF.of_gpu(f, 2)[0] == 68 * 2**30
    assert with_sections(F.facts_from_dict(json.loads(json.dumps(f.to_dict())), "probed")) == f


def test_the_plugins_probes_find_no_gpu_of_another_host(monkeypatch):
    """Facts handed in for GPUs this host's NVML does not have (by UUID): nothing is probed
    for them, so no other GPU's free memory or links are taken for theirs."""
    from gpudask.plugins.rmm import shares as RF
    from gpudask.plugins.ucx import nvlink_facts as NF

    monkeypatch.setitem(sys.modules, "pynvml", _FakeNVML())
    other = F.load_facts(host("dgx-8gpu-nvswitch-4ib.json"))
    assert not {g.uuid for g in other.gpus} & {f"GPU-00000000-0000-0000-0000-00000000000{i}" for i in range(4)}
    assert RF.probe(other) == {"memory_free": {}} and NF.probe(other) == {"peers": {}}


def test_the_plugins_probes_without_nvml(monkeypatch):
    from gpudask.plugins.rmm import shares as RF
    from gpudask.plugins.ucx import nvlink_facts as NF

    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    f = F.load_facts(host("hgx-4gpu-2ib.json"))
    assert RF.probe(f) == {"memory_free": {}} and NF.probe(f) == {"peers": {}}


def test_probe_nvml_init_fails(monkeypatch):
    fake = _FakeNVML()

    def boom():
        raise fake.NVMLError("Driver Not Loaded")

    fake.nvmlInit = boom
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert P._probe_nvml() == (None, None, [])


def test_bus_id_normalised():
    assert P.norm_bus_id(b"00000000:9A:00.0") == "0000:9a:00.0"
    assert P.norm_bus_id("00010000:01:00.0") == "10000:01:00.0"  # VMD domains are wider
    assert P.norm_bus_id("") is None and P.norm_bus_id("junk") is None


# ------------------------------------------------------------------ get_facts


def test_get_facts_env_and_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUDASK_FACTS", host("hgx-4gpu-2ib.json"))
    f = F.get_facts()
    assert f.origin == host("hgx-4gpu-2ib.json") and len(f.gpus) == 4
    assert F.get_facts() is f  # cached
    assert F.get_facts(host("mig.json")).origin == host("mig.json")  # the argument wins


def test_get_facts_cache_cleared(tmp_path, monkeypatch):
    path = write(tmp_path, raw("single-gpu.json"))
    monkeypatch.setenv("GPUDASK_FACTS", path)
    assert F.get_facts().hostname == "ws-4090"
    write(tmp_path, {**raw("single-gpu.json"), "hostname": "changed"})
    assert F.get_facts().hostname == "ws-4090"
    F.clear_cache()
    assert F.get_facts().hostname == "changed"


def test_get_facts_bad_env_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUDASK_FACTS", str(tmp_path / "missing.json"))
    with pytest.raises(FactsError, match="missing.json: cannot read"):
        F.get_facts()


def test_get_facts_probed_cache(monkeypatch):
    data = raw("hgx-4gpu-2ib.json")
    data["cuda_visible_devices"] = "0,1,2,3"  # the parent's value
    monkeypatch.setenv("GPUDASK_PROBED_FACTS", json.dumps(data))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,0,1")  # this worker's
    f = F.get_facts()
    assert f.origin == "probed" and not f.described
    assert f.cuda_visible_devices == "2,3,0,1" and idx(f.visible_gpus()) == [2, 3, 0, 1]
    monkeypatch.setenv("GPUDASK_PROBED_FACTS", "{not json")
    with pytest.raises(FactsError, match=r"^\$GPUDASK_PROBED_FACTS: invalid JSON at line 1 column 2"):
        F.get_facts()


def test_get_facts_probes_once(monkeypatch):
    calls = []
    real = F.probe_facts
    monkeypatch.setattr(F, "probe_facts", lambda packages=None: calls.append(1) or real(packages))
    a = F.get_facts()
    b = F.get_facts()
    assert a is b and a.origin == "probed" and calls == [1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert F.get_facts().cuda_visible_devices == "" and F.get_facts().visible_gpus() == [] and calls == [1]


def test_a_wrong_value_is_reported_before_missing_keys():
    with pytest.raises(FactsError) as e:
        F.facts_from_dict({"schema": 2, "gpus": "lots", "packages": [1]}, "facts of the worker")
    assert str(e.value) == "facts of the worker: key 'gpus' must be a list, got 'lots'"


def test_package_versions_come_from_the_dist_info_names_first_entry_winning(tmp_path, monkeypatch):
    """The planning process reads installed versions from the ``NAME-VERSION.dist-info`` names
    on sys.path, the first entry winning as for importlib.metadata; an absent package is None
    without asking importlib.metadata, unless an .egg-info or a zip makes the listing incomplete."""
    from gpudask.facts import probe

    first, second = tmp_path / "a", tmp_path / "b"
    (first / "Fancy_Pkg-1.2.dist-info").mkdir(parents=True)
    (second / "fancy.pkg-9.9.dist-info").mkdir(parents=True)
    (second / "other-3.0.dist-info").mkdir()
    monkeypatch.setattr("sys.path", [str(first), str(second), str(tmp_path / "missing")])
    assert probe._dist_info_versions() == ({"fancy-pkg": "1.2", "other": "3.0"}, True)
    got = probe._probe_packages({"fancy": ["fancy-pkg"], "other": ["nope", "other"], "absent": ["absent"]})
    assert (got["fancy"], got["other"], got["absent"]) == ("1.2", "3.0", None)
    (second / "legacy.egg-info").mkdir()
    assert probe._dist_info_versions()[1] is False  # importlib.metadata is asked for the rest

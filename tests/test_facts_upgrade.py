"""Facts files of schema 1 (the plugins' facts as core keys: ``gpus[].nvlink_peers``,
``ib_devices``, ``ucx_transports``, ``gpus[].memory_free``) and of schema 2 (the same facts in
the nvlink, infiniband, tcp (``ucx_info``) and rmm plugins' sections) give the same plan: each
moved fact, in both shapes."""

from __future__ import annotations

import json
import pathlib
import types

import pytest
from conftest import HOSTS, as_schema_2, plan_on

from gpudask.errors import ConfigError, FactsError


def _write(tmp_path: pathlib.Path, data: dict, name: str) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def _both(tmp_path: pathlib.Path, data: dict) -> tuple[str, str]:
    """The same host as a schema-1 and a schema-2 file."""
    return _write(tmp_path, data, "old.json"), _write(tmp_path, as_schema_2(data), "new.json")


def _plan(path: str, protocol: str, nworkers: int | None = None, **config) -> str:
    """The host plan as JSON, the file's path taken out (the two files have their own)."""
    doc = plan_on(path, protocol, nworkers, **config).to_dict()
    return json.dumps(doc, sort_keys=True).replace(path, "FILE")


@pytest.mark.parametrize("protocol", ["tcp", "ucx"])
@pytest.mark.parametrize("name", sorted(p.name for p in HOSTS.glob("*.json")))
def test_every_shipped_host_plans_the_same_in_either_shape(tmp_path, name, protocol):
    data = json.loads((HOSTS / name).read_text())
    old, new = _both(tmp_path, data)
    try:
        expected = _plan(old, protocol)
    except Exception as e:  # noqa: BLE001 - a host without what the protocol needs (ucx-missing)
        with pytest.raises(type(e)) as info:
            _plan(new, protocol)
        assert str(info.value).replace(new, "FILE") == str(e).replace(old, "FILE")
        return
    assert _plan(new, protocol) == expected


def test_nvlink_peers_in_either_shape(tmp_path):
    """partial-nvlink: GPUs 0-1 and 2-3 linked; with two workers on GPUs 0 and 2 each names
    its peer as hidden, in both shapes."""
    data = json.loads((HOSTS / "partial-nvlink.json").read_text())
    old, new = _both(tmp_path, data)
    for path in (old, new):
        h = plan_on(path, "ucx", 2, **{"gpudask.transport.nvlink": None})
        host = h.to_dict()
        assert host["facts"]["sections"]["nvlink"]["peers"] == {"0": [1], "1": [0], "2": [3], "3": [2]}
        assert "nvlink_peers" not in host["facts"]["gpus"][0]
    assert _plan(old, "ucx", 2) == _plan(new, "ucx", 2)
    whys = [r.why for r in plan_on(new, "ucx").workers[0].reasons if r.decision == "UCX transport cuda_ipc"
            or "cuda_ipc" in r.decision]
    assert any("NVLink peer 1" in w for w in whys), whys


def test_infiniband_ports_in_either_shape(tmp_path):
    data = json.loads((HOSTS / "hgx-4gpu-2ib.json").read_text())
    old, new = _both(tmp_path, data)
    assert _plan(old, "ucx") == _plan(new, "ucx")
    h = plan_on(new, "ucx")
    assert [w.env["UCX_NET_DEVICES"] for w in h.workers] == ["mlx5_0:1", "mlx5_0:1", "mlx5_1:1", "mlx5_1:1"]
    # and without any port (a RoCE and a DOWN port only) the same in both
    roce = json.loads((HOSTS / "ib-down-and-roce.json").read_text())
    roce["ib_devices"] = roce["ib_devices"][:2]
    old, new = _write(tmp_path, roce, "roce1.json"), _write(tmp_path, as_schema_2(roce), "roce2.json")
    assert _plan(old, "ucx") == _plan(new, "ucx")
    assert all("rc" not in w.ucx_transports for w in plan_on(new, "ucx").workers)


def test_ucx_transports_in_either_shape(tmp_path):
    """What the host's UCX offers is the tcp plugin's section ``ucx_info``: a UCX without
    cuda_ipc and rc leaves them out of every plan, in both shapes, and null (UCX missing)
    stays null."""
    data = json.loads((HOSTS / "hgx-4gpu-2ib.json").read_text())
    data["ucx_transports"] = ["cma", "cuda_copy", "posix", "self", "tcp"]
    old, new = _both(tmp_path, data)
    assert json.loads(pathlib.Path(new).read_text())["sections"]["ucx_info"] == {
        "transports": ["cma", "cuda_copy", "posix", "self", "tcp"]}
    assert _plan(old, "ucx") == _plan(new, "ucx")
    for path in (old, new):
        h = plan_on(path, "ucx")
        facts = h.to_dict()["facts"]
        assert "ucx_transports" not in facts and facts["sections"]["ucx_info"]["transports"] == data["ucx_transports"]
        assert all(w.ucx_transports == ["tcp", "cuda_copy"] for w in h.workers), [w.ucx_transports for w in h.workers]
    missing = json.loads((HOSTS / "ucx-missing.json").read_text())
    old, new = _write(tmp_path, missing, "m1.json"), _write(tmp_path, as_schema_2(missing), "m2.json")
    for path in (old, new):
        assert plan_on(path, "tcp").facts.section("ucx_info") == {"transports": None}
    assert _plan(old, "tcp") == _plan(new, "tcp")


@pytest.mark.parametrize("tls, accepted", [("my_tl,tcp", True), ("^rc_mlx5", True), ("garbage", False), ("", False)])
def test_the_users_ucx_tls_is_checked_against_the_hosts_ucx_in_either_shape(tmp_path, monkeypatch, tls, accepted):
    """The core refuses a UCX_TLS naming what neither UCX nor this host's UCX (the tcp
    plugin's section, through gpudask_ucx_offered) knows -- the same line in both shapes."""
    data = json.loads((HOSTS / "hgx-4gpu-2ib.json").read_text())
    data["ucx_transports"] = ["my_tl", "rc_mlx5", "self", "tcp"]
    old, new = _both(tmp_path, data)
    monkeypatch.setenv("UCX_TLS", tls)
    if accepted:
        assert _plan(old, "ucx") == _plan(new, "ucx")
        return
    lines = []
    for path in (old, new):
        with pytest.raises(ConfigError) as info:
            plan_on(path, "ucx")
        assert type(info.value) is ConfigError  # the core's one line, never a plugin's failure
        lines.append(str(info.value))
    assert lines[0] == lines[1] and "\n" not in lines[0]
    if tls:
        assert lines[0].startswith(f"UCX_TLS={tls!r} names unknown transport(s) {tls!r}; accepted: this host's UCX "
                                   "offers my_tl, rc_mlx5, self, tcp; UCX's names all, "), lines[0]
    else:
        assert lines[0].startswith("UCX_TLS is set but empty"), lines[0]


def test_without_the_section_a_ucx_tls_is_checked_against_ucxs_names_only(tmp_path, monkeypatch):
    data = as_schema_2(json.loads((HOSTS / "hgx-4gpu-2ib.json").read_text()))
    del data["sections"]["ucx_info"]
    path = _write(tmp_path, data, "bare.json")
    monkeypatch.setenv("UCX_TLS", "my_tl")
    with pytest.raises(ConfigError, match=r"^UCX_TLS='my_tl' names unknown transport\(s\) 'my_tl'; accepted: UCX's "
                                          r"names all, "):
        plan_on(path, "ucx")
    monkeypatch.delenv("UCX_TLS")
    h = plan_on(path, "ucx")
    assert h.facts.section("ucx_info") is None
    # unknown is not "missing": no transport is left out for it
    assert plan_on(path, "ucx").workers[0].ucx_transports == plan_on(str(HOSTS / "hgx-4gpu-2ib.json"),
                                                                      "ucx").workers[0].ucx_transports


def test_another_plugin_may_say_what_the_hosts_ucx_offers(tmp_path, monkeypatch):
    """gpudask_ucx_offered: every plugin's names count together; a wrong answer is one line
    naming the plugin."""
    from gpudask import hookimpl
    from gpudask.errors import PluginError
    from gpudask.testing import plan_for

    def plugin(answer):
        return types.SimpleNamespace(name="my-ucx", priority=300,
                                     gpudask_ucx_offered=hookimpl(lambda facts: answer))

    path = str(HOSTS / "hgx-4gpu-2ib.json")
    monkeypatch.setenv("UCX_TLS", "tcp,my_tl")
    with pytest.raises(ConfigError, match="names unknown transport"):
        plan_for(path, "ucx", plugins=[plugin(None)])
    assert plan_for(path, "ucx", plugins=[plugin(["my_tl"])]).workers[0].env["UCX_TLS"] == "tcp,my_tl"
    monkeypatch.setenv("UCX_TLS", "garbage")
    with pytest.raises(ConfigError) as info:
        plan_for(path, "ucx", plugins=[plugin(["my_tl"])])
    assert "this host's UCX offers cma, cuda_copy, cuda_ipc, my_tl, " in str(info.value)  # the tcp plugin's too
    with pytest.raises(PluginError, match=r"^gpudask plugin 'my-ucx' failed in gpudask_ucx_offered: returned 'tcp'; "
                                          r"expected a list of transport names \(strings\) or None$"):
        plan_for(path, "ucx", plugins=[plugin("tcp")])


@pytest.mark.parametrize("fraction", [0.49, 0.99])
def test_memory_free_in_either_shape(tmp_path, fraction):
    """The rmm plugin's free memory, in both shapes: the default pool is planned from the GPU's
    total either way, and a GPU short of it says so in the reasons."""
    data = json.loads((HOSTS / "h200-single.json").read_text())
    for g in data["gpus"]:
        g["memory_free"] = int(g["memory_total"] * fraction)
    old, new = _both(tmp_path, data)
    assert json.loads(pathlib.Path(new).read_text())["sections"]["rmm"] == {
        "memory_free": {"0": int(data["gpus"][0]["memory_total"] * fraction)}}
    assert _plan(old, "ucx", 1) == _plan(new, "ucx", 1)
    h = plan_on(new, "ucx", 1)
    section = h.workers[0].sections["rmm"]
    assert section["fit_to_free"] is True
    assert section["initial_pool_size"] == data["gpus"][0]["memory_total"] // 2 // 256 * 256
    short = [r.why for r in h.workers[0].reasons if r.plugin == "rmm" and "free now, less than this pool" in r.why]
    assert bool(short) == (fraction < 0.5)


def test_a_schema_2_host_without_the_sections_plans_without_those_facts(tmp_path):
    """No nvlink, infiniband or rmm section: no peers known, no port, free memory unknown --
    the plan says so instead of failing."""
    data = as_schema_2(json.loads((HOSTS / "hgx-4gpu-2ib.json").read_text()))
    del data["sections"]
    path = _write(tmp_path, data, "bare.json")
    h = plan_on(path, "ucx", 1)
    assert h.facts.section("nvlink") is None and h.facts.section("infiniband") is None
    assert "rc" not in h.workers[0].ucx_transports
    whys = [r.why for r in h.workers[0].reasons if r.plugin == "nvlink"]
    assert any("NVLink peers are not described" in w and "bare.json" in w for w in whys), whys


def test_a_plan_written_from_an_old_file_is_schema_2_and_reads_back(tmp_path):
    """What ``gpudask info --json`` writes (the facts to save as a file) is schema 2 with the
    sections, and plans the same as the schema-1 file it came from."""
    old = str(HOSTS / "dgx-8gpu-nvswitch-4ib.json")
    facts = plan_on(old, "ucx").to_dict()["facts"]
    assert facts["schema"] == 2 and set(facts["sections"]) >= {"nvlink", "infiniband"}
    assert "ib_devices" not in facts and all("nvlink_peers" not in g for g in facts["gpus"])
    saved = _write(tmp_path, facts, "saved.json")
    assert facts == as_schema_2(json.loads(pathlib.Path(old).read_text()))
    assert _plan(saved, "ucx") == _plan(old, "ucx").replace(old, "FILE")


@pytest.mark.parametrize("shape, edit, message", [
    ("v1", lambda d: d["ib_devices"][0].update(port="1"), "key 'ib_devices[0].port' must be an integer, got '1'"),
    ("v2", lambda d: d["sections"]["infiniband"]["ports"][0].update(port="1"),
     "key 'sections.infiniband.ports[0].port' must be an integer, got '1' (facts section of plugin 'infiniband')"),
    ("v1", lambda d: d.update(ucx_transports="tcp"), "key 'ucx_transports' must be a list or null, got 'tcp'"),
    ("v2", lambda d: d["sections"]["ucx_info"].update(transports="tcp"),
     "key 'sections.ucx_info.transports' must be a list or null, got 'tcp' (facts section of plugin 'tcp')"),
    ("v2", lambda d: d["sections"].update(ucx_info={}),
     "key 'sections.ucx_info.transports' is missing (expected a list or null) (facts section of plugin 'tcp')"),
    ("v2", lambda d: d["sections"]["nvlink"]["peers"].update({"x": []}),
     "key 'sections.nvlink.peers' must be a GPU index (\"0\", \"1\", ...), got 'x' (facts section of plugin 'nvlink')"),
    ("v2", lambda d: d["sections"].update(rmm={"memory_free": {"9": 1}}),
     "key 'sections.rmm.memory_free.9' must be keyed by the index of a GPU of the host (0, 1, 2, 3), got '9' "
     "(facts section of plugin 'rmm')"),
])
def test_errors_in_either_shape_are_one_line_naming_file_key_and_accepted(tmp_path, shape, edit, message):
    data = json.loads((HOSTS / "hgx-4gpu-2ib.json").read_text())
    data = data if shape == "v1" else as_schema_2(data)
    edit(data)
    path = _write(tmp_path, data, "bad.json")
    with pytest.raises(FactsError) as info:
        plan_on(path, "ucx")
    assert str(info.value) == f"{path}: {message}"

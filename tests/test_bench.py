"""`gpudask bench`: a CPU smoke run on real processes (no speed asserted), and the pieces
that decide what each configuration runs.  The raw-ucxx column runs real ucxx over TCP here."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import BENCH_MISSING

pytest.importorskip("gpudask_bench", reason=BENCH_MISSING)

from gpudask_bench import configs, measures, report, workers  # noqa: E402
from gpudask_bench.report import size_label  # noqa: E402


# one test process runs this module (pytest-xdist): the smoke run below is made once
pytestmark = pytest.mark.xdist_group("bench-smoke")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One quick run of tcp, gpudask and raw-ucxx, everything it creates under a private TMPDIR."""
    tmp = tmp_path_factory.mktemp("bench")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDASK_")}
    env["TMPDIR"] = str(tmp)
    cmd = [sys.executable, "-m", "gpudask.cli", "bench", "--configs", "tcp,gpudask,raw-ucxx", "--repeat", "1", "--quick",
           "--json", "--profile", "--log-dir", str(tmp / "logs")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=170, cwd=tmp)
    return tmp, proc


@pytest.mark.process
def test_smoke_run_produces_figures(smoke):
    tmp, proc = smoke
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # nothing but JSON on stdout (UCX logs go to stderr)
    assert {"date", "machine", "settings", "configs"} <= set(report)
    assert report["machine"]["cpu_count"] >= 1
    assert [c["name"] for c in report["configs"]] == ["tcp", "gpudask", "raw-ucxx"]
    sizes = report["settings"]["transfer_bytes"]
    assert len(sizes) == 3
    for c in report["configs"][:2]:
        assert c["status"] == "ok", c.get("notes")
        figs = c["figures"]
        expected = {"ready_s", "transpose_sum_s"} | {f"transfer_{size_label(n)}_{u}" for n in sizes
                                                     for u in ("s", "GBps")}
        assert expected <= set(figs), set(figs)
        for key in expected:
            fig = figs[key]
            assert fig["runs"] and all(v > 0 for v in fig["runs"]), (c["name"], key, fig)
            assert fig["best"] > 0 and fig["median"] > 0
            assert fig["ratio_median"] is not None and fig["ratio_median"] > 0
        assert len(c["transports"]) == 2  # both workers answered
    tcp, gd, _ = report["configs"]
    assert tcp["figures"]["ready_s"]["ratio_median"] == pytest.approx(1.0)
    # stock workers never import gpudask (the bench ships its functions by value)
    assert not any(w["gpudask_loaded"] for w in tcp["transports"].values())
    assert all(w["gpudask_loaded"] for w in gd["transports"].values())
    # --profile reads each process's stages from the real logs, gpudask's startup line included
    stages = gd["profile"]["median_s_after_launch"]
    # (on a CPU host only the workers' plan decides anything: the other processes log their
    # startup line at DEBUG, which `dask worker` does not show)
    assert stages["worker.gpudask"] < stages["worker.listen"], stages
    assert "worker.gpudask" not in tcp["profile"]["median_s_after_launch"]  # stock workers
    # the spill launch needs CuPy on a GPU: on this host it is left out, and the report says so
    assert report["settings"]["spill_limit"] == 4 * 10**9
    assert "spill_s" not in gd["figures"] and "no spill figure: it needs CuPy arrays on a GPU" in gd["notes"]
    assert not any("spill" in n for n in tcp["notes"])  # stock workers have no device limit to spill at


@pytest.mark.process
def test_raw_ucxx_column_measures_the_same_transfers(smoke):
    """Two plain ucxx processes, placed like the gpudask workers of the run, time the same
    sizes; the cluster-only figures stay empty, with a note."""
    tmp, proc = smoke
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    raw = report["configs"][2]
    assert raw["name"] == "raw-ucxx" and raw["status"] == "ok", raw.get("notes")
    sizes = report["settings"]["transfer_bytes"]
    expected = {f"{what}_{size_label(n)}_{u}" for what in ("transfer", "pull") for n in sizes for u in ("s", "GBps")}
    assert set(raw["figures"]) == expected
    for key in expected:
        fig = raw["figures"][key]
        assert len(fig["runs"]) == 1 and fig["runs"][0] > 0 and fig["median"] > 0, (key, fig)
    for n in sizes:  # the bandwidth is the bytes over that same time
        t, bw = raw["figures"][f"transfer_{size_label(n)}_s"], raw["figures"][f"transfer_{size_label(n)}_GBps"]
        assert bw["runs"][0] == pytest.approx(n / t["runs"][0] / 1e9)
    assert any("not measured" in n and "ready" in n for n in raw["notes"])
    # same UCX_TLS as the gpudask workers (UCX over TCP on this host), read from gpudask's plan
    assert any("match the gpudask workers of this run" in n for n in raw["notes"]), raw["notes"]
    assert [p["plan_env"]["UCX_TLS"] for p in raw["placement"]] == ["tcp", "tcp"]
    peers = raw["transports"]
    assert [p["ucx_tls"] for p in peers.values()] == ["tcp", "tcp"]
    assert len({p["pid"] for p in peers.values()}) == 2  # two processes
    assert (tmp / "logs" / "raw-ucxx" / "peer-b.log").exists()
    # gpudask's bandwidth as a share of the raw column's, for the 75 % goal
    gd = report["configs"][1]
    assert "share_of_raw_median" not in report["configs"][0]["figures"]["transfer_1MB_GBps"]  # tcp
    share = gd["figures"][f"transfer_{size_label(sizes[-1])}_GBps"]["share_of_raw_median"]
    assert share == pytest.approx(gd["figures"][f"transfer_{size_label(sizes[-1])}_GBps"]["median"]
                                  / raw["figures"][f"transfer_{size_label(sizes[-1])}_GBps"]["median"])
    # the in-worker pull: measured in both cluster columns, its share of raw on the ucx one
    for n in sizes:
        pull = gd["figures"][f"pull_{size_label(n)}_s"]
        assert len(pull["runs"]) >= 5 and pull["median"] > 0, pull
        assert report["configs"][0]["figures"][f"pull_{size_label(n)}_s"]["median"] > 0  # tcp
    pulled = gd["figures"][f"pull_{size_label(sizes[-1])}_GBps"]
    assert pulled["share_of_raw_median"] == pytest.approx(
        pulled["median"] / raw["figures"][f"pull_{size_label(sizes[-1])}_GBps"]["median"])


@pytest.mark.process
def test_raw_ucxx_is_skipped_with_a_note_without_ucxx(tmp_path):
    """ucxx made unimportable in the bench process (as if distributed-ucxx were not installed)."""
    code = ("import sys, runpy; sys.modules['ucxx'] = None\n"
            "sys.argv = ['gpudask', 'bench', '--configs', 'raw-ucxx', '--quick', '--json']\n"
            "runpy.run_module('gpudask.cli', run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDASK_")}
    env["TMPDIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (raw,) = json.loads(out.stdout)["configs"]
    assert raw["status"] == "skipped" and raw["figures"] == {}
    assert raw["notes"] == ["ucxx (distributed-ucxx) is not installed"]


@pytest.mark.process
def test_smoke_run_leaves_no_process(smoke):
    import psutil

    tmp, _ = smoke
    strays = []
    for p in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            if str(tmp) in " ".join(p.info["cmdline"] or []) or (p.info["environ"] or {}).get("TMPDIR") == str(tmp):
                strays.append((p.pid, p.info["cmdline"]))
        except psutil.Error:
            continue
    assert not strays


@pytest.mark.process
def test_show_renders_the_table(smoke, tmp_path):
    _, proc = smoke
    path = tmp_path / "bench.json"
    path.write_text(proc.stdout)
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "bench", "--show", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for word in ("ready", "transfer 1MB (bandwidth)", "tcp", "gpudask", "raw-ucxx", "UCX transports",
                 "as a share of raw-ucxx's"):
        assert word in out.stdout


@pytest.mark.process
def test_bad_config_is_a_clean_error():
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "bench", "--configs", "tcp,nope"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "nope" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.process
def test_worker_functions_travel_by_value(tmp_path):
    """What the bench sends to workers unpickles where gpudask cannot be imported."""
    from distributed.protocol.pickle import dumps

    (tmp_path / "f.pkl").write_bytes(dumps(workers.detached(workers.consume)))
    code = ("import sys; sys.modules['gpudask'] = None\n"
            "import numpy\nfrom distributed.protocol.pickle import loads\n"
            f"f = loads(open({str(tmp_path / 'f.pkl')!r}, 'rb').read())\n"
            "print(f(numpy.ones(4)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "4.0"


def _host(ngpus: int) -> configs.Host:
    gpus = [{"index": i, "name": "GPU", "uuid": f"GPU-{i}", "memory_total_MiB": 1} for i in range(ngpus)]
    return configs.Host(gpus, "580", [str(i) for i in range(ngpus)], "cupy" if ngpus else "numpy", True, True)


def _opts(n: int) -> configs.Options:
    return configs.Options(nworkers=n, nthreads=1, repeat=1, quick=True, pool_size="1GB", death_timeout=60,
                         launch_timeout=60, profile=False, proto_info=False, sizes=configs.SMALL_SIZES)


def _cvd(spec: configs.Spec) -> list[str | None]:
    return [env.get("CUDA_VISIBLE_DEVICES") for _, env in spec.workers]


def test_two_workers_on_one_gpu():
    host = _host(1)
    for name in ("tcp", "ucx-stock", "gpudask"):
        spec = configs.build_spec(name, host, _opts(2), "s.json", "d")
        assert len(spec.workers) == 1 and "--nworkers" in spec.workers[0][0]
        argv = spec.workers[0][0]
        assert argv[argv.index("--nworkers") + 1] == "2"
    cuda = configs.build_spec("dask-cuda", host, _opts(2), "s.json", "d")
    assert _cvd(cuda) == ["0", "0"]  # dask cuda worker: one CLI per worker when they share a GPU
    assert all(argv[3:5] == ["cuda", "worker"] for argv, _ in cuda.workers)


def test_one_worker_per_gpu():
    host = _host(4)
    for name in ("tcp", "ucx-stock"):
        spec = configs.build_spec(name, host, _opts(4), "s.json", "d")
        assert _cvd(spec) == ["0,1,2,3", "1,2,3,0", "2,3,0,1", "3,0,1,2"]
    gd = configs.build_spec("gpudask", host, _opts(4), "s.json", "d")
    assert len(gd.workers) == 1 and gd.workers[0][1] == {}  # nothing but --preload gpudask
    assert "--preload" in gd.scheduler_argv and gd.protocol == "ucx"
    cuda = configs.build_spec("dask-cuda", host, _opts(4), "s.json", "d")
    assert _cvd(cuda) == ["0,1,2,3"] and "--rmm-pool-size" in cuda.workers[0][0]


def test_hand_set_ucx_config():
    spec = configs.build_spec("ucx-stock", _host(1), _opts(2), "s.json", "d")
    env = spec.workers[0][1]
    assert env["DASK_DISTRIBUTED_UCXX__NVLINK"] == "True" and env["DASK_DISTRIBUTED_UCXX__CUDA_COPY"] == "True"
    assert env["DASK_DISTRIBUTED_UCXX__TCP"] == "True" and env["DASK_DISTRIBUTED_UCXX__RMM__POOL_SIZE"] == "1GB"
    cpu = configs.build_spec("ucx-stock", _host(0), _opts(2), "s.json", "d")
    assert "DASK_DISTRIBUTED_UCXX__RMM__POOL_SIZE" not in cpu.workers[0][1]
    assert configs.build_spec("dask-cuda", _host(0), _opts(2), "s.json", "d") == "no GPU visible"


def test_the_spill_launch_gives_both_sides_the_same_device_limit():
    opts = _opts(2)
    opts.spill_limit = 2 * 10**9
    gd = configs.build_spec("gpudask", _host(2), opts, "s.json", "d", spill=True)
    assert [env for _, env in gd.workers] == [{"DASK_GPUDASK__SPILL__DEVICE_MEMORY_LIMIT": "2000000000"}]
    cuda = configs.build_spec("dask-cuda", _host(2), opts, "s.json", "d", spill=True)
    argv = cuda.workers[0][0]
    assert argv[argv.index("--device-memory-limit") + 1] == "2000000000"
    # the other launches keep each side's own default limit
    assert "--device-memory-limit" not in configs.build_spec("dask-cuda", _host(2), opts, "s.json", "d").workers[0][0]
    assert configs.build_spec("gpudask", _host(2), opts, "s.json", "d").workers[0][1] == {}
    with pytest.raises(ValueError, match="tcp has no device memory limit"):
        configs.build_spec("tcp", _host(2), opts, "s.json", "d", spill=True)


@pytest.mark.process
@pytest.mark.parametrize("value", ["lots", "-1GB", ""])
def test_a_bad_spill_limit_is_one_line(value):
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "bench", "--spill-limit", value],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"Error: Invalid value for --spill-limit: {value!r}: accepted: a number of bytes or a size such as 4GB" \
        in out.stderr


HOSTS = pathlib.Path(__file__).parent / "hosts"


def _raw_placement(facts: str, ngpus: int, nworkers: int) -> list[dict]:
    """raw-ucxx's peers on a described host: gpudask's real plan, no process started."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUDASK_", "UCX_", "CUDA_VISIBLE"))}
    opts = _opts(nworkers)
    opts.user_env = {**env, "GPUDASK_FACTS": str(HOSTS / facts)}
    from gpudask_bench import raw_ucxx

    peers, _ = raw_ucxx.placement(_host(ngpus), opts)
    return peers


def test_raw_ucxx_peers_share_the_gpu_like_the_workers():
    a, b = _raw_placement("h200-single.json", 1, 2)
    for peer in (a, b):
        assert peer["env"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert set(peer["env"]["UCX_TLS"].split(",")) == {"tcp", "cuda_copy", "cuda_ipc"}
        assert peer["plan_env"]["UCX_TLS"] == peer["env"]["UCX_TLS"]
        # what distributed-ucxx itself would pass to ucxx.init in a gpudask worker
        assert peer["env"]["UCX_SOCKADDR_TLS_PRIORITY"] == "tcp"
        assert peer["cpus"] is None  # a described host: nothing bound


def test_raw_ucxx_peers_get_one_gpu_each_like_the_workers():
    a, b = _raw_placement("hgx-4gpu-2ib.json", 4, 4)
    assert a["env"]["CUDA_VISIBLE_DEVICES"].split(",")[0] == "0"
    assert b["env"]["CUDA_VISIBLE_DEVICES"].split(",")[0] == "1"
    assert "cuda_ipc" in a["env"]["UCX_TLS"].split(",") and a["env"]["UCX_TLS"] == b["env"]["UCX_TLS"]
    assert not any(k.startswith("GPUDASK_") for k in a["plan_env"])  # bookkeeping, not placement


def test_raw_ucxx_placement_is_compared_with_the_live_gpudask_workers():
    from gpudask_bench.raw_ucxx import compare_with_gpudask

    peers = [{"env": {"UCX_TLS": "tcp,cuda_copy,cuda_ipc", "CUDA_VISIBLE_DEVICES": "0"}}] * 2
    live = {"transports": {"ucx://a:1": {"env": {"UCX_TLS": "tcp,cuda_copy,cuda_ipc", "CUDA_VISIBLE_DEVICES": "0"}},
                           "ucx://a:2": {"env": {"UCX_TLS": "tcp,cuda_copy,cuda_ipc", "CUDA_VISIBLE_DEVICES": "0"}}}}
    assert "match" in compare_with_gpudask(peers, live)
    live["transports"]["ucx://a:2"]["env"]["UCX_TLS"] = "tcp"
    assert "UCX_TLS: gpudask workers tcp, tcp,cuda_copy,cuda_ipc, raw peers tcp,cuda_copy,cuda_ipc" \
        in compare_with_gpudask(peers, live)
    assert compare_with_gpudask(peers, None) is None  # gpudask did not run before the raw column


def test_bandwidth_as_a_share_of_the_raw_column():
    gd = {"name": "gpudask", "protocol": "ucx", "figures": {"transfer_1GB_GBps": report.figure("transfer 1GB (bandwidth)", "GB/s",
                                                                            report.HIGHER),
                                         "ready_s": report.figure("ready", "s", report.LOWER)}}
    raw = {"name": "raw-ucxx", "figures": {"transfer_1GB_GBps": report.figure("transfer 1GB (bandwidth)", "GB/s",
                                                                              report.HIGHER)}}
    gd["figures"]["transfer_1GB_GBps"]["runs"] = [300.0, 320.0, 310.0]
    gd["figures"]["ready_s"]["runs"] = [8.0]
    raw["figures"]["transfer_1GB_GBps"]["runs"] = [400.0, 420.0]
    for r in (gd, raw):
        for f in r["figures"].values():
            report.finish(f)
    tcp = {"name": "tcp", "protocol": "tcp", "figures": {"transfer_1GB_GBps": dict(gd["figures"]["transfer_1GB_GBps"])}}
    report.add_raw_shares([tcp, gd, raw])
    assert "share_of_raw_median" not in tcp["figures"]["transfer_1GB_GBps"]  # another library: no ceiling
    assert gd["figures"]["transfer_1GB_GBps"]["share_of_raw_median"] == pytest.approx(310.0 / 410.0)
    assert "share_of_raw_median" not in gd["figures"]["ready_s"]
    text = report.render_table({"configs": [gd, raw], "date": "d", "notes": [],
                                "machine": {"hostname": "h", "cpu_count": 1, "gpus": []},
                                "settings": {"nworkers": 2, "nthreads": 1, "backend": "cupy", "repeat": 3,
                                             "quick": False}})
    assert "gpudask: bandwidth median as a share of raw-ucxx's: 1GB 76%" in text


def test_ratios_and_stats():
    a = {"name": "a", "figures": {"ready_s": report.figure("ready", "s", report.LOWER)}}
    b = {"name": "b", "figures": {"ready_s": report.figure("ready", "s", report.LOWER),
                                  "x_GBps": report.figure("x", "GB/s", report.HIGHER)}}
    a["figures"]["ready_s"]["runs"] = [4.0, 2.0, 3.0]
    b["figures"]["ready_s"]["runs"] = [1.0, 3.0]
    b["figures"]["x_GBps"]["runs"] = [1.0, 5.0, 2.0]
    for r in (a, b):
        for f in r["figures"].values():
            report.finish(f)
    report.add_ratios([a, b])
    assert a["figures"]["ready_s"]["best"] == 2.0 and a["figures"]["ready_s"]["median"] == 3.0
    assert b["figures"]["ready_s"]["ratio_best"] == 0.5 and b["figures"]["ready_s"]["ratio_median"] == 2.0 / 3.0
    assert b["figures"]["x_GBps"]["best"] == 5.0 and b["figures"]["x_GBps"]["ratio_best"] is None


class _FakeCluster:
    """What gpu_memory / proto_info / profile_launch read of a cluster (logs on disk, pids)."""

    def __init__(self, tmp_path, roles, worker_pids=None, t_launch=0.0):
        self._roles, self.worker_pids, self.t_launch, self.ready_s = roles, worker_pids or {}, t_launch, 2.5
        self.workdir = str(tmp_path)

    def roles(self):
        return dict(self._roles)

    def logs(self):
        return sorted(str(p) for p in pathlib.Path(self.workdir).glob("*.log"))


def test_gpu_memory_counts_what_is_not_a_worker(tmp_path, monkeypatch):
    me = os.getpid()
    procs = [{"pid": 10, "gpu": 0, "MiB": 500.0}, {"pid": 11, "gpu": 0, "MiB": 954.0},
             {"pid": 12, "gpu": 0, "MiB": 2000.0}, {"pid": 13, "gpu": 0, "MiB": 2000.0},
             {"pid": 99, "gpu": 0, "MiB": 700.0}, {"pid": me, "gpu": 0, "MiB": 300.0}]
    monkeypatch.setattr(measures, "_nvml_processes", lambda: procs)
    cluster = _FakeCluster(tmp_path, {10: "scheduler", 11: "nanny", 12: "worker", 13: "worker", 14: "helper"})
    mem = measures.gpu_memory(cluster, _host(1))
    assert mem["outside_workers_MiB"] == 1454.0
    assert mem["scheduler_MiB"] == 500.0 and mem["nanny_MiB"] == 954.0  # the bench's two rows
    roles = {p["pid"]: p["role"] for p in mem["processes"]}
    assert roles[99] == "not ours" and roles[me] == "bench client"
    assert "not counted" in mem["note"]
    # NVML pids of another PID namespace: no attribution rather than a wrong number
    monkeypatch.setattr(measures, "_nvml_processes", lambda: [{"pid": 123456, "gpu": 0, "MiB": 518.0}])
    assert measures.gpu_memory(cluster, _host(1))["outside_workers_MiB"] is None
    assert measures.gpu_memory(cluster, _host(0)) is None


def test_proto_info_reads_ucx_tables(tmp_path):
    (tmp_path / "workers-0.log").write_text(
        "[1795963961.871890] [h:200:0]   | ucp_context_0 intra-node cfg#1 | rendezvous from cuda memory |\n"
        "[1795963961.871894] [h:200:0]   |  0..inf | rendezvous zero-copy read from remote | cuda_ipc/cuda |\n"
        "[1795963961.871894] [h:201:0]   |  0..8K  | eager short | tcp/eth0 |\n"
        "[1795963961.871894] [h:202:0]   |  0..inf | copy | cuda_copy/cuda |\n"
        # as UCX 1.21 writes it: the pid padded to 5 characters
        "[1796044913.049317] [vm:5827 :0]   |       0 | eager short   | tcp/eth0 |\n"
        "2026-11-29 14:45:43,556 - distributed.worker - INFO - tcp/eth0 is not a table line\n")
    cluster = _FakeCluster(tmp_path, {}, {"ucx://a:1": 200, "ucx://b:2": 201, "ucx://c:3": 5827})
    assert measures.proto_info(cluster.logs(), cluster.worker_pids) == {
        "workers": {"ucx://a:1": ["cuda_ipc/cuda"], "ucx://b:2": ["tcp/eth0"], "ucx://c:3": ["tcp/eth0"]}}


def test_profile_stages_from_logs(tmp_path):
    import datetime

    t0 = datetime.datetime(2026, 11, 29, 14, 45, 38).timestamp()

    def line(dt, pid, logger, msg):
        stamp = (datetime.datetime.fromtimestamp(t0) + datetime.timedelta(seconds=dt)).strftime("%Y-%m-%d %H:%M:%S,%f")
        return f"{stamp[:-3]} - {pid} - {logger} - INFO - {msg}\n"

    (tmp_path / "scheduler.log").write_text(
        line(0.5, 1, "distributed.gpudask", "gpudask 0.1.0 (scheduler, protocol ucx): plugins x(1)")
        + line(0.8, 1, "distributed.scheduler", "  Scheduler at:     ucx://10.0.0.1:1"))
    (tmp_path / "workers-0.log").write_text(
        line(1.0, 2, "distributed.gpudask", "gpudask 0.1.0 (nanny, protocol ucx): plugins x(1)")
        + line(1.5, 2, "distributed.nanny", "        Start Nanny at: 'ucx://10.0.0.1:2'")
        + line(1.6, 2, "distributed.nanny", "        Start Nanny at: 'ucx://10.0.0.1:3'")
        + line(2.0, 3, "distributed.gpudask", "gpudask 0.1.0 (worker 0, protocol ucx): plugins x(1)")
        + line(2.2, 3, "distributed.worker", "      Start worker at:      ucx://10.0.0.1:4")
        + line(2.4, 3, "distributed.worker", "        Registered to:      ucx://10.0.0.1:1"))
    prof = measures.profile_launch(_FakeCluster(tmp_path, {1: "scheduler", 2: "nanny", 3: "worker"}, t_launch=t0))
    rows = {r["role"]: r for r in prof["processes"]}
    assert rows["scheduler"]["gpudask"] == 0.5 and rows["scheduler"]["listen"] == 0.8
    assert rows["nanny"]["listen"] == 1.6  # the last of its nannies
    assert (rows["worker"]["gpudask"], rows["worker"]["listen"], rows["worker"]["registered"]) == (2.0, 2.2, 2.4)
    summary = measures.summarize_profiles([prof, prof])["median_s_after_launch"]
    assert summary["worker.registered"] == 2.4 and summary["ready"] == 2.5


def test_dask_cuda_local_cupy_report_is_read_run_by_run():
    """The output of dask-cuda's local_cupy (captured on 2 x H200, tests/data) becomes the
    figure's runs and the p2p note."""
    import pathlib

    from gpudask_bench.dask_cuda_client import parse

    text = (pathlib.Path(__file__).parent / "data" / "local_cupy-dot-h200x2.txt").read_text()
    out = parse(text)
    assert out["runs"] == [2.66, 2.94, 2.55]
    assert out["p2p"] == ["(0,1) 4.27 GiB/s 4.99 GiB/s 5.89 GiB/s (29.80 GiB)",
                          "(1,0) 4.25 GiB/s 4.87 GiB/s 5.66 GiB/s (29.80 GiB)"]
    ms = text.replace("2.66 s ", "266.00 ms")
    assert parse(ms)["runs"][0] == 0.266
    assert parse("no report") == {"runs": [], "p2p": []}


@pytest.mark.process
def test_pull_figures_on_numpy_over_tcp_with_one_sides_environment(tmp_path):
    """The in-worker pull (get_data_from_worker awaited in the receiving worker) for one
    configuration: pull_<size>_s per transfer size, --pulls runs after the warm-ups; and
    --config-env reaches that configuration's workers, said in its notes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDASK_")}
    env["TMPDIR"] = str(tmp_path)
    cmd = [sys.executable, "-m", "gpudask.cli", "bench", "--configs", "tcp", "--repeat", "1", "--pulls", "7",
           "--backend", "numpy", "--json", "--max-seconds", "50",
           "--config-env", "tcp:GPUDASK_BENCH_SIDE_PROBE=yes"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=90, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (tcp,) = report["configs"]
    assert tcp["status"] == "ok", tcp.get("notes")
    assert report["settings"]["pulls"] == 7
    assert report["settings"]["config_env"] == {"tcp": {"GPUDASK_BENCH_SIDE_PROBE": "yes"}}
    figs = tcp["figures"]
    for n in report["settings"]["transfer_bytes"]:  # 1MB, 8MB, 64MB here; 1MB, 64MB, 1GB on a GPU
        fig = figs[f"pull_{size_label(n)}_s"]
        assert len(fig["warmup"]) == 3 and len(fig["runs"]) == 7, fig
        assert 0 < fig["best"] <= fig["median"]
        assert figs[f"pull_{size_label(n)}_GBps"]["median"] > 0
    assert "ready_s" in figs
    assert "--config-env: GPUDASK_BENCH_SIDE_PROBE=yes" in tcp["notes"]
    assert all(w["GPUDASK_BENCH_SIDE_PROBE"] == "yes" for w in tcp["env"]["workers"])


def test_config_env_goes_to_one_configuration_only():
    host, opts = _host(1), _opts(2)
    opts.config_env = configs.parse_config_env(
        ["gpudask:DASK_DISTRIBUTED__COMM__OFFLOAD=False", "gpudask:UCXPY_PROGRESS_MODE=polling"],
        ["gpudask", "dask-cuda"])
    gd = configs.build_spec("gpudask", host, opts, "s.json", "d")
    dc = configs.build_spec("dask-cuda", host, opts, "s.json", "d")
    want = {"DASK_DISTRIBUTED__COMM__OFFLOAD": "False", "UCXPY_PROGRESS_MODE": "polling"}
    assert want.items() <= gd.scheduler_env.items()
    assert all(want.items() <= env.items() for _, env in gd.workers)
    assert not any(k in env for _, env in dc.workers for k in want) and not any(k in dc.scheduler_env for k in want)
    for bad in ("gpudask", "gpudask:NOEQUALS", "nope:A=1", "raw-ucxx:A=1", ":A=1"):
        with pytest.raises(ValueError):
            configs.parse_config_env([bad], ["gpudask", "raw-ucxx"])
    assert configs.parse_config_env(["gpudask:A=x=y"], ["gpudask"]) == {"gpudask": {"A": "x=y"}}


def test_local_cupy_arguments_and_its_failures():
    """local_cupy runs transpose_sum and dot at 20000^2 in chunks of 2000 against the cluster as
    its CLI set it up (--disable-rmm), and a failure keeps where it came from."""
    from gpudask_bench import dask_cuda_client as dc

    assert {"transpose_sum", "dot"} <= set(dc.OPERATIONS)
    for op in ("transpose_sum", "dot"):
        size, chunk = dc.SIZES[op]
        assert (size, chunk) == (20000, 2000) and size % chunk == 0
        argv = dc.argv("s.json", "ucx", op, size, chunk, 3)
        assert argv[1:3] == ["-m", "dask_cuda.benchmarks.local_cupy"]
        assert argv[argv.index("-o") + 1] == op and argv[argv.index("-s") + 1] == "20000"
        assert argv[argv.index("-c") + 1] == "2000" and argv[argv.index("--runs") + 1] == "3"
        assert "--disable-rmm" in argv and argv[argv.index("--scheduler-file") + 1] == "s.json"
    # local_cupy 26.10 started with no worker registered (reproduced on CPU): a bare AssertionError
    stderr = ('Traceback (most recent call last):\n'
              '  File "/site/dask_cuda/benchmarks/local_cupy.py", line 317, in <module>\n'
              '    execute_benchmark(\n'
              '  File "/site/dask_cuda/benchmarks/common.py", line 130, in run\n'
              '    assert len(client.scheduler_info(n_workers=-1)["workers"]) > 0\n'
              '           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n'
              'AssertionError\n')
    assert dc.error_text(stderr) == ('AssertionError at dask_cuda/benchmarks/common.py:130 '
                                     '(assert len(client.scheduler_info(n_workers=-1)["workers"]) > 0)')
    assert dc.error_text("") == "no output"
    assert dc.error_text("RuntimeError: boom\n") == "RuntimeError: boom"


@pytest.mark.process
def test_no_workloads_measures_ready_time_only(tmp_path):
    """``--no-workloads``: each configuration is launched and timed, nothing else measured
    (the GPU suite's spill test uses it: the spill launch without the transfers and compute)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDASK_")}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "gpudask.cli", "bench", "--configs", "tcp", "--repeat", "1",
                           "--quick", "--no-workloads", "--json"], capture_output=True, text=True, env=env,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (tcp,) = report["configs"]
    assert report["settings"]["workloads"] is False and tcp["status"] == "ok", tcp.get("notes")
    assert tcp["figures"]["ready_s"]["runs"] and not [k for k in tcp["figures"] if k.startswith("transfer_")]


@pytest.mark.process
def test_sigterm_reports_what_was_measured(tmp_path):
    """SIGTERM during a run: the launch in progress is torn down, the JSON says what was measured
    and which configurations were not reached, and no process is left."""
    import signal
    import time

    import psutil

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDASK_")}
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "gpudask.cli", "bench", "--configs", "tcp,gpudask", "--repeat", "2",
                             "--backend", "numpy", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path)
    deadline = time.monotonic() + 90
    for line in proc.stderr:  # progress: interrupt once the first launch is up
        if "launch 1: ready" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    report = json.loads(out)
    assert "interrupted by a signal: partial results" in report["notes"]
    tcp, gd = report["configs"]
    assert tcp["status"] == "interrupted" and tcp["figures"]["ready_s"]["warmup"], tcp
    assert gd["status"] == "skipped" and gd["notes"] == ["interrupted"]
    time.sleep(1)
    strays = [p.pid for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get("TMPDIR") == str(tmp_path)]
    assert not strays

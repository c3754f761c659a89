"""The /gpudask page and its JSON on real schedulers, and gpudask-* worker metrics on /metrics.

In-process schedulers and workers (distributed's own classes on tcp://127.0.0.1) where the
test needs to reach into them; a subprocess where bokeh must be absent.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest

from conftest import base_env

from distributed import Scheduler, Worker
from distributed.scheduler import WorkerState

import gpudask.dashboard.page as dashboard
from gpudask.checks import SchedulerCheck


async def fetch(port: int, path: str) -> tuple[int, str]:
    from tornado.httpclient import AsyncHTTPClient

    response = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{port}{path}", raise_error=False)
    return response.code, response.body.decode()


async def until(predicate, timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def run(coroutine):
    return asyncio.run(coroutine)


def test_install_on_a_running_scheduler_serves_page_and_state():
    async def main():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as s:
            port = s.http_server.port
            assert (await fetch(port, "/gpudask"))[0] == 404
            assert dashboard.install(s) is True
            assert dashboard.install(s) is False  # idempotent: the handlers are there once
            check = SchedulerCheck()  # plans for itself, as when a client registers it
            s.add_plugin(check)
            await check.start(s)
            async with Worker(s.address, host="127.0.0.1", dashboard_address="127.0.0.1:0", name="stock") as w:
                # a plugin's live numbers, as distributed worker metrics: sent with each heartbeat
                w.metrics["gpudask-spill"] = lambda worker: {"count": 3, "bytes": 3 * 2**20, "seconds": 0.25}
                w.metrics["not-gpudask"] = lambda worker: {"x": 1}
                await until(lambda: "gpudask-spill" in s.workers[w.address].metrics)
                code, page = await fetch(port, "/gpudask")
                assert code == 200 and "<title>gpudask</title>" in page and f'data-worker="{w.address}"' in page
                code, body = await fetch(port, "/gpudask/json")
                assert code == 200
                state = json.loads(body)
                (row,) = state["workers"]
                assert row["address"] == w.address and row["name"] == "stock" and row["gpudask"] is False
                assert row["metrics"] == {"gpudask-spill": {"count": 3, "bytes": 3 * 2**20, "seconds": 0.25}}
                assert row["transports"]["active"] == {"protocol": "tcp", "UCX_TLS": None}
                # the check ran on it: a stock worker is a finding, on the row and in the list
                assert row["check"]["status"] == "warning"
                assert [f["code"] for f in row["check"]["findings"]] == ["no-gpudask"]
                assert [(f["code"], f["subject"]) for f in state["findings"]] == [("no-gpudask", w.address)]
                assert state["check"]["installed"] and state["check"]["action"] == "warn"
                assert state["bokeh"] is True

    run(main())


def test_the_bokeh_dashboard_links_the_page():
    async def main():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as s:
            port = s.http_server.port
            code, before = await fetch(port, "/status")
            assert code == 200 and 'href="gpudask"' not in before
            dashboard.install(s)
            code, after = await fetch(port, "/status")
            assert code == 200 and 'href="gpudask"' in after
            code, page = await fetch(port, "/gpudask")  # where the link leads
            assert code == 200

    run(main())


def test_page_under_a_dashboard_prefix():
    async def main():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0", http_prefix="/dask") as s:
            dashboard.install(s)
            port = s.http_server.port
            assert (await fetch(port, "/dask/gpudask"))[0] == 200
            code, body = await fetch(port, "/dask/gpudask/json")
            assert code == 200 and json.loads(body)["workers"] == []
            assert (await fetch(port, "/gpudask"))[0] == 404

    run(main())


def test_applied_state_and_published_plan_become_the_row():
    """A worker's published plan and (future) applied state, as the scheduler holds them."""
    published = {
        "version": "0.1.0", "protocol": "ucx",
        "facts": {"gpus": [{"uuid": "GPU-a", "name": "NVIDIA H200", "memory_total": 141 * 2**30,
                            "mig": {"instances": []}}]},
        "plan": {"gpu": "GPU-a", "gpu_index": 0, "cuda_visible_devices": "0,1",
                 "env": {"UCX_TLS": "tcp,cuda_copy,cuda_ipc"}, "ucx_transports": ["tcp", "cuda_copy", "cuda_ipc"],
                 "sections": {"rmm": {"allocator": "pool", "initial_pool_size": 2**30},
                              "spill": {"device_memory_limit": 2**33}}},
        "applied": {"cuda_device": "GPU-a", "ucx": {"TLS": ["tcp", "cuda_copy"]}},
    }
    ws = WorkerState(address="ucx://10.0.0.1:1234", status=None, pid=1, name=0, nthreads=1, memory_limit=0,
                     local_directory="/tmp", nanny=None, server_id="x", extra={"gpudask": published})
    ws.metrics = {"gpudask-rmm": {"pool_size": 2**30, "used": 5}, "cpu": 3.0}
    row = dashboard.worker_state(ws.address, ws, {"status": "ok", "findings": []})
    assert row["gpu"] == {"uuid": "GPU-a", "name": "NVIDIA H200", "index": 0, "memory_total": 141 * 2**30,
                          "cuda_visible_devices": "0,1"}
    assert row["transports"] == {
        "planned": {"protocol": "ucx", "UCX_TLS": "tcp,cuda_copy,cuda_ipc",
                    "ucx_transports": ["tcp", "cuda_copy", "cuda_ipc"]},
        "active": {"protocol": "ucx", "UCX_TLS": "tcp,cuda_copy"}}
    assert row["sections"]["spill"]["device_memory_limit"] == 2**33
    # the plugins say what their sections mean: the rmm and spill plugins' rows
    assert row["rows"]["pool"]["planned"] == 2**30 and row["rows"]["pool"]["plugin"] == "rmm"
    assert row["rows"]["spill"]["summary"] == "spill > 8.0 GiB"
    assert row["metrics"] == {"gpudask-rmm": {"pool_size": 2**30, "used": 5}}
    assert row["applied"]["cuda_device"] == "GPU-a" and row["check"]["status"] == "ok"


def test_junk_in_worker_data_never_breaks_the_state():
    ws = WorkerState(address="tcp://10.0.0.1:1", status=None, pid=1, name="j", nthreads=1, memory_limit=0,
                     local_directory="/tmp", nanny=None, server_id="x",
                     extra={"gpudask": {"plan": ["not", "a", "dict"], "facts": {"gpus": [1, None, "x"]},
                                        "applied": "junk"}})
    row = dashboard.worker_state(ws.address, ws, None)
    assert row["gpu"]["uuid"] is None and row["applied"] is None and row["check"] == {"status": None,
                                                                                      "findings": []}


@pytest.mark.process
def test_page_from_the_routes_config_without_bokeh(tmp_path):
    """No bokeh importable; the page comes from distributed.scheduler.http.routes, the
    way a scheduler whose plan lists gpudask.dashboard gets it."""
    script = textwrap.dedent("""
        import asyncio, json, sys
        sys.modules["bokeh"] = None  # as if bokeh were not installed
        import dask.config
        from distributed import Scheduler
        from tornado.httpclient import AsyncHTTPClient
        from gpudask.dashboard.page import MODULE, install

        async def main():
            routes = "distributed.scheduler.http.routes"
            with dask.config.set({routes: [*dask.config.get(routes), MODULE]}):
                async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as s:
                    out = {}
                    for path in ("/gpudask", "/gpudask/json", "/status"):
                        r = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{s.http_server.port}{path}",
                                                          raise_error=False)
                        out[path] = [r.code, r.body.decode()]
                    out["bokeh"] = "bokeh" in sys.modules and sys.modules["bokeh"] is not None
                    out["installed again"] = install(s)  # already there from the routes: nothing added
                    print(json.dumps(out))
        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=base_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["bokeh"] is False and out["installed again"] is False
    assert out["/status"][0] == 200 and "Dask needs bokeh" in out["/status"][1]  # distributed's no-bokeh page
    assert out["/gpudask"][0] == 200 and "<title>gpudask</title>" in out["/gpudask"][1]
    state = json.loads(out["/gpudask/json"][1])
    assert state["bokeh"] is False and state["workers"] == [] and state["check"]["installed"] is False


# ------------------------------------------------------------------------- prometheus
def test_worker_gpudask_metrics_on_its_metrics_page():
    pytest.importorskip("prometheus_client")
    from gpudask.dashboard.prometheus import register_worker_collector

    async def main():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as s:
            async with Worker(s.address, host="127.0.0.1", dashboard_address="127.0.0.1:0") as w:
                assert register_worker_collector(w) is True
                w.metrics["gpudask-rmm"] = lambda worker: {"allocator": "pool", "pool_size": 2**30, "used": 4096,
                                                           "maximum_pool_size": None}
                w.metrics["gpudask-spill"] = lambda worker: {"count": 3, "bytes": 3 * 2**20, "seconds": 0.25,
                                                             "by_tier": {"host": 2, "disk": 1}}
                w.metrics["gpudask-broken"] = lambda worker: 1 / 0  # logged, never breaks the scrape
                w.metrics["other"] = lambda worker: {"pool_size": 7}
                code, text = await fetch(w.http_server.port, "/metrics")
                assert code == 200
                lines = set(text.splitlines())
                assert "dask_worker_gpudask_rmm_pool_size 1.073741824e+09" in lines
                assert "dask_worker_gpudask_rmm_used 4096.0" in lines
                assert 'dask_worker_gpudask_rmm_info{allocator="pool"} 1.0' in lines
                assert "dask_worker_gpudask_spill_count 3.0" in lines
                assert "dask_worker_gpudask_spill_bytes 3.145728e+06" in lines
                assert "dask_worker_gpudask_spill_seconds 0.25" in lines
                assert "dask_worker_gpudask_spill_by_tier_disk 1.0" in lines
                assert not any(line.startswith(("dask_worker_gpudask_rmm_maximum_pool_size", "dask_worker_other_",
                                                "dask_worker_gpudask_broken")) for line in lines)
                assert any(line.startswith("dask_worker_threads ") for line in lines)  # distributed's own, still there
                # live values: the next scrape reads them again
                w.metrics["gpudask-rmm"] = lambda worker: {"pool_size": 2**31, "used": 0}
                code, text = await fetch(w.http_server.port, "/metrics")
                assert "dask_worker_gpudask_rmm_pool_size 2.147483648e+09" in text.splitlines()

    run(main())


@pytest.mark.process
def test_preloaded_cluster_state_and_worker_metrics(cluster, tmp_path):
    """``--preload gpudask`` everywhere, a described 2-GPU host with a 4 GiB pool: the
    scheduler's /gpudask/json has both workers with their GPUs and planned pools, each
    worker's /metrics has the rmm plugin's ``gpudask-rmm`` metric as gauges, and the
    scheduler's /metrics has them for every worker."""
    import urllib.request

    from conftest import described, host

    def get(port: int, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.read().decode()

    # the scheduler on a workstation like the workers' with an older driver: the check's warning in each row
    older = described(tmp_path, "workstation-2gpu-pcie.json", driver_version="550.54.15")
    cluster.scheduler("--preload", "gpudask", "--dashboard-address", "127.0.0.1:0",
                      env=base_env(GPUDASK_FACTS=older))
    cluster.worker("--preload", "gpudask", "--nworkers", "2", "--dashboard", "--dashboard-address", "127.0.0.1:0",
                   env=base_env(GPUDASK_FACTS=host("workstation-2gpu-pcie.json"), DASK_GPUDASK__RMM__POOL_SIZE="4GiB"))
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=120)
        info = client.scheduler_info(n_workers=-1)
        state = json.loads(get(info["services"]["dashboard"], "/gpudask/json"))
        rows = {w["address"]: w for w in state["workers"]}
        assert set(rows) == set(info["workers"])
        assert sorted(w["gpu"]["uuid"] for w in rows.values()) == [
            "GPU-00000000-0000-0000-0000-000000000000", "GPU-00000000-0000-0000-0000-000000000001"]
        for address, row in rows.items():
            assert row["gpudask"] and row["gpu"]["name"] == "NVIDIA RTX A6000"
            assert row["sections"]["rmm"]["allocator"] == "pool"
            assert row["rows"]["pool"]["planned"] == 4 * 2**30 and row["rows"]["pool"]["summary"] == "pool 4.0 GiB"
            assert row["check"]["status"] == "warning"
            assert "driver-mismatch" in {f["code"] for f in row["check"]["findings"]}
            text = get(info["workers"][address]["services"]["dashboard"], "/metrics").splitlines()
            assert "dask_worker_gpudask_rmm_initial_pool_size 4.294967296e+09" in text
            # described host: the pool is planned, not created (applied false)
            assert "dask_worker_gpudask_rmm_applied 0.0" in text
            assert 'dask_worker_gpudask_rmm_info{allocator="pool"} 1.0' in text
        assert {f["subject"] for f in state["findings"] if f["code"] == "driver-mismatch"} == set(rows)
        # the scheduler's /metrics: every worker's gpudask-* metrics, labelled by worker
        text = get(info["services"]["dashboard"], "/metrics").splitlines()
        for address in rows:
            assert f'dask_scheduler_gpudask_rmm_initial_pool_size{{worker="{address}"}} 4.294967296e+09' in text
            assert f'dask_scheduler_gpudask_rmm_info{{allocator="pool",worker="{address}"}} 1.0' in text


def test_the_docs_name_the_columns_the_page_has():
    """docs/dashboard.md's table of the workers' columns is the page's, in its order (it
    kept a 'Memory plan' column the page no longer has)."""
    import pathlib
    import re

    from gpudask.dashboard.html import render

    page = render(3)
    headers = re.findall(r"<th>([^<]+)</th>", page.split('<table id="workers">', 1)[1].split("</thead>", 1)[0])
    docs = (pathlib.Path(__file__).parent.parent / "docs" / "dashboard.md").read_text()
    section = docs.split("## What it shows", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    documented = [line.split("|")[1].strip() for line in rows[2:]]  # the header row and its rule left out
    assert documented == [h.replace("&#x27;", "'") for h in headers]
    assert "Last probe" in page and "[`gpudask check --probe`]" in docs


def test_the_page_comes_drawn_each_worker_named_and_the_probe_without_workers_that_left():
    """The first paint needs no JavaScript: /gpudask arrives with a row per worker, each titled
    by its name or address and its GPU (not its host's IP, which every worker of a host shares),
    and the last probe names only workers still connected."""
    import html.parser

    from gpudask.checks.probe import TOPIC

    class Text(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.titles, self.where = {}, [], []

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "tr" and "data-worker" in attrs:
                self.rows[attrs["data-worker"]] = []
            self.where.append((tag, attrs))

        def handle_endtag(self, tag):
            while self.where and self.where.pop()[0] != tag:
                pass

        def handle_data(self, data):
            row = next((a["data-worker"] for t, a in reversed(self.where) if t == "tr" and "data-worker" in a), None)
            if row is not None and data.strip():
                self.rows[row].append(data.strip())
            if any(a.get("class") == "worker-title" for _, a in self.where) and data.strip():
                self.titles.append(data.strip())

    async def main():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as s:
            dashboard.install(s)
            async with Worker(s.address, host="127.0.0.1", dashboard_address="127.0.0.1:0", name="alpha") as a, \
                    Worker(s.address, host="127.0.0.1", dashboard_address="127.0.0.1:0") as b:
                gone = "tcp://127.0.0.1:1"
                s.log_event(TOPIC, {"status": "ok", "array": "numpy", "protocol": "tcp",
                                    "workers": [a.address, gone], "paths": []})
                code, page = await fetch(s.http_server.port, "/gpudask")
        assert code == 200 and "loading" not in page and 'data-drawn="1"' in page
        text = Text()
        text.feed(page)
        assert sorted(text.rows) == sorted([a.address, b.address])
        assert f"alpha ({a.address})" in text.titles  # its own name, then its address
        assert b.address in text.titles and "127.0.0.1" not in text.titles
        assert all("no gpudask" in " ".join(cells) for cells in text.rows.values())
        summary = page[page.index('id="probe-summary"'):].split("</p>")[0]
        assert a.address in summary and gone not in summary and "1 probed worker(s) since left" in summary

    run(main())


def test_the_drawn_page_escapes_what_workers_publish():
    from gpudask.dashboard.html import render

    state = {"scheduler": {"address": "tcp://s:1"}, "check": {}, "findings": [], "probe": None, "workers": [
        {"address": "tcp://w:1", "title": "<script>alert(1)</script> __FINDINGS__", "gpudask": False}]}
    page = render(3, state)
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    assert "__FINDINGS__" in page  # a value is never taken for a placeholder

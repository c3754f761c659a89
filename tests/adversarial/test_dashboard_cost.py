"""``/gpudask/json`` costs the scheduler's event loop nothing that a plugin or the number of
workers can stretch (issue 32): built off the loop, the plugins' report rows bounded in
time, concurrent readers sharing one build, the JSON bounded in size."""

from __future__ import annotations

import concurrent.futures
import json
import time
import types
import urllib.request

import pytest
from conftest import base_env, host, third_party_plugin

TWO_GPUS = host("workstation-2gpu-pcie.json")

SLOW_ROWS = """
    import time
    from gpudask.pluginapi import hookimpl

    name = "slowrows"
    priority = 500

    @hookimpl
    def gpudask_report_rows(plan, published):
        time.sleep(20)
        return [{"column": "slow", "summary": "late"}]
    """


def _get(url: str) -> tuple[float, bytes]:
    start = time.monotonic()
    with urllib.request.urlopen(url, timeout=60) as r:
        return time.monotonic() - start, r.read()


@pytest.mark.process
def test_a_slow_report_rows_plugin_and_concurrent_readers_do_not_stall_the_event_loop(cluster, tmp_path):
    env = base_env(GPUDASK_FACTS=TWO_GPUS, **third_party_plugin(tmp_path, SLOW_ROWS, "slowrows"))
    cluster.scheduler("--preload", "gpudask", "--dashboard", "--dashboard-address", "127.0.0.1:0", env=env)
    cluster.worker("--preload", "gpudask", "--nworkers", "1", env=env)
    with cluster.client() as client:
        client.wait_for_workers(1, timeout=60)
        base = f"http://127.0.0.1:{client.scheduler_info()['services']['dashboard']}"
    with concurrent.futures.ThreadPoolExecutor(21) as pool:
        pages = [pool.submit(_get, f"{base}/gpudask/json") for _ in range(20)]
        time.sleep(0.3)
        health = pool.submit(_get, f"{base}/health").result()
        results = [p.result() for p in pages]
    # before: each read held the loop 20 s (/health waited behind them)
    assert health[0] < 1.5 and health[1] == b"ok", health
    for seconds, body in results:
        assert seconds < 10, seconds
        state = json.loads(body)
        assert "rows" in state["workers"][0]
        (problem,) = state["problems"]
        assert problem.startswith("plugin slowrows's report rows left out: "), problem
        assert "gpudask_report_rows did not finish within 2 s" in problem or "still in gpudask_report_rows" in problem
    # the plugin is still in its call: the next build does not wait for it again
    time.sleep(dashboard_serve_cache_s() + 0.1)
    seconds, body = _get(f"{base}/gpudask/json")
    assert seconds < 1.5 and "still in gpudask_report_rows" in json.loads(body)["problems"][0]


def dashboard_serve_cache_s() -> float:
    from gpudask.dashboard.serve import CACHE_S

    return CACHE_S


def test_the_pages_json_is_bounded_with_a_thousand_workers(monkeypatch):
    """1000 workers each publishing a large plan: the JSON stays under the limit and says how
    many rows it left out (before: 15 MB per read)."""
    from gpudask.dashboard import page as dashboard
    from gpudask.dashboard import serve as dashboard_serve
    from gpudask.checks import EXTRA_KEY, PUBLISHED_KEY

    published = {"version": "x", "protocol": "tcp", "plan": {"sections": {f"s{i}": {"k": "v" * 200} for i in range(20)}},
                 "applied": {f"k{i}": {"planned": "p" * 100, "actual": "a" * 100} for i in range(40)}}
    workers = [(f"tcp://10.0.{i // 250}.{i % 250}:1234",
                types.SimpleNamespace(name=str(i), host="h", extra={PUBLISHED_KEY: published}, metrics={}))
               for i in range(1000)]
    snap = {"address": "tcp://10.0.0.1:8786", "workers": workers, "report": {}, "bokeh": False, "probe": None,
            "extra_key": EXTRA_KEY}
    body = dashboard.build(snap)
    assert len(body) <= dashboard_serve.MAX_JSON_BYTES + 100_000
    state = json.loads(body)
    assert state["workers_left_out"] > 0
    assert len(state["workers"]) + state["workers_left_out"] == 1000
    assert f"{state['workers_left_out']} of 1000 workers left out" in state["problems"][0]

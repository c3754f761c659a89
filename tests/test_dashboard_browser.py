"""The /gpudask page in a real browser (headless Chromium) against a real cluster.

``dask scheduler --preload gpudask`` on a GPU-less described host and ``dask worker
--preload gpudask --nworkers 2`` on a described 2-GPU workstation: the page must show
both workers with their GPUs, and the scheduler check's finding about the GPU-less
scheduler, drawn again by the page's own script (it fetches the page as the scheduler draws it).

Set ``UPDATE_SCREENSHOTS=1`` to write the screenshot into docs/img/dashboard.png.
"""

from __future__ import annotations

import html.parser
import json
import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import base_env, described, host

ROOT = pathlib.Path(__file__).parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.browser, pytest.mark.process,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)"),
]


def chromium(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    # --no-sandbox: CI containers run as root, where Chromium's sandbox refuses to start
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=10000", *args], capture_output=True, text=True, timeout=timeout)


class Rows(html.parser.HTMLParser):
    """The text a person reads in each table row, keyed by the row's worker or kind."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[dict[str, str], list[str]]] = []
        self.body: dict[str, str] = {}
        self._open: list[str] | None = None
        self._glue = False
        self.wbr = 0  # <wbr> elements: where names may wrap

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "tr":
            self.rows.append((dict(attrs), []))
            self._open = self.rows[-1][1]
        elif tag == "body":
            self.body = dict(attrs)
        elif tag == "wbr":  # a place a long name may wrap: the text goes on in the same word
            self._glue = True
            self.wbr += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None and data.strip():
            if self._glue and self._open:
                self._open[-1] += data.strip()
            else:
                self._open.append(data.strip())
        self._glue = False

    def text(self, **attr: str) -> list[str]:
        return [" ".join(cells) for attrs, cells in self.rows if all(attrs.get(k) == v for k, v in attr.items())]


def test_a_person_sees_the_workers_gpus_and_the_check_finding(cluster, tmp_path):
    workstation = json.loads(pathlib.Path(host("workstation-2gpu-pcie.json")).read_text())
    # the scheduler on a workstation like the workers' with an older driver: the check's warning
    older = described(tmp_path, "workstation-2gpu-pcie.json", driver_version="550.54.15")
    cluster.scheduler("--preload", "gpudask", "--dashboard", "--dashboard-address", "127.0.0.1:0",
                      env=base_env(GPUDASK_FACTS=older))
    cluster.worker("--preload", "gpudask", "--nworkers", "2",
                   env=base_env(GPUDASK_FACTS=host("workstation-2gpu-pcie.json"), DASK_GPUDASK__RMM__POOL_SIZE="4GiB"))
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=120)
        info = client.scheduler_info(n_workers=-1)
        workers = sorted(info["workers"])
        url = f"http://127.0.0.1:{info['services']['dashboard']}/gpudask"

        done = chromium("--dump-dom", url)
        assert done.returncode == 0, done.stderr[-2000:]
        page = Rows()
        page.feed(done.stdout)

        # one row per worker, each with its own GPU of the described host
        rows = {address: page.text(**{"data-worker": address}) for address in workers}
        assert all(len(r) == 1 for r in rows.values()), (rows, done.stdout[-3000:])
        uuids = {gpu["uuid"] for gpu in workstation["gpus"]}
        seen = set()
        for address, (text,) in rows.items():
            assert "NVIDIA RTX A6000" in text and address in text, text
            (uuid,) = [u for u in uuids if u in text]
            seen.add(uuid)
            assert "tcp no UCX_TLS tcp UCX_TLS not reported" in text  # planned and active transports
            assert "pool_size: 4.00 GiB" in text  # the memory plan (a 4 GiB RMM pool asked for)
            assert "warning" in text and "driver-mismatch" in text  # the check's verdict in the row
        assert seen == uuids, "the two workers must show the two different GPUs"

        findings = page.text(**{"class": "finding"})
        driver = [f for f in findings if "NVIDIA driver differs" in f]
        # the finding both workers share is one row naming both (it was one row per worker)
        assert len(driver) == 1 and all(a in driver[0] for a in workers), findings
        assert "the scheduler has 550.54.15, the worker has 570.86.15" in driver[0], driver
        # it refreshes by itself: the script fetched the page more than once
        assert int(page.body.get("data-refreshes", "0")) >= 2, page.body

        shot = tmp_path / "dashboard.png"
        done = chromium(f"--screenshot={shot}", "--window-size=1200,700", url)
        assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]
        if os.environ.get("UPDATE_SCREENSHOTS"):
            (ROOT / "docs" / "img").mkdir(exist_ok=True)
            shutil.copy(shot, ROOT / "docs" / "img" / "dashboard.png")


def test_on_a_cpu_host_the_page_says_why_plugins_skipped_and_probe_times_in_ms(cluster):
    """What ``gpudask info`` and ``gpudask check --probe`` say, the page says too: the skipped
    plugins with their reasons (not "no plugin decisions"), probe times in milliseconds as
    the CLI prints them; long metric and setting names wrap only between their parts."""
    import re
    import sys

    cluster.scheduler("--preload", "gpudask", "--dashboard", "--dashboard-address", "127.0.0.1:0")
    cluster.worker("--preload", "gpudask", "--nworkers", "2")
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=120)
        info = client.scheduler_info(n_workers=-1)
        url = f"http://127.0.0.1:{info['services']['dashboard']}/gpudask"
        probe = subprocess.run([sys.executable, "-m", "gpudask.cli", "check", "--probe", cluster.address],
                               capture_output=True, text=True, timeout=120, env=base_env())
        assert probe.returncode == 0, probe.stdout + probe.stderr
        done = chromium("--dump-dom", url)
    assert done.returncode == 0, done.stderr[-2000:]
    page = Rows()
    page.feed(done.stdout)
    for address in info["workers"]:
        (text,) = page.text(**{"data-worker": address})
        assert "no plugin decisions" not in text
        assert "rmm skipped: no GPU visible: no RMM pool" in text and "gpu-pinning skipped: no GPU visible" in text
    paths = page.text(**{"class": "probe-path"})
    assert paths and all(re.search(r" \d+\.\d ms | \d+\.\d\d s ", f" {p} ") for p in paths), paths
    assert not any(re.search(r" 0\.\d{3,} ", p) for p in paths), paths  # not seconds with 4 digits
    assert page.wbr > 0  # names (worker-memory.host_memory_fraction ...) wrap after their dots and dashes
    assert "overflow-wrap: anywhere" not in done.stdout  # which cut words at any letter


def test_before_its_script_runs_the_page_shows_each_worker_by_name_and_gpu(cluster):
    """The first paint is the scheduler's (a headless screenshot caught "loading…" when the
    script drew everything): the page as loaded, before its script has drawn anything (no
    virtual time for it; Chromium's --dump-dom needs scripts on), has each worker's row,
    titled by its address and GPU, not by the IP every worker of the host shares."""
    cluster.scheduler("--preload", "gpudask", "--dashboard", "--dashboard-address", "127.0.0.1:0",
                      env=base_env(GPUDASK_FACTS=host("no-gpu.json")))
    cluster.worker("--preload", "gpudask", "--nworkers", "2",
                   env=base_env(GPUDASK_FACTS=host("workstation-2gpu-pcie.json")))
    with cluster.client() as client:
        client.wait_for_workers(2, timeout=120)
        info = client.scheduler_info(n_workers=-1)
        url = f"http://127.0.0.1:{info['services']['dashboard']}/gpudask"
        done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", url],
                              capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "loading" not in done.stdout and 'data-drawn="1"' in done.stdout, done.stdout[:3000]
    page = Rows()
    page.feed(done.stdout)
    assert page.body.get("data-refreshes") == "0", page.body  # the script has not drawn: the scheduler did
    titles = set()
    for address, worker in info["workers"].items():
        (text,) = page.text(**{"data-worker": address})
        index = worker["gpudask"]["plan"]["gpu_index"]
        assert f"{address} · GPU {index} (NVIDIA RTX A6000)" in text, text
        titles.add(index)
    assert titles == {0, 1}
    assert any("scheduler-no-gpu" in f for f in page.text(**{"class": "finding"}))

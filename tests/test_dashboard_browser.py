"""The /gpudask page in a real browser (headless Chromium) against a real cluster.

``dask scheduler --preload gpudask`` on a GPU-less described host and ``dask worker
--preload gpudask --nworkers 2`` on a described 2-GPU workstation: the page must show
both workers with their GPUs, and the scheduler check's finding about the GPU-less
scheduler, drawn by the page's own script from ``/gpudask/json``.

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

from conftest import base_env, host

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

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "tr":
            self.rows.append((dict(attrs), []))
            self._open = self.rows[-1][1]
        elif tag == "body":
            self.body = dict(attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None and data.strip():
            self._open.append(data.strip())

    def text(self, **attr: str) -> list[str]:
        return [" ".join(cells) for attrs, cells in self.rows if all(attrs.get(k) == v for k, v in attr.items())]


def test_a_person_sees_the_workers_gpus_and_the_check_finding(cluster, tmp_path):
    workstation = json.loads(pathlib.Path(host("workstation-2gpu-pcie.json")).read_text())
    cluster.scheduler("--preload", "gpudask", "--dashboard", "--dashboard-address", "127.0.0.1:0",
                      env=base_env(GPUDASK_FACTS=host("no-gpu.json")))
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
            assert "warning" in text and "scheduler-no-gpu" in text  # the check's verdict in the row
        assert seen == uuids, "the two workers must show the two different GPUs"

        findings = page.text(**{"class": "finding"})
        no_gpu = [f for f in findings if "scheduler-no-gpu" in f]
        assert {a for a in workers if any(a in f for f in no_gpu)} == set(workers), findings
        assert all("the scheduler has no GPU visible while the worker has 2 GPU(s)" in f for f in no_gpu), no_gpu
        # it refreshes by itself: the script fetched the state more than once
        assert int(page.body.get("data-refreshes", "0")) >= 2, page.body

        shot = tmp_path / "dashboard.png"
        done = chromium(f"--screenshot={shot}", "--window-size=1200,700", url)
        assert done.returncode == 0 and shot.stat().st_size > 10_000, done.stderr[-2000:]
        if os.environ.get("UPDATE_SCREENSHOTS"):
            (ROOT / "docs" / "img").mkdir(exist_ok=True)
            shutil.copy(shot, ROOT / "docs" / "img" / "dashboard.png")

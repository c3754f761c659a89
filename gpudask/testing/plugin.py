"""A pytest plugin: real ``dask scheduler`` / ``dask worker`` processes for a test, in the
shape of pytest's ``pytester`` (docs/testing.md).  Enabled with ``pytest_plugins =
["gpudask.testing.plugin"]``; no ``pytest11`` entry point, which would import gpudask in every
pytest run wherever gpudask is installed.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from collections.abc import Callable, Iterator, Mapping

import pytest

from gpudask.testing.processes import ProcessCluster, clean_env

__all__ = ["Cluster", "gpudask_cluster", "gpudask_cluster_factory"]

_KEEP_LOGS = pytest.StashKey["pathlib.Path | None"]()


class Cluster(ProcessCluster):
    """:class:`~gpudask.testing.processes.ProcessCluster` in a test's folder.  A process started
    without ``env=`` gets :func:`~gpudask.testing.processes.clean_env` as it is when the process
    starts (a test's ``monkeypatch.setenv`` counts), never the pytest process's bookkeeping."""

    def __init__(self, workdir: str | os.PathLike[str], grace: float = 15.0):
        super().__init__(workdir, env={}, grace=grace)
        self.tmp_path = pathlib.Path(workdir)

    def spawn(self, label: str, argv: list[str], env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike[str] | None = None) -> subprocess.Popen[bytes]:
        return super().spawn(label, argv, clean_env() if env is None else env, cwd)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpudask", "gpudask process clusters (gpudask.testing.plugin)")
    group.addoption("--gpudask-keep-logs", metavar="DIR", default=None,
                    help="Keep the log of every process the gpudask cluster fixtures started in DIR/<test>/ "
                         "(default: $GPUDASK_TEST_LOGS, else not kept).")


def pytest_configure(config: pytest.Config) -> None:
    # read here, before any test's clean-up of the environment can hide GPUDASK_TEST_LOGS
    where = config.getoption("gpudask_keep_logs", None) or os.environ.get("GPUDASK_TEST_LOGS")
    config.stash[_KEEP_LOGS] = pathlib.Path(where) if where else None


def _keep_logs(dest_root: pathlib.Path, test: str, name: str | None, cluster: Cluster) -> None:
    dest = dest_root / "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in test)
    if name is not None:
        dest = dest / name
    dest.mkdir(parents=True, exist_ok=True)
    for label, path in cluster.logs.items():
        if path.exists():
            (dest / f"{label}.log").write_bytes(path.read_bytes())


@pytest.fixture
def gpudask_cluster_factory(tmp_path: pathlib.Path, request: pytest.FixtureRequest
                            ) -> Iterator[Callable[..., Cluster]]:
    """``make(name=None, *, grace=15.0)``: a new :class:`Cluster` in ``tmp_path / name``;
    all of them stopped when the test ends."""
    made: list[tuple[str | None, Cluster]] = []

    def make(name: str | None = None, *, grace: float = 15.0) -> Cluster:
        if name is None and made:
            raise ValueError("gpudask_cluster_factory: a second cluster needs a name (its folder under tmp_path)")
        if name is not None and (not name or "/" in name or name in (".", "..")
                                 or any(n == name for n, _ in made)):
            raise ValueError(f"gpudask_cluster_factory: name {name!r}: accepted: a new folder name under tmp_path, "
                             "without '/'")
        workdir = tmp_path if name is None else tmp_path / name
        workdir.mkdir(parents=True, exist_ok=True)
        cluster = Cluster(workdir, grace=grace)
        made.append((name, cluster))
        return cluster

    yield make
    survivors: list[int] = []
    keep = request.config.stash.get(_KEEP_LOGS, None)
    for name, cluster in made:
        survivors += cluster.stop()
        if keep is not None:
            _keep_logs(keep, request.node.name, name, cluster)
    if survivors:
        pytest.fail(f"processes of the test's gpudask clusters survived SIGKILL: {sorted(survivors)}", pytrace=False)


@pytest.fixture
def gpudask_cluster(gpudask_cluster_factory: Callable[..., Cluster]) -> Cluster:
    """A :class:`Cluster` in the test's ``tmp_path``, stopped when the test ends."""
    return gpudask_cluster_factory()


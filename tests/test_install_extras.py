"""The install extras resolve on a fresh machine (docs/usage.md, Installing: the ``pip install
--dry-run`` outputs): one RAPIDS series for every RAPIDS package, a test extra that combines with
either CUDA major, and a plain install that gets the dask the UCX extras pin.

Resolution itself needs the network, so it is recorded in the docs; these tests read
``pyproject.toml`` and the metadata of what the README's test command installed
(distributed-ucxx-cu13 and its rapids-dask-dependency), network-free."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = {name: [Requirement(r) for r in reqs] for name, reqs in PROJECT["optional-dependencies"].items()}
CUDA_EXTRAS = ("cu12", "cu13", "ucx-cu12", "ucx-cu13")


def pin(extra: str, package_prefix: str) -> str | None:
    """The ``==X.Y.*`` series ``extra`` pins a package starting with ``package_prefix`` to."""
    for req in EXTRAS[extra]:
        if req.name.startswith(package_prefix):
            (spec,) = req.specifier
            assert spec.operator == "==" and spec.version.endswith(".*"), f"[{extra}] {req}: pin a series"
            return spec.version.removesuffix(".*")
    return None


def test_every_cuda_extra_pins_the_same_rapids_series():
    ucxx = {extra: pin(extra, "distributed-ucxx-") for extra in CUDA_EXTRAS}
    assert None not in ucxx.values() and len(set(ucxx.values())) == 1, ucxx
    rmm = {extra: pin(extra, "rmm-") for extra in ("cu12", "cu13")}
    assert None not in rmm.values() and len(set(rmm.values())) == 1, rmm
    for major in ("12", "13"):  # each extra names its own CUDA major's wheels only
        for extra in (f"cu{major}", f"ucx-cu{major}"):
            names = [r.name for r in EXTRAS[extra]]
            assert all(n.endswith((f"-cu{major}", f"-cuda{major}x")) for n in names), (extra, names)

def test_the_test_extra_names_no_cuda_major_so_it_combines_with_either():
    names = [r.name for r in EXTRAS["test"]]
    assert not [n for n in names if re.search(r"cu(da)?1[0-9]", n)], names
    assert not [n for n in names if n.startswith(("distributed-ucxx", "ucxx", "rmm", "cupy"))], names


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_the_installed_ucx_extra_is_the_pinned_series_and_the_plain_install_gets_its_dask():
    """What the README's test command installed (ucx-cu13) is the pinned series, its RAPIDS series
    is rmm's pin, and gpudask's own distributed bound stops where distributed-ucxx's pin does, so
    a plain install and one with a UCX extra run the same dask."""
    version = _installed("distributed-ucxx-cu13")
    if version is None:
        pytest.skip("distributed-ucxx-cu13 is not installed (the README's test command installs it)")
    assert Version(version).base_version.startswith(pin("ucx-cu13", "distributed-ucxx-") + ".")
    requires = [Requirement(r) for r in importlib.metadata.requires("distributed-ucxx-cu13") or []]
    (rapids,) = [r for r in requires if r.name == "rapids-dask-dependency" and r.marker is None]
    (spec,) = rapids.specifier
    assert spec.version.removesuffix(".*") == pin("cu13", "rmm-") == pin("cu12", "rmm-")
    pinned = [Requirement(r) for r in importlib.metadata.requires("rapids-dask-dependency") or []]
    (dist,) = [r for r in pinned if r.name == "distributed" and r.marker is None]
    ours = next(Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == "distributed")
    upper = lambda req: {s.version for s in req.specifier if s.operator == "<"}  # noqa: E731
    assert upper(ours) == upper(dist), (str(ours), str(dist))
    assert ours.specifier.contains(_installed("distributed"))

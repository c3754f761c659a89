"""The README's two commands are the ones CI runs, literally, each in a fresh virtual environment."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).parents[1]


def readme_commands(path: pathlib.Path) -> list[str]:
    block = re.search(r"```bash\n(.*?)```", path.read_text(), flags=re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()][:2]


def test_ci_runs_the_readme_commands_first_each_in_a_fresh_venv():
    install_demo, install_test = readme_commands(ROOT / "README.md")
    assert install_demo == "python -m pip install -e . && gpudask demo"
    # the bench is its own distribution (contrib/gpudask-bench): the tests' install brings it,
    # so its tests run in CI; the first command installs gpudask alone
    assert install_test == "python -m pip install -e '.[test,ucx-cu13]' -e ./contrib/gpudask-bench && python -m pytest"
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    first, second = lines.index(install_demo), lines.index(install_test)
    assert first < second
    before = lines[:first]
    assert not [line for line in before if "pip install" in line], "nothing may be installed before the first"
    venvs = [i for i, line in enumerate(lines) if re.match(r"python3 -m venv \S+$", line)]
    assert any(i < first for i in venvs) and any(first < i < second for i in venvs), "each gets a fresh venv"


def test_the_device_scripts_install_the_bench_with_gpudask():
    """Every device script that installs the checkout installs contrib/gpudask-bench the same
    way (offline, editable): the GPU tests and `gpudask bench` need it there too."""
    scripts = sorted(ROOT.glob("bench/*.sh")) + sorted(ROOT.glob("lab/bench/*.sh")) + [
        ROOT / "tests/workloads/run-on-device.sh",
        ROOT / ".ci/gpu-on-device.sh"]
    installs = {str(p.relative_to(ROOT)): [line for line in p.read_text().splitlines()
                                           if "--no-build-isolation -e ." in line] for p in scripts}
    assert [name for name, lines in installs.items() if lines] != []
    missing = [name for name, lines in installs.items() if any("-e ./contrib/gpudask-bench" not in x for x in lines)]
    assert missing == []


def test_docs_home_shows_the_same_two_commands():
    assert readme_commands(ROOT / "docs" / "index.md") == readme_commands(ROOT / "README.md")

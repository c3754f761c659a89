"""Every ```python block of the documentation runs, as a script, on this (CPU) machine.

A block that cannot run here is marked, on the line before it, with
``<!-- not run: REASON -->`` (a signature, an output, needs a GPU cluster or dask-cuda);
a block that goes on from the one before it (a plugin module built up section by section)
with ``<!-- continues: REASON -->``: it runs after the blocks it continues, as one script.
An unmarked block that fails fails this test, so an example cannot go stale.
docs/reference/ is generated from the code (signatures) and not searched.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
from conftest import base_env

DOCS = pathlib.Path(__file__).parents[1] / "docs"
FENCE = re.compile(r"^(?P<indent>[ ]*)```python[^\n]*\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.M | re.S)
MARK = re.compile(r"<!--\s*(?P<kind>not run|continues):\s*(?P<reason>\S.*?)\s*-->")
TIME_LIMIT = 90  # seconds a block may run (a LocalGPUCluster starts and stops in a few)


@dataclass
class Block:
    path: pathlib.Path
    line: int
    code: str
    mark: str | None  # "not run", "continues" or None
    reason: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(DOCS)}:{self.line}"


def _blocks() -> list[Block]:
    out = []
    for path in sorted(DOCS.rglob("*.md")):
        if "reference" in path.relative_to(DOCS).parts:
            continue
        text = path.read_text()
        for m in FENCE.finditer(text):
            before = text[:m.start()].rstrip().rsplit("\n", 1)[-1]
            mark = MARK.search(before)
            code = "\n".join(line[len(m["indent"]):] for line in m["body"].splitlines()) + "\n"
            out.append(Block(path, text.count("\n", 0, m.start()) + 1, code,
                             mark["kind"] if mark else None, mark["reason"] if mark else None))
    return out


BLOCKS = _blocks()


def _script(block: Block) -> str:
    """The block, after the blocks it continues (back to the first unmarked one)."""
    same = [b for b in BLOCKS if b.path == block.path and b.line <= block.line]
    chain = [block]
    for b in reversed(same[:-1]):
        if chain[0].mark != "continues":
            break
        if b.mark == "not run":
            continue
        chain.insert(0, b)
    return "\n".join(b.code for b in chain)


def test_the_docs_have_python_examples_and_every_mark_names_a_reason():
    assert len([b for b in BLOCKS if b.mark != "not run"]) >= 10, [b.name for b in BLOCKS]
    for b in BLOCKS:
        if b.mark == "continues":
            assert any(o.path == b.path and o.line < b.line and o.mark is None for o in BLOCKS), \
                f"{b.name}: 'continues' but no runnable block before it in its page"


@pytest.mark.process
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.mark != "not run"], ids=lambda b: b.name)
def test_a_python_example_of_the_docs_runs(block, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(_script(block))
    try:
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIME_LIMIT,
                             cwd=str(tmp_path), env=base_env())
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.name} ran past {TIME_LIMIT} s; mark it <!-- not run: REASON --> if it cannot run here")
    assert out.returncode == 0, (f"{block.name} failed (mark it <!-- not run: REASON --> if it cannot run "
                                 f"here):\n{out.stderr[-3000:]}")

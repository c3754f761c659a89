"""``gpudask info --reasons`` fits the terminal, as ``gpudask config`` and the summary do,
and loses no word doing so; a pipe gets whole lines."""

from __future__ import annotations

import subprocess
import sys

from conftest import base_env, host

DGX = host("dgx-8gpu-nvswitch-4ib.json")


def _reasons(**env: str) -> str:
    out = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--reasons", "--facts", DGX],
                         capture_output=True, text=True, timeout=60, env=base_env(**env))
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_info_reasons_wraps_to_a_100_column_terminal_and_keeps_every_word():
    narrow, whole = _reasons(COLUMNS="100"), _reasons()
    assert max(len(line) for line in whole.splitlines()) > 100  # there is something to wrap
    too_wide = [line for line in narrow.splitlines() if len(line) > 100]
    assert not too_wide, too_wide[:3]
    after_table = narrow[narrow.index("\nscheduler:"):].split(), whole[whole.index("\nscheduler:"):].split()
    assert after_table[0] == after_table[1]  # prose wraps between words: nothing lost or cut
    assert any(line.strip().startswith("dask worker tcp://SCHEDULER:8786 --nworkers 8") for line in narrow.splitlines())

"""``ucx_info`` on a worker's start-up path (issue 24, distributed-ucxx's suite preloaded).

A worker that plans for itself (no planning parent: distributed-ucxx's tests start
``Nanny(preload=["gpudask"])`` in-process) inherits ``UCX_*`` variables and used to run
``ucx_info -e -u t`` for the scheduler-role part of its own host plan, and ``ucx_info -d``
whenever an answer was not cached (a failure never was).  Now a worker plans only what it
applies, and the transports answer (or its failure) is cached per host, so a worker start
runs no ``ucx_info`` at all once the host was probed."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
from conftest import base_env

SCRIPT = """
import asyncio, json, os
from distributed import Client, Nanny, Scheduler

async def main():
    async with Scheduler(protocol="ucx", dashboard_address=":0") as s:
        async with Nanny(s.address, preload=["gpudask"], nthreads=1) as a, \\
                Nanny(s.address, preload=["gpudask"], nthreads=1) as b:
            async with Client(s.address, asynchronous=True) as c:
                await c.wait_for_workers(2)
                pids = await c.run(os.getpid)
                print("PIDS " + json.dumps(sorted(pids.values())))

if __name__ == "__main__":
    asyncio.run(main())
"""


def _shadow(tmp_path: pathlib.Path) -> tuple[dict[str, str], pathlib.Path]:
    """A ``ucx_info`` first on PATH that records each call (its parent's pid, its arguments)
    and runs the real one from the libucx wheel."""
    import importlib.util

    spec = importlib.util.find_spec("libucx")
    if spec is None or not spec.origin:
        pytest.skip("libucx (distributed-ucxx's UCX) is not installed")
    wheel = pathlib.Path(spec.origin).parent
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "ucx_info.calls"
    shadow = bindir / "ucx_info"
    shadow.write_text("#!/bin/sh\n"
                      'echo "$PPID $*" >> "$UCXINFO_CALLS"\n'
                      f'LD_LIBRARY_PATH="{wheel / "lib"}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}" '
                      f'exec "{wheel / "bin" / "ucx_info"}" "$@"\n')
    shadow.chmod(0o755)
    state = tmp_path / "tmp"
    state.mkdir()
    env = base_env(PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", UCXINFO_CALLS=str(calls),
                   TMPDIR=str(state),  # a fresh state directory: nothing cached from other runs
                   # gpudask then tries the ucx_info on PATH before the wheel's (as ucxx loads the system UCX)
                   RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY="true",
                   # what distributed-ucxx's test processes inherit, taken for the user's
                   UCX_TCP_CM_REUSEADDR="y", UCX_MEMTYPE_CACHE="n")
    env.pop("XDG_RUNTIME_DIR", None)
    env.pop("UCX_WARN_UNUSED_ENV_VARS", None)
    return env, calls


def _calls(path: pathlib.Path) -> list[tuple[int, str]]:
    if not path.exists():
        return []
    return [(int(line.split(" ", 1)[0]), line.split(" ", 1)[1]) for line in path.read_text().splitlines()]


@pytest.mark.process
def test_a_self_planning_worker_start_runs_no_ucx_info_e(tmp_path):
    env, calls = _shadow(tmp_path)
    (tmp_path / "start.py").write_text(SCRIPT)
    out = subprocess.run([sys.executable, "start.py"], capture_output=True, text=True, timeout=180, env=env,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    recorded = _calls(calls)
    # never UCX's view of the user's variables: that is for processes planning the host
    assert not [args for _, args in recorded if args.startswith("-e")], recorded
    # the transports probe ran once for the host (first worker), the second read the cache
    assert [args for _, args in recorded] == ["-d"], recorded


@pytest.mark.process
def test_once_the_host_was_probed_a_worker_start_runs_no_ucx_info(tmp_path):
    env, calls = _shadow(tmp_path)
    # a planning process (here gpudask info) probes the host: its calls are expected ...
    info = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--protocol", "ucx"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert info.returncode == 0, info.stderr[-3000:]
    probed = _calls(calls)
    assert sorted(args for _, args in probed) == ["-d", "-e -u t"], probed  # the shadow is the one used
    # ... a failure is cached too: a second planning process runs none
    again = subprocess.run([sys.executable, "-m", "gpudask.cli", "info", "--protocol", "ucx"], capture_output=True,
                           text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert again.returncode == 0 and _calls(calls) == probed
    (tmp_path / "start.py").write_text(SCRIPT)
    out = subprocess.run([sys.executable, "start.py"], capture_output=True, text=True, timeout=180, env=env,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "PIDS " in out.stdout
    assert _calls(calls) == probed  # the two worker starts: not one ucx_info

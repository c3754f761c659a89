"""The host plan, handed from the process that planned it to the worker processes it starts:
a file of the private state directory named in ``$GPUDASK_HOST_PLAN``, which they inherit;
each claims its number in ``$GPUDASK_GROUP``.  Files of dead processes are removed by the
next planning process of the same user.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import shutil
import sys
from typing import Any

from gpudask import bootstrap
from gpudask.errors import GpudaskError
from gpudask.facts import statedir
from gpudask.plan import HostPlan
from gpudask.plan.host_plan import parse_document

PLAN_ENV = "GPUDASK_HOST_PLAN"
GROUP_ENV = "GPUDASK_GROUP"


def publish(host: HostPlan, always: bool = False) -> None:
    """Write ``host`` for this process's worker processes; a no-op where nothing was decided
    unless ``always``."""
    if not always and not decided_anything(host):
        return
    base = statedir.state_dir()
    reclaim_stale(base)
    path = base / f"plan-{os.getpid()}.json"
    statedir.write_atomic(path, host.to_json())
    os.environ[PLAN_ENV] = str(path)
    os.environ.setdefault(GROUP_ENV, f"pid-{os.getpid()}")
    atexit.register(_remove, path, base / os.environ[GROUP_ENV])
    path.with_name(path.name + ".fatal").unlink(missing_ok=True)


def decided_anything(host: HostPlan) -> bool:
    """Did gpudask decide anything for this host (a CPU host with tcp: nothing)?"""
    return any(p.env or p.config or p.cpu_affinity or p.sections or p.multiprocessing_method or p.resources
               for p in host.processes())


def load() -> HostPlan | None:
    """The host plan this worker process's parent wrote, with its facts and settings; None
    (none, or not safe to read).

    :raises PlanFileError: the file is not a host plan this gpudask reads (one line)."""
    path = os.environ.get(PLAN_ENV)
    if not path:
        return None
    # never trusted unless it is this user's own file in a directory only this user can write
    text = statedir.read_private(path, "host plan")
    if text is None:
        return None  # the parent is gone, wrote nothing, or the file is not safe: the worker plans for itself
    doc = parse_document(text, f"the host plan {path} (${PLAN_ENV})")
    return HostPlan.from_document(doc, bootstrap.from_plan(doc))


def restore_user_values(host: HostPlan) -> None:
    """Put back the user's values of everything the plan sets, which the planning parent
    applied for itself (inherited environment, the nanny's dask config)."""
    import dask.config

    bootstrap.put_env(os.environ, host.user_values.env)
    for key, value in host.user_values.config.items():
        dask.config.set({key: value})


def _remove(path: pathlib.Path, group: pathlib.Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".fatal").unlink(missing_ok=True)
    shutil.rmtree(group, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return True


def reclaim_stale(base: pathlib.Path) -> list[str]:
    """Remove plan files and slot folders whose planning process is gone."""
    removed = []
    for entry in base.iterdir():
        # .*.tmp: a write_atomic temporary file left by a killed process
        name = entry.name[1:] if entry.name.startswith(".") and entry.name.endswith(".tmp") else entry.name
        kind, _, pid = name.split(".")[0].partition("-")
        if kind in ("plan", "pid", "ppid") and pid.isdigit() and not _alive(int(pid)):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed


def _fatal_path() -> pathlib.Path | None:
    plan = os.environ.get(PLAN_ENV)
    return pathlib.Path(plan + ".fatal") if plan else None


def leave_fatal(line: str) -> None:
    """A worker process that stops for gpudask leaves its one line for its planning parent."""
    path = _fatal_path()
    if path is not None:
        try:
            fd = statedir.open_private(path, os.O_WRONLY | os.O_APPEND)
            with os.fdopen(fd, "a") as f:
                f.write(line + "\n")
        except OSError:
            pass


def report_worker_failures() -> None:
    """When the ``dask worker`` process ends on an exception because a worker process stopped
    for gpudask, print that worker's one line instead of distributed's traceback."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        path = _fatal_path()
        text = statedir.read_private(path, "worker failure file") if path is not None else None
        lines = text.splitlines() if text else []
        if not lines:
            previous(kind, value, tb)
            return
        sys.stderr.write(f"Error: {lines[0]}\n")
        sys.stderr.flush()

    sys.excepthook = hook


def sharing_gpus(host: HostPlan) -> tuple[str, str] | None:
    """Other live planning processes of this user on this host whose workers were planned on
    GPUs ``host``'s workers use: ``("pid, pid", "GPU indices")``, or None."""
    mine = {w.gpu for w in host.workers if w.gpu}
    if not mine:
        return None
    others: dict[int, set[str]] = {}
    try:
        entries = list(statedir.state_dir().glob("plan-*.json"))
    except (OSError, GpudaskError):
        return None
    for path in entries:
        pid = path.stem[len("plan-"):]
        if not pid.isdigit() or int(pid) == os.getpid() or not _alive(int(pid)):
            continue
        try:
            data = json.loads(path.read_text())
            if data["facts"]["hostname"] != host.facts.hostname:
                continue
            gpus = {w.get("gpu") for w in data["workers"] if isinstance(w, dict) and w.get("gpu")}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        shared = gpus & mine
        if shared:
            others[int(pid)] = shared
    if not others:
        return None
    shared_all = sorted(set().union(*others.values()))
    indices = sorted(w.gpu_index for w in host.workers if w.gpu in shared_all and w.gpu_index is not None)
    return ", ".join(map(str, sorted(others))), ", ".join(map(str, indices)) or ", ".join(shared_all)


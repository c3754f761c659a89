"""The host plan, handed from the process that planned it to the worker processes it starts.

A planning process (the ``dask worker`` process hosting the nannies, or a client that
starts a ``LocalCluster``) writes its :class:`~gpudask.plan.HostPlan` to a file and names
it in ``$GPUDASK_HOST_PLAN``; its worker processes inherit the variable at spawn, before
any of their code runs, and take their own plan from the file instead of planning again.
Each worker claims its number in ``$GPUDASK_GROUP`` (:func:`gpudask.apply.runtime.worker_index`).

On a host where gpudask decides nothing (a CPU host over tcp) nothing is written and no
variable is exported.  Files and slot folders of processes that died are removed by the
next planning process of the same user.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any

from gpudask.plan import HostPlan, ProcessPlan

PLAN_ENV = "GPUDASK_HOST_PLAN"
GROUP_ENV = "GPUDASK_GROUP"


def state_dir() -> pathlib.Path:
    return pathlib.Path(tempfile.gettempdir()) / f"gpudask-{os.getuid()}"


def publish(host: HostPlan) -> None:
    """Write ``host`` for this process's worker processes (a no-op where nothing was decided)."""
    if not decided_anything(host):
        return
    base = state_dir()
    base.mkdir(parents=True, exist_ok=True)
    reclaim_stale(base)
    path = base / f"plan-{os.getpid()}.json"
    data = host.to_dict()
    data["user_values"] = _user_values(host)
    data["user_config_values"] = _user_config_values(host)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, default=str))
    tmp.replace(path)
    os.environ[PLAN_ENV] = str(path)
    os.environ.setdefault(GROUP_ENV, f"pid-{os.getpid()}")
    atexit.register(_remove, path, base / os.environ[GROUP_ENV])
    path.with_name(path.name + ".fatal").unlink(missing_ok=True)


def decided_anything(host: HostPlan) -> bool:
    """Did gpudask decide anything for this host (a CPU host with tcp: nothing)?"""
    plans = [host.scheduler, host.nanny, host.client, *host.workers]
    return any(p.env or p.config or p.cpu_affinity or p.memory or p.multiprocessing_method or p.resources
               for p in plans)


def _user_values(host: HostPlan) -> dict[str, str | None]:
    """The user's value of every variable any process of the plan sets: a worker puts back
    what its planning parent changed for itself but the worker's plan does not set."""
    names = {n for p in (host.scheduler, host.nanny, host.client, *host.workers) for n in p.env}
    return {n: host.ctx.user_env.get(n) for n in sorted(names)}


def _user_config_values(host: HostPlan) -> dict[str, Any]:
    """The user's value of every dask config key any process of the plan sets."""
    import dask.config

    keys = {k for p in (host.scheduler, host.nanny, host.client, *host.workers) for k in p.config}
    return {k: dask.config.get(k, default=None, config=dict(host.ctx.user_config)) for k in sorted(keys)}


def load() -> HostPlan | None:
    """The host plan this worker process's parent wrote, or None."""
    path = os.environ.get(PLAN_ENV)
    if not path:
        return None
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return None  # the parent is gone or wrote nothing: the worker plans for itself
    return _host_from_dict(data)


def _host_from_dict(data: dict[str, Any]) -> HostPlan:
    import dask.config

    from gpudask.config import Settings, register_defaults
    from gpudask.plan import PlanContext
    from gpudask.facts import facts_from_dict
    from gpudask.manager import PluginManager

    facts = facts_from_dict(data["facts"], data["facts_origin"])
    manager = PluginManager.from_environment()
    options = manager.config_options()
    register_defaults(options)
    env = dict(os.environ)
    settings = Settings(options, config=dask.config.config, environ=env)
    ctx = PlanContext(facts, settings, data["protocol"], data["nworkers"], user_env=env,
                      user_config=dask.config.config, manager=manager)
    host = HostPlan(facts=facts, protocol=data["protocol"], nworkers=data["nworkers"], plugins=data["plugins"],
                    scheduler=ProcessPlan.from_dict(data["scheduler"]), nanny=ProcessPlan.from_dict(data["nanny"]),
                    client=ProcessPlan.from_dict(data["client"]),
                    workers=[ProcessPlan.from_dict(w) for w in data["workers"]], warnings=list(data["warnings"]),
                    ctx=ctx)
    host.user_values = {"env": data.get("user_values", {}),  # type: ignore[attr-defined]
                        "config": data.get("user_config_values", {})}
    return host


def restore_user_values(host: HostPlan) -> None:
    """Put back, in this worker process, the user's values of everything any process of the
    plan sets: the planning parent applied its own part (inherited environment, the nanny's
    dask config) before this process's own plan is applied."""
    import dask.config

    kept = getattr(host, "user_values", {"env": {}, "config": {}})
    for name, value in kept["env"].items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    for key, value in kept["config"].items():
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
        return True
    return True


def reclaim_stale(base: pathlib.Path) -> list[str]:
    """Remove plan files and slot folders whose planning process is gone."""
    removed = []
    for entry in base.iterdir():
        stem = entry.name.split(".")[0]
        for prefix in ("plan-", "pid-", "ppid-"):
            if stem.startswith(prefix) and stem[len(prefix):].isdigit() and not _alive(int(stem[len(prefix):])):
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
            with open(path, "a") as f:
                f.write(line + "\n")
        except OSError:
            pass


def report_worker_failures() -> None:
    """In the ``dask worker`` process: when it ends on an exception because a worker process
    stopped for gpudask, print that worker's one line instead of distributed's traceback."""
    import sys

    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        path = _fatal_path()
        lines = path.read_text().splitlines() if path is not None and path.exists() else []
        if not lines:
            previous(kind, value, tb)
            return
        sys.stderr.write(f"Error: {lines[0]}\n")
        sys.stderr.flush()

    sys.excepthook = hook

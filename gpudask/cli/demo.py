"""`gpudask demo`: a local cluster of stock workers with gpudask, a small workload, the report."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def _gpu_array_module() -> Any:
    """cupy when it is installed *and* a GPU is visible; None otherwise (never creates a context)."""
    from gpudask.facts import get_facts

    if not get_facts().visible_gpus():
        return None
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def _pages(dashboard_link: str | None) -> tuple[str | None, str | None]:
    """(bokeh dashboard, the /gpudask page): both on the scheduler's HTTP server."""
    if not dashboard_link:
        return None, None
    from urllib.parse import urlsplit

    parts = urlsplit(dashboard_link)
    return dashboard_link, f"{parts.scheme}://{parts.netloc}/gpudask"


def _answers(url: str) -> int | None:
    """The HTTP status of ``url`` (None when it does not answer)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None


def _decisions(published: list[dict[str, Any]], n: int, say: Callable[[str], None],
               raw: Callable[[str], None]) -> None:
    """Every plugin's decisions, each said once: those the workers share, or of one plugin or skips
    for the same reason, on one row; a plugin that decided something is not also listed as skipped."""
    from gpudask.cli.report import table

    found: dict[tuple[str, str, str], list[str]] = {}
    for p in published:
        plan = p.get("plan") or {}
        for r in plan.get("reasons", []):
            workers = found.setdefault((r["plugin"], r["decision"], r["why"]), [])
            if str(plan.get("index")) not in workers:
                workers.append(str(plan.get("index")))
    decided = {plugin for plugin, decision, _ in found if decision != "skipped"}
    rows: dict[tuple[str, str], list[list[str]]] = {}  # (workers, why) -> [plugins, decisions]
    for (plugin, decision, why), workers in found.items():
        if decision == "skipped" and plugin in decided:
            continue
        where = "all" if len(workers) == n and n > 1 else ",".join(workers)
        plugins, decisions = rows.setdefault((where, why), [[], []])
        if decision == "skipped" or not plugins or plugins == [plugin]:
            if plugin not in plugins:
                plugins.append(plugin)
            if decision not in decisions:
                decisions.append(decision)
        else:
            rows.setdefault((where, why, plugin), [[plugin], [decision]])  # type: ignore[arg-type]
    lines = [[key[0], ", ".join(plugins), ", ".join(decisions), key[1]] for key, (plugins, decisions) in rows.items()]
    say("What every plugin decided (full reasons: gpudask info --reasons):")
    raw(table(["workers", "plugin", "decision", "why"], lines) if lines else "(no decisions)")
    named = {pl for _, plugins, _, _ in lines for pl in plugins.split(", ")}
    silent = sorted({pl["name"] for p in published for pl in p.get("plugins", [])} - named)
    if silent:
        say(f"plugins with nothing to decide on this host: {', '.join(silent)}")


def run_demo(nworkers: int | None = None, protocol: str = "tcp",
             echo: Callable[[str], None] | None = print, keep: float = 0) -> dict[str, Any]:
    from gpudask.cli.report import table, wrap_text

    raw = echo or (lambda _line: None)  # tables fit the terminal themselves

    def say(line: str) -> None:  # prose wrapped to the terminal between words
        body = line.strip("\n")
        raw(line[:line.index(body)] + wrap_text(body) + line[line.index(body) + len(body):] if body else line)

    import gpudask

    session = gpudask.initialize(protocol=protocol, nworkers=nworkers)
    facts = session.host.facts
    gpus = facts.visible_gpus()
    n = nworkers or (len(gpus) or 2)
    if not gpus:
        say("CPU-only machine: no GPU visible, so the GPU plugins skip (their reasons say so); "
            "the cluster still runs, on NumPy.")
    else:
        say(f"{len(gpus)} GPU(s): " + ", ".join(f"{g.index}: {g.name}" for g in gpus))

    import dask.array as da
    from distributed import Client, LocalCluster

    started = time.perf_counter()
    # free ports for the scheduler and its dashboard: 8786/8787 may belong to a cluster
    # already running here, and a demo should neither fail nor warn because of it
    kwargs = gpudask.cluster_kwargs(n_workers=n, protocol=protocol, scheduler_port=0, dashboard_address=":0")
    with LocalCluster(**kwargs) as cluster, Client(cluster) as client:
        client.wait_for_workers(n, timeout=120)
        ready = time.perf_counter() - started
        scheduler = cluster.scheduler_address
        dashboard, page = _pages(cluster.dashboard_link)
        page_status = _answers(page) if page else None
        import importlib.util

        has_bokeh = importlib.util.find_spec("bokeh") is not None
        say(f"\nscheduler {scheduler}, running now:")
        if page:
            say(f"  {page}  gpudask's page: every worker's GPU, plan and what took effect"
                + ("" if page_status == 200 else f" (it did not answer: {page_status})"))
        if dashboard:
            say(f"  {dashboard}  dask's dashboard" + ("" if has_bokeh else
                                                     " -- needs bokeh, not installed here: pip install bokeh"))
        xp = _gpu_array_module()
        shape, chunks = (4000, 4000), 1000
        x = da.random.random(shape, chunks=chunks)
        if xp is not None:
            x = x.map_blocks(xp.asarray)
        t0 = time.perf_counter()
        total = float((x + x.T).sum().compute())
        rechunked = float(x.rechunk((4000, 250)).sum().compute())  # P2P by default: see gpu-dask-defaults
        compute = time.perf_counter() - t0
        workers = client.scheduler_info(n_workers=-1)["workers"]
        published = sorted((w.get("gpudask") or {} for w in workers.values()),
                           key=lambda p: (p.get("plan") or {}).get("index") or 0)
        backend = "CuPy" if xp is not None else "NumPy"
        say(f"\n{n} stock dask worker(s) with gpudask ready in {ready:.1f} s; "
            f"(x + x.T).sum() and a rechunk of a {shape[0]}x{shape[1]} {backend} array in {compute:.2f} s "
            f"(sum {total:.1f}, {rechunked:.1f})\n")
        _decisions(published, n, say, raw)
        if keep > 0:
            say(f"\nthe cluster stays up {keep:g} s (--keep {keep:g}) at the pages above; Ctrl-C closes it")
            try:
                time.sleep(keep)
            except KeyboardInterrupt:
                pass
    say("cluster closed (its pages with it" + ("" if keep > 0 else
                                             "; `gpudask demo --keep 60` keeps it up a minute to look") + ")")
    return {"workers": n, "scheduler": scheduler, "dashboard": dashboard, "gpudask_page": page,
            "gpudask_page_status": page_status, "bokeh": has_bokeh, "backend": backend, "ready_s": ready,
            "compute_s": compute, "sum": total, "published": published}

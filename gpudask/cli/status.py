"""``gpudask status``: one row per worker, its plan against its *applied state*
(:mod:`gpudask.apply.state`); a difference is a *mismatch*, a field of the wrong shape a ``warning:``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpudask.plan import cpu_ranges
from gpudask.printable import printable

_MAX_CELL = 120  # characters of one published value shown in a cell or a mismatch line

LEGEND = ("planned -> actual; visible GPUs: CUDA_VISIBLE_DEVICES; '!': a mismatch (the plan did not take effect, see the error lines); "
          "'not set': gpudask leaves it as it is (what the process has in brackets)")


def escaped(value: Any, limit: int = _MAX_CELL) -> str:
    """``value`` as printable text (``\\x1b``, ``\\n``), cut to ``limit`` characters."""
    text = value if isinstance(value, str) else str(value)
    out = printable(text[:limit + 1])
    return out[:limit - 1] + "…" if len(text) > limit or len(out) > limit else out


def _ranges(cpus: Any) -> str:
    """[0, 1, 2, 5] -> '0-2,5'; a list that is not of CPU numbers raises ValueError."""
    if not cpus:
        return "-"
    if not isinstance(cpus, (list, tuple)) or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                                                      for c in cpus):
        raise ValueError("not a list of CPU numbers")
    return cpu_ranges(sorted(set(cpus)))


def _gib(n: Any) -> str:
    if isinstance(n, (int, float)) and not isinstance(n, bool) and n == n:
        return f"{n / 2**30:.1f} GiB"
    return escaped(n)


def _mapping(source: Mapping[str, Any], key: str, where: str, problems: list[str]) -> dict[str, Any]:
    value = source.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(f"{where}{key} is a {type(value).__name__}, not a mapping: ignored")
        return {}
    return dict(value)


def _mismatches(published: Mapping[str, Any], problems: list[str]) -> list[dict[str, Any]]:
    raw = published.get("mismatches")
    if raw is None:
        return []
    if not isinstance(raw, (list, tuple)):  # msgpack hands lists over as tuples
        problems.append(f"mismatches is a {type(raw).__name__}, not a list: ignored")
        return []
    out = []
    for n, m in enumerate(raw):
        if not isinstance(m, Mapping) or not isinstance(m.get("key"), str):
            problems.append(f"mismatches[{n}] is not a mapping with a string 'key': ignored")
            continue
        out.append({k: m.get(k) for k in ("process", "key", "planned", "actual", "plugin")})
    return out


def _plugin_columns(plan: Mapping[str, Any], published: Mapping[str, Any], manager: Any,
                    problems: list[str]) -> dict[str, dict[str, Any]]:
    """The plugins' columns (``gpudask_report_rows``)."""
    rows, failed = manager.report_rows(plan, published)
    problems.extend(failed)
    return {r["column"]: {"planned": r.get("planned"), "actual": r.get("actual"), "note": r.get("note"),
                          "bytes": bool(r.get("bytes")), "keys": tuple(str(k) for k in r.get("keys") or ()),
                          "plugin": r["plugin"]}
            for r in rows}


def worker_row(address: str, info: Any, manager: Any = None) -> dict[str, Any]:
    """One worker, planned and actual, from what it published; ``problems``: each field of the wrong
    shape.  ``manager`` (whose plugins supply columns): loaded when not given."""
    if manager is None:
        from gpudask import bootstrap

        manager = bootstrap.manager()
    problems: list[str] = []
    published: Any = info.get("gpudask") if isinstance(info, Mapping) else None
    if published is not None and not isinstance(published, Mapping):
        problems.append(f"gpudask is a {type(published).__name__}, not a mapping: ignored")
        published = {}
    published = dict(published or {})
    plan = _mapping(published, "plan", "", problems)
    applied = _mapping(published, "applied", "", problems)
    ucx = _mapping(applied, "ucx", "applied.", problems)
    context = _mapping(applied, "cuda_context", "applied.", problems)
    env = _mapping(applied, "env", "applied.", problems)
    plan_env = _mapping(plan, "env", "plan.", problems)
    _mapping(plan, "sections", "plan.", problems)
    cpus = {"planned": plan.get("cpu_affinity"), "actual": applied.get("cpu_affinity")}
    for side, value in list(cpus.items()):
        try:
            _ranges(value)
        except ValueError as e:
            problems.append(f"{'plan' if side == 'planned' else 'applied'}.cpu_affinity {escaped(repr(value), 40)} is {e}: "
                            "ignored")
            cpus[side] = None
    index = plan.get("index")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
        problems.append(f"plan.index is a {type(index).__name__}, not an integer: ignored")
        index = None
    return {
        "worker": address,
        "index": index,
        "gpudask": bool(published),
        "gpu": {"planned": plan.get("gpu"), "actual": context.get("uuid") if context.get("exists") else None},
        "cuda_visible_devices": {"planned": plan.get("cuda_visible_devices"), "actual": env.get("CUDA_VISIBLE_DEVICES")},
        "transports": {"planned": plan_env.get("UCX_TLS"), "actual": ucx.get("TLS")},
        "columns": _plugin_columns(plan, published, manager, problems) if published else {},
        "plugins_state": applied.get("plugins") if isinstance(applied.get("plugins"), Mapping) else {},
        "cpu_affinity": cpus,
        "start_method": {"planned": plan.get("multiprocessing_method"),
                         "actual": applied.get("multiprocessing_method")},
        "mismatches": _mismatches(published, problems),
        "problems": problems,
    }


def cluster_status(client: Any) -> dict[str, Any]:
    """Every worker's row, the number of mismatches and of malformed published fields."""
    info = client.scheduler_info(n_workers=-1)
    from gpudask import bootstrap

    manager = bootstrap.manager()  # this process's plugins, gpudask.toml read: their report columns
    rows = [worker_row(str(a), w, manager) for a, w in sorted(info["workers"].items())]
    return {"scheduler": info.get("address"), "workers": rows,
            "mismatches": sum(len(r["mismatches"]) for r in rows),
            "problems": sum(len(r["problems"]) for r in rows)}


# the mismatch keys (gpudask.apply.state.compare) each of the core's columns shows; a
# plugin's column names its own (its report rows' ``keys``)
_COLUMN_KEYS = {"gpu": ("cuda_context",), "cuda_visible_devices": ("CUDA_VISIBLE_DEVICES",),
                "transports": ("ucx TLS", "UCX_TLS"), "cpu_affinity": ("cpu_affinity",),
                "start_method": ("multiprocessing_method",)}


def _pair(row: dict[str, Any], column: str, show: Any = escaped) -> str:
    d = row[column]
    return _shown_pair(d, any(m["key"] in _COLUMN_KEYS[column] for m in row["mismatches"]), show)


def _plugin_pair(row: dict[str, Any], column: str) -> str:
    d = row["columns"].get(column)
    if d is None:
        return "-"
    return _shown_pair(d, any(m["key"] in d["keys"] for m in row["mismatches"]), _gib if d["bytes"] else escaped)


def _shown_pair(d: Mapping[str, Any], mismatch: bool, show: Any) -> str:
    planned, actual = d.get("planned"), d.get("actual")
    if planned is None:
        return "-" if actual is None else f"not set ({show(actual)})"
    if d.get("note"):
        return f"{show(planned)} (not in place: {escaped(d['note'], 60)})"
    if actual is None or planned == actual:
        return show(planned)
    return f"{show(planned)} -> {show(actual)}" + ("!" if mismatch else "")


def short_uuids(uuids: list[str]) -> dict[str, str]:
    """GPU UUIDs shortened, each still told apart: ``GPU-3f2a…9c1e``, the first four hex digits and
    as many of the last (at least four) as tell it apart."""
    whole = sorted({u for u in uuids if u})
    out = {}
    for u in whole:
        head, _, rest = u.partition("-")
        if len(u) <= 16 or not rest:
            out[u] = u
            continue
        others = [o for o in whole if o != u]
        for n in range(4, len(rest) + 1):
            tail, start = rest[-n:], f"{head}-{rest[:4]}"
            if not any(o.startswith(start) and o.endswith(tail) for o in others):
                break
        out[u] = u if len(start) + 1 + len(tail) >= len(u) else f"{start}…{tail}"
    return out


def _gpu(row: dict[str, Any], short: Mapping[str, str]) -> str:
    gpu = row["gpu"]
    planned, actual = gpu.get("planned"), gpu.get("actual")
    shown = escaped(short.get(planned, planned), 48) if planned else "-"
    if actual is None or actual == planned:
        return shown
    mismatch = any(m["key"] == "cuda_context" for m in row["mismatches"])
    return f"{shown} -> {escaped(short.get(actual, actual), 48)}" + ("!" if mismatch else "")


def format_status(status: dict[str, Any], table: Any, width: int | None = -1) -> str:
    """The readable form of :func:`cluster_status`, fitting ``width`` (-1: the terminal's)."""
    plugin_columns: list[str] = []  # the plugins' columns, in the order they first appear
    for r in status["workers"]:
        plugin_columns += [c for c in r.get("columns") or {} if c not in plugin_columns]
    headers = ["worker", "#", "gpu", "visible GPUs", "UCX_TLS", *(escaped(c, 20) for c in plugin_columns), "cpus",
               "start", "ok"]
    rows = []
    short = short_uuids([str(u) for r in status["workers"] if r["gpudask"]
                         for u in (r["gpu"].get("planned"), r["gpu"].get("actual")) if isinstance(u, str)])
    for r in status["workers"]:
        name = escaped(r["worker"])
        if not r["gpudask"]:
            rows.append([name, "-", "no gpudask in this worker", "", "", *("" for _ in plugin_columns), "", "", "?"])
            continue
        cells = [_gpu(r, short), _pair(r, "cuda_visible_devices"), _pair(r, "transports"),
                 *(_plugin_pair(r, c) for c in plugin_columns),
                 _pair(r, "cpu_affinity", _ranges), _pair(r, "start_method")]
        ok = (f"{len(r['mismatches'])} mismatch(es)" if r["mismatches"]
              else f"{len(r['problems'])} malformed" if r["problems"] else "yes")
        rows.append([name, "-" if r["index"] is None else r["index"], *cells, ok])
    from gpudask.textwidth import wrap_text

    # a column no worker has a value in (UCX_TLS over tcp) says nothing: left out; one every
    # worker has the same value in is said once, above the table
    empty = [k for k in range(2, len(headers)) if all(row[k] in ("-", "") for row in rows)]
    same = [k for k in range(2, len(headers)) if k not in empty and len(rows) > 1
            and len({str(row[k]) for row in rows}) == 1]
    shared = ", ".join(f"{headers[k]} {rows[0][k]}" for k in same)
    headers = [h for k, h in enumerate(headers) if k not in empty + same]
    rows = [[c for k, c in enumerate(row) if k not in empty + same] for row in rows]
    lines = [wrap_text(f"scheduler {escaped(status['scheduler'])}: {len(status['workers'])} worker(s)"
                       + (f"; every worker: {shared}" if shared else ""), width)]
    lines += [table(headers, rows), wrap_text(LEGEND, width)]
    for r in status["workers"]:
        for m in r["mismatches"]:
            lines.append(wrap_text(f"error: {escaped(r['worker'])} ({escaped(m['process'])}): {escaped(m['key'])} is "
                                   f"{escaped(repr(m['actual']))}, planned {escaped(repr(m['planned']))} "
                                   f"(plugin {escaped(m['plugin'] or 'gpudask')})", width))
        for p in r["problems"]:
            lines.append(wrap_text(f"warning: {escaped(r['worker'])} published a malformed field: {escaped(p, 200)}", width))
    return "\n".join(lines)

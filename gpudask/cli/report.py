"""Readable tables of plans and plugins (the CLI's non-JSON output), fitting the terminal: a cell
too wide wraps inside its column; to a pipe or a file, lines stay whole unless ``COLUMNS`` is set.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from gpudask.plan import HostPlan, ProcessPlan, cpu_ranges as _cpu_ranges
from gpudask.printable import printable
from gpudask.textwidth import terminal_width, wrap_text

_GAP = "  "
_MIN_COLUMN = 6  # narrower than this a column is unreadable: the table overflows instead
_WHOLE_WORD = 24  # a word up to this long is never cut
_BREAK = re.compile(r"(?<=[ ,;:/_=|-])")  # a cell may wrap after any of these


def _unbreakable(word: str) -> bool:
    """An address (``tcp://10.0.0.1:8786``) or a variable's name (``$DASK_...``): never cut."""
    return "://" in word or word.startswith("$")


def _pieces(text: str) -> list[str]:
    """``text`` cut where a cell may wrap: between words; inside a long word (a path) after a
    colon, slash, dash ..., never inside an address nor a name (``scheduler-parity``)."""
    return [piece for word in re.split(r"(?<=[ ,])", text)
            for piece in ([word] if _unbreakable(word) or len(word.rstrip(" ,")) <= _WHOLE_WORD
                          else _BREAK.split(word)) if piece]


def _wrap_cell(text: str, width: int) -> list[str]:
    if len(text) <= width:
        return [text]
    lines: list[str] = []
    line = ""
    for piece in _pieces(text):
        if len(line) + len(piece.rstrip()) > width and line:
            lines.append(line.rstrip())
            line = ""
        while len(piece.rstrip()) > width:  # one word wider than the column: cut it, carry on below
            lines.append(piece[:width])
            piece = piece[width:]
        line += piece
    if line.strip():
        lines.append(line.rstrip())
    return lines


def _fit(cells: list[list[str]], width: int | None) -> list[int]:
    """Column widths for a table no wider than ``width``: each step narrows the column (by as much)
    as costs the fewest extra lines per character saved."""
    natural = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    budget = None if width is None else width - len(_GAP) * (len(natural) - 1)
    if budget is None or sum(natural) <= budget:
        return natural
    # no column narrower than its longest word, nor (unless it is by nature) than _MIN_COLUMN;
    # when the longest words of all columns are wider than the terminal, the longest are cut first
    floors = [min(n, max(_MIN_COLUMN, max([len(piece.rstrip()) for r in cells for piece in _pieces(r[i])] or [0])))
              for i, n in enumerate(natural)]
    # an address or a variable's name is never cut: its column keeps its width, the table overflows
    keep = [max([len(piece.rstrip()) for r in cells for piece in _pieces(r[i]) if _unbreakable(piece)] or [0])
            for i in range(len(natural))]
    while sum(floors) > budget and any(f > max(_MIN_COLUMN, k) for f, k in zip(floors, keep)):
        cuttable = [f if f > max(_MIN_COLUMN, k) else 0 for f, k in zip(floors, keep)]
        floors[cuttable.index(max(cuttable))] -= 1
    lines = [{w: [len(_wrap_cell(row[i], w)) for row in cells] for w in range(min(floors[i], n), n + 1)}
             for i, n in enumerate(natural)]

    def height(widths: list[int]) -> int:
        return sum(max(lines[i][w][r] for i, w in enumerate(widths)) for r in range(len(cells)))

    widths = list(natural)
    while sum(widths) > budget:
        need, now = sum(widths) - budget, height(widths)
        moves = []
        for i, w in enumerate(widths):
            for narrower in range(max(floors[i], w - need), w):
                cost = height(widths[:i] + [narrower] + widths[i + 1:]) - now
                moves.append((cost / (w - narrower), -(w - narrower), i, narrower))
        if not moves:
            break  # every column at its narrowest: the table overflows rather than lose text
        _, _, i, narrower = min(moves)
        widths[i] = narrower
    return widths


def table(headers: list[str], rows: list[list[Any]], width: int | None = -1) -> str:
    """A plain-text table; ``width`` -1: the terminal's."""
    if width == -1:
        width = terminal_width()
    # a cell may hold what another process published: escaped, never sent to the terminal raw
    cells = [[printable(c) for c in headers]] + [["" if c is None else printable(c) for c in row] for row in rows]
    widths = _fit(cells, width)
    lines = []
    for n, row in enumerate(cells):
        wrapped = [_wrap_cell(c, w) for c, w in zip(row, widths)]
        for k in range(max(len(parts) for parts in wrapped)):
            lines.append(_GAP.join((parts[k] if k < len(parts) else "").ljust(w)
                                   for parts, w in zip(wrapped, widths)).rstrip())
        if n == 0:
            lines.append(_GAP.join("-" * w for w in widths))
    return "\n".join(lines)


def _memory(plan: ProcessPlan, host: HostPlan) -> str:
    """The plugins' short forms of their decisions for this process (the rmm pool), or ``-``."""
    manager = getattr(host.ctx, "manager", None)
    if manager is None or not plan.sections:
        return "-"
    rows, _ = manager.report_rows(plan.to_dict(), None)
    return ", ".join(r["summary"] for r in rows if r.get("summary")) or "-"


def _facts_words(host: HostPlan) -> str:
    """The plugins' words on their facts sections, each after a comma."""
    manager = getattr(host.ctx, "manager", None)
    if manager is None:
        return ""
    from gpudask.facts.sections import summaries

    return "".join(f", {text}" for text in summaries(host.facts, manager.facts_sections()))


def _host(host: HostPlan) -> str:
    facts = host.facts
    return (f"host {facts.hostname} ({'described by ' + facts.origin if facts.described else 'probed'}): "
            f"{len(facts.visible_gpus())} visible GPU(s)")


def _header(host: HostPlan) -> list[str]:
    gpus = host.facts.visible_gpus()
    head = [f"{_host(host)}, driver {host.facts.driver_version or 'none'}{_facts_words(host)}",
            f"protocol {host.protocol}, {host.nworkers} worker(s); plugins: "
            + ", ".join(f"{p['name']}({p['priority']})" for p in host.plugins)]
    if not gpus:
        head.append("no GPU visible: GPU plugins skip (see reasons)")
    return head


# columns of the worker table: header, the value for one worker, and the prefixes of the
# changes it shows (those are left out of the list of changes under it)
_WORKER_COLUMNS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("gpu", lambda w, h: w.gpu_index if w.gpu_index is not None else "-", ()),
    ("CUDA_VISIBLE_DEVICES", lambda w, h: w.cuda_visible_devices or "-", ("CUDA_VISIBLE_DEVICES=",)),
    ("UCX_TLS", lambda w, h: w.env.get("UCX_TLS", "-"), ("UCX_TLS=",)),
    ("UCX_NET_DEVICES", lambda w, h: w.env.get("UCX_NET_DEVICES", "-"), ("UCX_NET_DEVICES=",)),
    ("interface", lambda w, h: w.interface or "-", ("interface=",)),
    ("cpus", lambda w, h: _cpu_ranges(w.cpu_affinity) if w.cpu_affinity else "-", ("cpu_affinity=",)),
    ("memory", _memory, ("memory ",)),
    ("start", lambda w, h: w.multiprocessing_method or "-", ("multiprocessing_method=",)),
]


_Column = tuple[str, list[str], tuple[str, ...]]


def _table_columns(host: HostPlan) -> tuple[list[_Column], list[_Column]]:
    """The columns worth one (the GPU, what differs between workers, all that is set for a single
    worker), and the others (the same in every worker)."""
    columns = [(name, [str(value(w, host)) for w in host.workers], prefixes) for name, value, prefixes in _WORKER_COLUMNS]
    single = len(host.workers) == 1
    shown = [c for c in columns if c[0] == "gpu" or len(set(c[1])) > 1 or (single and c[1][0] != "-")]
    return shown, [c for c in columns if c not in shown and host.workers]


def _worker_table(host: HostPlan, width: int | None) -> str:
    columns, _ = _table_columns(host)
    rows = [[w.index, *(v[k] for _, v, _ in columns)] for k, w in enumerate(host.workers)]
    return table(["worker", *(n for n, _, _ in columns)], rows, width)


def _changes(plan: ProcessPlan, host: HostPlan, user_env: Any, user_config: Any) -> list[tuple[str, str]]:
    """(decision, plugin) for what this process does differently from stock dask in the same
    environment and dask config; notes that change nothing are left to --reasons."""
    import dask.config

    settings = ("CUDA_VISIBLE_DEVICES=", "interface=", "cpu_affinity=", "multiprocessing_method=", "memory:",
                "resource ")
    stock_config = dask.config.merge(*dask.config.defaults, dict(user_config))
    final = {f"{k}={v}" for k, v in plan.env.items() if user_env.get(k) != v}
    final |= {f"{k}={v!r}" for k, v in plan.config.items() if dask.config.get(k, None, config=stock_config) != v}
    seen: dict[str, str] = {}
    for r in plan.reasons:
        if r.decision.startswith("memory:"):
            if plan.sections:  # named in bytes in the decision: the plugins' short forms read better
                seen.setdefault(f"memory {_memory(plan, host)}", r.plugin)
        elif r.decision in final or r.decision.startswith(settings):
            seen.setdefault(r.decision, r.plugin)
    return list(seen.items())


def _where(roles: list[str], nworkers: int) -> str:
    workers = sorted(int(r.split()[1]) for r in roles if r.startswith("worker "))
    named: list[str] = [r for r in ("scheduler", "nanny", "client") if r in roles]
    if workers and len(workers) == nworkers:
        named.append("workers" if nworkers > 1 else "worker")
    elif workers:
        named.append("worker " + ",".join(map(str, workers)))
    groups = ["scheduler", "nanny", "client", "workers" if nworkers > 1 else "worker"]
    if len(named) == 4:
        return "all"
    if len(named) == 3 and all(n in groups for n in named):  # shorter, so the setting column keeps its width
        return "all but " + next(g for g in groups if g not in named)
    return ", ".join(named)


def _changes_table(host: HostPlan, width: int | None) -> str:
    ctx = host.ctx
    user_env = getattr(ctx, "user_env", {}) or {}
    user_config = getattr(ctx, "user_config", {}) or {}
    shown_in_table = tuple(p for _, _, prefixes in _table_columns(host)[0] for p in prefixes)
    found: dict[str, tuple[list[str], list[str]]] = {}  # decision -> (processes, plugins)
    for title, plan in _processes(host):
        for decision, plugin in _changes(plan, host, user_env, user_config):
            if plan.role == "worker" and decision.startswith(shown_in_table):
                continue
            where, plugins = found.setdefault(decision, ([], []))
            where.append(title)
            if plugin not in plugins:
                plugins.append(plugin)
    if not found:
        return "nothing differs from stock dask here (gpudask info --reasons says why)"
    rows = [[decision, _where(where, host.nworkers), ", ".join(plugins)]
            for decision, (where, plugins) in found.items()]
    return ("What differs from stock dask (why: gpudask info --reasons):\n"
            + table(["setting", "processes", "plugin"], rows, width))


def _processes(host: HostPlan) -> list[tuple[str, ProcessPlan]]:
    """Every process of the plan, with its title (``worker 2``)."""
    return [(p.role + (f" {p.index}" if p.index is not None else ""), p)
            for p in [host.scheduler, host.nanny, host.client, *host.workers]]


def worker_command(host: HostPlan, interface: str | None = None) -> list[str]:
    """The stock command lines that start this host's part of a cluster with gpudask."""
    scheduler = f"{host.protocol}://SCHEDULER:8786"
    # one thread per GPU worker, as dask-cuda (stock's default is CPUs / workers)
    threads = " --nthreads 1" if host.facts.visible_gpus() else ""
    worker = f"dask worker {scheduler} --nworkers {host.nworkers}{threads} --preload gpudask"
    if interface:
        worker += f" --interface {interface}"
    return [f"dask scheduler --protocol {host.protocol} --preload gpudask", worker]


def display_warnings(host: HostPlan) -> list[str]:
    """The plan's warnings, and GPUs the planned workers leave idle."""
    gpus = len(host.facts.visible_gpus())
    idle = [] if not gpus or host.nworkers >= gpus or host.nworkers == 0 else [
        f"{host.nworkers} worker(s) on a host with {gpus} visible GPU(s): {gpus - host.nworkers} GPU(s) stay idle; "
        f"--nworkers {gpus} gives one worker per GPU"]
    return list(host.warnings) + idle


def plan_summary(host: HostPlan, interface: str | None = None, width: int | None = -1) -> str:
    """The short answer: host, one table of workers, what differs from stock, the command lines."""
    head = [_host(host), f"driver {host.facts.driver_version or 'none'}{_facts_words(host)}; protocol "
            f"{host.protocol}, {host.nworkers} worker(s)"]
    if not host.facts.visible_gpus():
        head.append("no GPU visible: the GPU plugins skip (gpudask info --reasons says why)")
    out = [wrap_text("\n".join(head), width), "", _worker_table(host, width), "", _changes_table(host, width), "",
           wrap_text("Start it (SCHEDULER: the scheduler's host):", width)]
    out += ["  " + line for line in worker_command(host, interface)]  # never wrapped: they are copied whole
    out += [wrap_text(f"warning: {w}", width) for w in display_warnings(host)]
    return "\n".join(out)


_SIDE_ROLES = ("scheduler", "nanny", "client")

# Saying a thing once for several processes: the same reason in every worker but for its own
# GPU's number, UUID, CPUs or port (one templated line, ``N`` for the worker's number, ``…`` for
# its own value), or in the scheduler and the client but for naming themselves.
_UUID = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


def shape(text: str) -> str:
    """``text`` with its numbers and UUIDs blanked: two workers' reasons of the same shape are
    one rule applied to each worker's own GPU, CPUs or port."""
    return re.sub(r"[0-9a-f]*\d[0-9a-f]*", "#", _UUID.sub("#", text))


def _by_word(texts: list[str], merged: Callable[[list[str], str, list[str], str], None]) -> str:
    """``texts`` word by word: a word they share as it is; where they differ, ``merged(out, head,
    middles, tail)`` adds what stands for them (``head``, ``tail``: :func:`common_edge`)."""
    split = [t.split(" ") for t in texts]
    out: list[str] = []
    for k, word in enumerate(split[0]):
        words = [s[k] for s in split]
        if len(set(words)) == 1:
            out.append(word)
            continue
        head = common_edge(words, front=True)
        tail = common_edge([w[len(head):] for w in words], front=False)
        merged(out, head, [w[len(head):len(w) - len(tail)] for w in words], tail)
    return " ".join(out)


def template(texts: list[str], numbers: list[str]) -> str:
    """One text for several of the same shape (:func:`shape`): a word where they differ is
    ``N`` when each has its own worker number there, else ``…`` inside what they share of it
    (``GPU-…),``); a run of such words (a list of peers) is one ``…``."""
    def merged(out: list[str], head: str, middles: list[str], tail: str) -> None:
        placeholder = head + ("N" if middles == numbers else "…") + tail
        if placeholder.strip(",;") == "…" and out and out[-1].strip(",;") == "…":
            out[-1] = placeholder  # "peers 1, 2, 3" -> "peers …"
        else:
            out.append(placeholder)

    return _by_word(texts, merged)


def common_edge(texts: list[str], front: bool) -> str:
    """What ``texts`` share at their start (``front``) or end, never splitting a word: ``GPU-``
    of two UUIDs, ``),`` at an end."""
    shared = ""
    for chars in zip(*(t if front else t[::-1] for t in texts)):
        if len(set(chars)) > 1:
            break
        shared += chars[0]
    while shared and shared[-1].isalnum():
        shared = shared[:-1]
    return shared if front else shared[::-1]


def template_roles(texts: list[str], roles: list[str]) -> str:
    """One text for the same reason in several processes that differ only by naming their own
    role (``the scheduler mapped`` / ``the client mapped``): ``the scheduler/client mapped``."""
    return _by_word(texts, lambda out, head, middles, tail: out.append(head + "/".join(middles) + tail))



def _short_uuids_in(text: str, host: HostPlan) -> str:
    """The host's GPU UUIDs in ``text`` shortened as ``gpudask status`` shows them."""
    from gpudask.cli.status import short_uuids

    short = short_uuids([g.uuid for g in host.facts.gpus if g.uuid])
    return re.sub(r"(?:GPU|MIG)-[0-9a-fA-F-]{8,}", lambda m: short.get(m.group(0), m.group(0)), text)


def plan_table(host: HostPlan, interface: str | None = None, width: int | None = -1) -> str:
    """Every process's settings and decisions with their reasons, each said once under the
    processes that share it (:func:`template`, :func:`template_roles`)."""
    out = [wrap_text("\n".join(_header(host)), width), "", _worker_table(host, width)]
    shared = _table_columns(host)[1]
    if shared and len(host.workers) > 1:
        out += ["", wrap_text("Every worker: " + ", ".join(f"{name} {values[0]}" for name, values, _ in shared),
                              width, indent="    ")]
    processes = _processes(host)
    titles = [t for t, _ in processes]
    holders: dict[tuple[str, ...], list[str]] = {}
    for title, plan in processes:
        items: list[tuple[str, ...]] = [("set", k, v) for k, v in {**plan.env, **{k: repr(v) for k, v in plan.config.items()}}.items()]
        for item in items + [("why", r.plugin, r.decision, r.why) for r in plan.reasons]:
            holders.setdefault(item, []).append(title)
    decided = {title: {r.decision for r in plan.reasons} for title, plan in processes}
    workers = {f"worker {w.index}": str(w.index) for w in host.workers}
    every_worker = tuple(workers)
    extra_groups: dict[tuple[str, ...], list[tuple[str, ...]]] = {}

    def merge(kind: str, members: list[str], shape: Any, template: Any) -> None:
        """Items of the same shape held one each by several of ``members``: one templated item."""
        alike: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}
        for item, where in holders.items():
            held = [t for t in where if t in members]
            if kind == "worker" and len(held) == len(where) == len(members):
                continue  # every worker holds it as it is: said so under "every worker"
            key = (item[0], item[1], *(shape(text) for text in item[2:]))
            for title in held:
                alike.setdefault(key, {}).setdefault(title, item)
        for key, by_title in alike.items():
            if len(by_title) < 2 or len(set(by_title.values())) < 2:
                continue
            if kind == "worker" and len(by_title) < len(members):
                continue  # only a rule every worker applies is said once for them all
            names, items = list(by_title), list(by_title.values())
            values = [workers[t] for t in names] if kind == "worker" else names
            merged = (key[0], key[1], *(template([i[n] for i in items], values) for n in range(2, len(key))))
            extra_groups.setdefault(tuple(names), []).append(merged)
            for title, item in by_title.items():
                holders[item].remove(title)
            for title, item in by_title.items():
                if kind == "worker" and holders[item] and item[0] == "why":
                    # another process decided the same for the same GPU: named, its reason is the rule's
                    extra_groups.setdefault(tuple(holders[item]), []).append(
                        ("same", item[1], item[2], f"as {title}'s (every worker's below)"))
                    holders[item] = []

    if len(workers) > 1:
        merge("worker", list(workers), shape, template)
    roles = [t for t in titles if t in _SIDE_ROLES]
    merge("role", roles, lambda text: re.sub(r"\b(?:%s)\b" % "|".join(_SIDE_ROLES), "#", text), template_roles)
    groups: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    for item, where in holders.items():
        if where:
            groups.setdefault(tuple(where), []).append(item)
    for where, items in extra_groups.items():
        groups.setdefault(where, []).extend(items)
    for where in sorted(groups, key=lambda where: (titles.index(where[0]), -len(where))):
        name = _where(list(where), host.nworkers)
        name = {"all": "every process", "workers": f"every worker ({host.nworkers})"}.get(name, name)
        items = groups[where]
        if where == every_worker and any("N" in i[2:] or "…" in " ".join(i[2:]) for i in items if i[0] == "why"):
            name += " (N: its number, …: its own value)"
        # a setting is named on the heading unless each process holding it has a decision saying it
        extra = " ".join(f"{item[1]}={item[2]}" for item in items
                         if item[0] == "set" and not all(f"{item[1]}={item[2]}" in decided[t] for t in where))
        out.append("")
        out.append(wrap_text(f"{name}:" + (f"  {extra}" if extra else ""), width, indent="    "))
        # decisions of one plugin for the same reason: one line (the RMM pool keys of both packages)
        why: dict[tuple[str, str], list[str]] = {}
        for item in items:
            if item[0] in ("why", "same"):
                why.setdefault((item[1], item[3]), []).append(item[2])
        for (plugin, reason), decisions in why.items():
            out.append(wrap_text(_short_uuids_in(f"  [{plugin}] {', '.join(decisions)} -- {reason}", host), width,
                                 indent="    "))
    for title, plan in processes:
        if not plan.reasons and not plan.env and not plan.config:
            out += ["", f"{title}:", "  (no decisions)"]
    out += ["", "Start it:", *("  " + line for line in worker_command(host, interface))]
    for warning in display_warnings(host):
        out.append("\n" + wrap_text(f"warning: {warning}", width))
    return "\n".join(out)

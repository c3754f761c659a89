"""The client side of the scheduler check: ``gpudask.check(client)`` and ``gpudask check``.

The scheduler's report, plus this client compared with the scheduler and each worker: the
client deserialises what it gathers, so it should match them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from dask.utils import parse_bytes
from distributed import Client, get_client
from distributed.comm.addressing import parse_address, parse_host_port
from distributed.comm.core import connect
from distributed.security import Security

from gpudask.checks.runner import plan_here, report_on_scheduler
from gpudask.checks.sides import SEVERITIES, dedupe, local_side, run_hooks, scheme, side_from_published, summary
from gpudask.errors import GpudaskError
from gpudask.findings import Finding, worst
from gpudask.plan import cpu_ranges
from gpudask.printable import printable
from gpudask.textwidth import wrap_text

ADDRESS_FORMS = "tcp://HOST:PORT, ucx://HOST:PORT, HOST:PORT, or --scheduler-file FILE"


def _fetch_scheduler_report(client: Any) -> dict[str, Any]:
    try:
        return client.run_on_scheduler(report_on_scheduler)
    except Exception as first:  # noqa: BLE001
        # pickled functions refused (distributed.scheduler.pickle: false)? the handler
        # of an installed check needs no pickle
        try:
            return client.sync(client.scheduler.gpudask_check, sides=True)
        except Exception:  # noqa: BLE001
            raise first from None


def run_check(client: Any = None, extra_plugins: Iterable[Any] = (),
              here: tuple[Any, Any, Any] | None = None) -> dict[str, Any]:
    """The report of the scheduler check, with this client compared too; ``report["status"]``:
    ``"ok"``, ``"info"``, ``"warning"`` or ``"error"``.

    :param client: default: the current client.
    :param extra_plugins: gpudask plugin objects whose checks run here too.
    :param here: ``(manager, ctx, facts)`` of this process; default: :func:`plan_here`.
    """
    if client is None:
        client = get_client()
    try:
        remote = _fetch_scheduler_report(client)
    except Exception as e:  # noqa: BLE001 - e.g. gpudask not installed on the scheduler
        remote = {"installed": False, "action": None, "scheduler": {"address": client.scheduler.address},
                  "problem": f"the scheduler could not run gpudask's check ({type(e).__name__}: {e}); "
                             f"is gpudask installed there?", "workers": {}, "refused": {}, "findings": [],
                  "sides": {"scheduler": None, "workers": {}}}
    return with_client(remote, client.scheduler.address, here, extra_plugins)


def with_client(remote: dict[str, Any], scheduler_address: str, here: tuple[Any, Any, Any] | None = None,
                extra_plugins: Iterable[Any] = ()) -> dict[str, Any]:
    """The scheduler's report (``remote``, with its ``sides``) completed with this client's
    comparisons: what :func:`run_check` returns."""
    findings: list[Finding] = []
    sides = remote.pop("sides", None) or {}
    if remote.get("problem"):
        findings.append(Finding("error", "check-unavailable", remote["problem"], plugin="gpudask",
                                subject="scheduler"))
    protocol = scheme(scheduler_address)
    mine: list[Finding] = []
    try:
        manager, ctx, facts = here if here is not None else plan_here(protocol, extra_plugins)
    except GpudaskError as e:  # e.g. a $GPUDASK_FACTS that cannot run this protocol
        manager = ctx = facts = None
        mine.append(Finding("warning", "check-unavailable",
                            f"this client could not be compared: gpudask cannot plan here ({e})",
                            plugin="gpudask", subject="client"))
    me = local_side(facts, "client", None, protocol) if facts is not None else None
    raw = sides.get("scheduler")
    scheduler_side = None
    if isinstance(raw, dict):
        try:
            scheduler_side = dict(side_from_published(
                {"facts": raw.get("facts"), "protocol": raw.get("protocol"), "version": raw.get("gpudask"),
                 "facts_origin": raw.get("facts_origin")}, "scheduler", raw.get("address")))
            scheduler_side["ucx_tls"] = raw["ucx_tls"] if isinstance(raw.get("ucx_tls"), str) else None
        except ValueError:
            pass
    if me is not None and scheduler_side is not None:
        mine += run_hooks(manager, ctx, scheduler_side, me, "client", "scheduler")
    per_worker: list[Finding] = []
    for address, side in sorted((sides.get("workers") or {}).items()):
        if me is not None and isinstance(side, dict):
            per_worker += run_hooks(manager, ctx, side, me, "client", address)
    mine += dedupe(per_worker)
    report = dict(remote)
    report["client"] = {"summary": summary(me, None), "status": worst(mine), "findings": [f.to_dict() for f in mine]}
    all_findings = [f.to_dict() for f in findings] + list(remote.get("findings") or []) + report["client"]["findings"]
    report["findings"] = all_findings
    report["status"] = worst(all_findings)
    report["counts"] = {sev: sum(f.get("severity") == sev for f in all_findings) for sev in SEVERITIES}
    return report


def check(client: Any = None, extra_plugins: Iterable[Any] = ()) -> dict[str, Any]:
    """``gpudask.check(client)``: :func:`run_check`."""
    return run_check(client, extra_plugins)


def format_report(report: dict[str, Any], table: Callable[[list[str], list[list[Any]]], str],
                  width: int | None = -1) -> str:
    """``gpudask check`` without ``--json``; ``table`` renders headers and rows as text; prose
    is wrapped to ``width`` (-1: the terminal's)."""
    sched = report.get("scheduler") or {}
    gpus = sched.get("gpus")
    origin = sched.get("facts_origin")
    installed = (f"check installed, action {report.get('action')}" if report.get("installed")
                 else "check not installed (one-off report)")
    # what the scheduler and its workers said is escaped: a newline of theirs is text, never
    # a line of the report (the table escapes its cells)
    lines = [wrap_text(printable(f"scheduler {sched.get('address')}: protocol {sched.get('protocol')}, "
                                 f"{len(gpus) if isinstance(gpus, list) else '?'} GPU(s), driver "
                                 f"{sched.get('driver_version') or 'none'}"
                                 + (f", facts from {origin}" if origin not in (None, "probed") else "")
                                 + f"; {installed}"), width)]
    workers = report.get("workers") or {}
    numbers = {address: n for n, address in enumerate(workers)}
    if workers:
        rows = [[numbers[a], a, "yes" if w.get("gpudask") else "no", w.get("status"), len(w.get("findings") or [])]
                for a, w in workers.items()]
        lines += ["", table(["#", "worker", "gpudask", "status", "findings"], rows)]
    else:
        lines.append("no workers connected")
    lines += [wrap_text(printable(f"refused: {address}"), width) for address in report.get("refused") or {}]
    for where, found in _grouped_findings(report.get("findings") or [], numbers).items():
        lines += ["", wrap_text(printable(f"{where}:"), width)]
        for f in found:
            lines.append(wrap_text(printable(f"  {f['severity']}: [{f.get('plugin') or 'gpudask'}] {f.get('message')}"),
                                   width, indent="    "))
    counts = report.get("counts") or {}
    lines += ["", f"{counts.get('error', 0)} error(s), {counts.get('warning', 0)} warning(s), "
                  f"{counts.get('info', 0)} info: {report.get('status')}"]
    return "\n".join(lines)


_SIDES = ("scheduler", "client")


def _without_side(f: dict[str, Any]) -> tuple[Any, ...]:
    """A finding's key with its non-worker side's name (scheduler or client) blanked in its
    details: the same for both when it is the same check with the same values.  Different
    codes stay apart: the client lacking a GPU has other consequences than the scheduler."""
    details = f.get("details") if isinstance(f.get("details"), dict) else {}
    side = next((s for s in _SIDES if s in (f.get("subject"), f.get("reference"))), None)

    def blank(value: Any) -> Any:
        return "#" if value == side else value

    try:
        shown = json.dumps({blank(k): blank(v) for k, v in details.items()}, sort_keys=True, default=str)
    except TypeError:
        shown = repr(details)
    return f.get("severity"), f.get("plugin"), f.get("code"), shown


def _grouped_findings(findings: list[dict[str, Any]], numbers: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Findings under a line naming their processes: the same message once for all that have
    it, one the client shares with the scheduler (:func:`_without_side`) once; worst first."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for f in findings:
        key = (f.get("severity"), f.get("plugin"), f.get("code"), f.get("message"))
        entry = merged.setdefault(key, {**f, "subjects": [], "references": []})
        for field, names in (("subject", entry["subjects"]), ("reference", entry["references"])):
            for name in str(f.get(field) or "-").split(", "):
                if name not in names:
                    names.append(name)
    entries = list(merged.values())
    against_scheduler = {(_without_side(e), tuple(sorted(e["subjects"]))): e for e in entries
                         if e["references"] == ["scheduler"]}
    kept = []
    for e in entries:
        twin = against_scheduler.get((_without_side(e), tuple(sorted(e["references"]))))
        if e["subjects"] == ["client"] and twin is not None:
            twin["client_too"] = True  # the client against the same workers: the same finding
            continue
        kept.append(e)
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in kept:
        where = f"{_processes(e['subjects'], numbers)} against {_processes(e['references'], numbers)}"
        if e.get("client_too"):
            where += ", and against the client (the same values)"
        groups.setdefault(where, []).append(e)
    for found in groups.values():
        found.sort(key=lambda f: -SEVERITIES.index(f.get("severity", "info")))
    return dict(sorted(groups.items(), key=lambda g: -max(SEVERITIES.index(f.get("severity", "info"))
                                                          for f in g[1])))


def _processes(names: list[str], numbers: dict[str, int]) -> str:
    """Workers by their number in the table (``workers 0,2``, ``every worker (3)``), others by role."""
    known = sorted(numbers[n] for n in names if n in numbers)
    named = [f"the {n}" if n in _SIDES else n for n in names if n not in numbers]
    if known:
        if len(known) == len(numbers) > 1:
            named.append(f"every worker ({len(numbers)})")
        else:
            named.append(("workers " if len(known) > 1 else "worker ") + cpu_ranges(known))
    return ", ".join(named)


MAX_SCHEDULER_FILE = 1 << 20  # what `dask scheduler --scheduler-file` writes is a few hundred bytes


def read_scheduler_file(path: str, timeout: float = 30.0) -> str:
    """The ``address`` in a dask scheduler file, read within ``timeout`` seconds (in a thread:
    a hung network file system).  Only a regular file of at most :data:`MAX_SCHEDULER_FILE`
    bytes: opened non-blocking (a FIFO waits for a writer for ever), checked with ``fstat``
    before a byte is read (``/dev/zero`` never ends).

    :raises GpudaskError: one line naming the file, what is wrong and what is accepted.
    """
    accepted = "accepted: the JSON file `dask scheduler --scheduler-file` writes"
    result: list[Any] = []

    def refused(why: str) -> GpudaskError:
        return GpudaskError(f"--scheduler-file {path}: {why}; {accepted}")

    def unreadable(why: str) -> GpudaskError:
        return GpudaskError(f"cannot read the scheduler's address from {path}: {why}")

    def read() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    result.append(refused("not a regular file (a FIFO, socket or device)"))
                elif st.st_size > MAX_SCHEDULER_FILE:
                    result.append(refused(f"{st.st_size} bytes, more than a scheduler file holds "
                                          f"({MAX_SCHEDULER_FILE})"))
                else:
                    with os.fdopen(fd, "rb", closefd=False) as f:
                        result.append(f.read(MAX_SCHEDULER_FILE + 1))
            finally:
                os.close(fd)
        except OSError as e:
            result.append(unreadable(e.strerror or str(e)))

    reader = threading.Thread(target=read, name="gpudask-scheduler-file", daemon=True)
    reader.start()
    reader.join(timeout)
    if not result:
        raise refused(f"not read within {timeout:g} s (--timeout)")
    if isinstance(result[0], GpudaskError):
        raise result[0]
    data = result[0]
    if len(data) > MAX_SCHEDULER_FILE:
        raise refused(f"more than {MAX_SCHEDULER_FILE} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        why = "nested too deep" if isinstance(e, RecursionError) else (str(e).splitlines() or ["?"])[0][:120]
        raise unreadable(f"not JSON ({why}); {accepted}") from None
    address = doc.get("address") if isinstance(doc, dict) else None
    if not isinstance(address, str) or not address:
        raise unreadable(f"no string 'address' in it; {accepted}")
    return address


def scheduler_address(address: str | None, scheduler_file: str | None, timeout: float = 30.0) -> str:
    """The scheduler's address, checked for form; :raises GpudaskError: one line."""
    if scheduler_file:
        address = read_scheduler_file(scheduler_file, timeout)
    if not address:
        raise GpudaskError(f"give the scheduler's address; accepted: {ADDRESS_FORMS}")
    if len(address) > 1000 or not address.isprintable():
        raise GpudaskError(f"{address[:60]!r}... is not a scheduler address; accepted: {ADDRESS_FORMS}")
    try:
        parse_host_port(parse_address(address)[1])
    except (ValueError, TypeError) as e:
        raise GpudaskError(f"{address!r} is not a scheduler address ({e}); accepted: {ADDRESS_FORMS}") from None
    return address


def client_security(target: str) -> Any:
    """``Client(target, security=...)``'s: distributed's TLS settings for a ``tls://`` scheduler,
    refused in one line when there are none (``Client`` would raise a TypeError and hang at
    exit); None for every other scheme."""
    if scheme(target) != "tls":
        return None
    try:
        security = Security()
        context = security.get_connection_args("client").get("ssl_context")
    except Exception as e:  # noqa: BLE001 - a certificate file that is missing or not PEM
        raise GpudaskError(f"{target}: a TLS scheduler, and distributed's TLS settings cannot be used: "
                           f"{type(e).__name__}: {(str(e).splitlines() or ['?'])[0][:200]}") from None
    if context is None:
        raise GpudaskError(f"{target}: a TLS scheduler, and no TLS settings for this client; accepted: "
                           "distributed's TLS config (distributed.comm.tls.ca-file, .client.cert and .client.key, "
                           "e.g. DASK_DISTRIBUTED__COMM__TLS__CA_FILE=...)")
    return security


def unreachable(target: str, error: BaseException) -> GpudaskError:
    """The line ``gpudask check`` and ``gpudask status`` print when the scheduler cannot be reached."""
    return GpudaskError(f"cannot reach the scheduler at {target}: {error}")


def open_client(target: str, timeout: float) -> Any:
    """A client of the scheduler at ``target``; GpudaskError when not reached within ``timeout``."""
    security = client_security(target)
    ucx_output_to_stderr()
    try:
        with deadline(timeout, target):  # a peer that accepts and never answers: one line
            # plain TCP only: UCX is set up once per process and TLS needs the security
            # context, both of which Client() does itself
            if scheme(target) in (None, "tcp"):
                _probe(target, timeout)  # fails within the timeout, not inside Client()
            return Client(target, timeout=timeout, set_as_default=False, security=security)
    except Exception as e:  # noqa: BLE001 - OSError, TimeoutError ...
        raise unreachable(target, e) from None


def _probe(address: str, timeout: float) -> None:
    """Connect once and hang up: an unreachable TCP scheduler fails here, within ``timeout``,
    not inside ``Client()`` (whose half-made object hangs at exit)."""
    host, port = parse_host_port(parse_address(address)[1])
    try:  # nothing listening: say so now (distributed's connect retries until the timeout)
        socket.create_connection((host, port), timeout=min(timeout, 5.0)).close()
    except ConnectionRefusedError:
        raise OSError("nothing is listening there (connection refused)") from None
    except OSError:
        pass  # unreachable or slow: distributed's connect below waits up to the timeout

    async def once() -> None:
        comm = await connect(address, timeout=timeout)
        await comm.close()

    asyncio.run(once())


def ucx_output_to_stderr(environ: dict[str, str] | Any = os.environ) -> None:
    """Keep UCX off a client command's stdout, which is its report (``--json`` is read by
    programs): UCX logs to stdout unless ``UCX_LOG_FILE`` says otherwise when it loads, and
    warns there about ``UCX_MEMTYPE_CACHE``, which ucxx sets itself (the ucx plugin plans the
    same ``UCX_WARN_UNUSED_ENV_VARS=n`` for gpudask's servers).  A user's own values win."""
    environ.setdefault("UCX_LOG_FILE", "stderr")
    environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")


MAX_TIMEOUT_S = 7 * 86400.0  # --timeout's upper end: a week


def check_timeout(value: float, option: str = "--timeout") -> float:
    """A command's ``--timeout`` (or ``--path-timeout``), refused in one line when unusable."""
    if not (isinstance(value, (int, float)) and 0 < value <= MAX_TIMEOUT_S):
        raise GpudaskError(f"{option} {value:g}: accepted: a number of seconds above 0 and at most "
                           f"{MAX_TIMEOUT_S:g} (a week)")
    return float(value)


@contextlib.contextmanager
def deadline(seconds: float, target: str) -> Iterator[None]:
    """Exit (status 2, one line) when the scheduler at ``target`` has not answered within
    ``seconds`` plus one: a peer that accepts and never answers cannot hold a command past its
    ``--timeout``, and Python cannot cancel a blocked call from outside."""
    def expire() -> None:
        sys.stderr.write(f"gpudask: error: no answer from the scheduler at {target} within {seconds:g} s "
                         "(--timeout)\n")
        sys.stderr.flush()
        os._exit(2)

    timer = threading.Timer(seconds + 1.0, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def check_cli(address: str | None, scheduler_file: str | None, as_json: bool, timeout: float,
              echo: Callable[..., Any], table: Callable[[list[str], list[list[Any]]], str],
              probe: bool = False, path_timeout: float = 10.0, workers: str | None = None,
              payload: str = "64MiB") -> int:
    """``gpudask check``: 0 without an error finding, 1 with one, 2 when the scheduler cannot be
    reached.  ``probe``: data through every path instead, 1 when one fails (slow: a warning)."""
    try:
        check_timeout(timeout)
        target = scheduler_address(address, scheduler_file, timeout)
        chosen = _probe_workers(workers) if probe else None
        if probe:
            check_timeout(path_timeout, "--path-timeout")
            nbytes = _payload(payload)
        client = open_client(target, timeout)
    except GpudaskError as e:
        echo(f"gpudask: error: {printable(e)}", err=True)
        return 2
    if probe:
        from gpudask.checks.probe import format_probe, run_probe

        try:
            result = run_probe(client, path_timeout, chosen, nbytes)
        finally:
            client.close(timeout=path_timeout)
        echo(json.dumps(result, indent=1, default=str) if as_json else format_probe(result))
        return 0 if result["status"] in ("ok", "slow") else 1  # slow: a warning, like the check's
    try:
        with deadline(timeout, target):
            report = run_check(client)
    finally:
        client.close()
    echo(json.dumps(report, indent=1, default=str) if as_json else format_report(report, table))
    return 1 if report["status"] == "error" else 0


def _payload(value: str) -> int:
    """``--payload``: 8 bytes to 4 GiB."""
    try:
        nbytes = int(parse_bytes(value))
    except (ValueError, TypeError, OverflowError):
        nbytes = -1
    if not 8 <= nbytes <= 4 * 2**30:
        raise GpudaskError(f"--payload {value}: accepted: a size from 8 bytes to 4GiB, e.g. 64MiB")
    return nbytes


def _probe_workers(value: str | None) -> list[str] | None:
    """``--workers SOURCE,DESTINATION`` of ``--probe``."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not 1 <= len(items) <= 2:
        raise GpudaskError(f"--workers {value!r}: accepted: SOURCE or SOURCE,DESTINATION (worker addresses)")
    return items

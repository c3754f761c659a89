"""The client side of the scheduler check: ``gpudask.check(client)`` and ``gpudask check``.

Fetches the scheduler's report (its installed check's, or a one-off evaluation) and adds
this client's own comparison with the scheduler and with each worker: the client
deserialises what it gathers, so it should match them too.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpudask.checks.runner import plan_here, report_on_scheduler
from gpudask.checks.sides import SEVERITIES, dedupe, local_side, run_hooks, scheme, side_from_published, summary
from gpudask.errors import GpudaskError
from gpudask.findings import Finding, worst
from gpudask.printable import printable

ADDRESS_FORMS = "tcp://HOST:PORT, ucx://HOST:PORT, HOST:PORT, or --scheduler-file FILE"


def _fetch_scheduler_report(client: Any) -> dict[str, Any]:
    report: dict[str, Any]
    try:
        report = client.run_on_scheduler(report_on_scheduler)
    except Exception as first:  # noqa: BLE001
        # pickled functions refused (distributed.scheduler.pickle: false)? the handler
        # of an installed check needs no pickle
        try:
            report = client.sync(client.scheduler.gpudask_check, sides=True)
        except Exception:  # noqa: BLE001
            raise first from None
    return report


def run_check(client: Any = None, extra_plugins: Iterable[Any] = (),
              here: tuple[Any, Any, Any] | None = None) -> dict[str, Any]:
    """The report of the scheduler check, with this client compared too.

    :param client: default: the current client.
    :param extra_plugins: gpudask plugin objects whose checks run here too.
    :param here: ``(manager, ctx, facts)`` of this process, when the caller has them;
        else they are planned here (:func:`plan_here`: facts probed, or ``$GPUDASK_FACTS``).
    :return: the report; ``report["status"]`` is ``"ok"``, ``"info"``, ``"warning"`` or ``"error"``.
    """
    if client is None:
        from distributed import get_client

        client = get_client()
    findings: list[Finding] = []
    try:
        remote = _fetch_scheduler_report(client)
    except Exception as e:  # noqa: BLE001 - e.g. gpudask not installed on the scheduler
        remote = {"installed": False, "action": None, "scheduler": {"address": client.scheduler.address},
                  "problem": f"the scheduler could not run gpudask's check ({type(e).__name__}: {e}); "
                             f"is gpudask installed there?", "workers": {}, "refused": {}, "findings": [],
                  "sides": {"scheduler": None, "workers": {}}}
    sides = remote.pop("sides", None) or {}
    if remote.get("problem"):
        findings.append(Finding("error", "check-unavailable", remote["problem"], plugin="gpudask",
                                subject="scheduler"))
    protocol = scheme(client.scheduler.address)
    mine: list[Finding] = []
    try:
        manager, ctx, facts = here if here is not None else plan_here(protocol, extra_plugins)
    except GpudaskError as e:  # e.g. a $GPUDASK_FACTS that cannot run this protocol
        manager = ctx = facts = None
        mine.append(Finding("warning", "check-unavailable",
                            f"this client could not be compared: gpudask cannot plan here ({e})",
                            plugin="gpudask", subject="client"))
    me = local_side(facts, "client", None, protocol) if facts is not None else None
    scheduler_side = sides.get("scheduler")
    if isinstance(scheduler_side, dict):
        try:
            scheduler_side = dict(side_from_published(
                {"facts": scheduler_side.get("facts"), "protocol": scheduler_side.get("protocol"),
                 "version": scheduler_side.get("gpudask"), "facts_origin": scheduler_side.get("facts_origin")},
                "scheduler", scheduler_side.get("address")))
            tls = (sides.get("scheduler") or {}).get("ucx_tls")
            scheduler_side["ucx_tls"] = tls if isinstance(tls, str) else None
        except ValueError:
            scheduler_side = None
    if me is not None and isinstance(scheduler_side, dict):
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
    """``gpudask.check(client)``: the scheduler check's report, this client compared too
    (see :func:`run_check`)."""
    return run_check(client, extra_plugins)


def format_report(report: dict[str, Any], table: Callable[[list[str], list[list[Any]]], str]) -> str:
    """The readable form of a report (``gpudask check`` without ``--json``); ``table``
    renders headers and rows as text."""
    sched = report.get("scheduler") or {}
    gpus = sched.get("gpus")
    origin = sched.get("facts_origin")
    installed = (f"check installed, action {report.get('action')}" if report.get("installed")
                 else "check not installed (one-off report)")
    # what the scheduler and its workers said is printed escaped (gpudask.printable); the
    # table escapes its cells
    lines = [printable(f"scheduler {sched.get('address')}: protocol {sched.get('protocol')}, "
                       f"{len(gpus) if isinstance(gpus, list) else '?'} GPU(s), driver "
                       f"{sched.get('driver_version') or 'none'}"
                       + (f", facts from {origin}" if origin not in (None, "probed") else "") + f"; {installed}")]
    workers = report.get("workers") or {}
    if workers:
        rows = [[a, "yes" if w.get("gpudask") else "no", w.get("status"), len(w.get("findings") or [])]
                for a, w in workers.items()]
        lines += ["", table(["worker", "gpudask", "status", "findings"], rows)]
    else:
        lines.append("no workers connected")
    lines += [f"refused: {printable(address)}" for address in report.get("refused") or {}]
    findings = sorted(report.get("findings") or [], key=lambda f: -SEVERITIES.index(f.get("severity", "info")))
    lines.append("")
    if findings:
        # a finding several processes share is one row naming them all
        grouped: dict[tuple[Any, ...], list[str]] = {}
        for f in findings:
            key = (f.get("severity"), f.get("reference") or "-", f.get("plugin") or "gpudask", f.get("message"))
            subjects = grouped.setdefault(key, [])
            for subject in str(f.get("subject") or "-").split(", "):
                if subject not in subjects:
                    subjects.append(subject)
        rows = [[severity, _processes(subjects, list(workers)), _processes(str(reference).split(", "), list(workers)),
                 plugin, message] for (severity, reference, plugin, message), subjects in grouped.items()]
        lines += [table(["severity", "process", "compared with", "plugin", "finding"], rows), ""]
    counts = report.get("counts") or {}
    lines.append(printable(f"{counts.get('error', 0)} error(s), {counts.get('warning', 0)} warning(s), "
                           f"{counts.get('info', 0)} info: {report.get('status')}"))
    return "\n".join(lines)


def _processes(names: list[str], workers: list[str]) -> str:
    """Processes named in a finding's row: every worker of several is said so."""
    if len(workers) > 1 and sorted(names) == sorted(workers):
        return f"every worker ({len(workers)})"
    return ", ".join(names)


MAX_SCHEDULER_FILE = 1 << 20  # what `dask scheduler --scheduler-file` writes is a few hundred bytes


def read_scheduler_file(path: str, timeout: float = 30.0) -> str:
    """The ``address`` in a dask scheduler file, read within ``timeout`` seconds.

    Only a regular file of at most :data:`MAX_SCHEDULER_FILE` bytes is read: opened
    non-blocking (a FIFO would wait for a writer for ever), checked with ``fstat`` before a
    byte is read (``/dev/zero`` never ends); the read runs in a thread the caller waits for
    at most ``timeout`` (a hung network file system).

    :raises GpudaskError: one line naming the file, what is wrong and what is accepted.
    """
    import stat

    accepted = "accepted: the JSON file `dask scheduler --scheduler-file` writes"
    result: list[Any] = []

    def read() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    result.append(GpudaskError(f"--scheduler-file {path}: not a regular file (a FIFO, socket or "
                                               f"device); {accepted}"))
                    return
                if st.st_size > MAX_SCHEDULER_FILE:
                    result.append(GpudaskError(f"--scheduler-file {path}: {st.st_size} bytes, more than a scheduler "
                                               f"file holds ({MAX_SCHEDULER_FILE}); {accepted}"))
                    return
                with os.fdopen(fd, "rb", closefd=False) as f:
                    result.append(f.read(MAX_SCHEDULER_FILE + 1))
            finally:
                os.close(fd)
        except OSError as e:
            result.append(GpudaskError(f"cannot read the scheduler's address from {path}: {e.strerror or e}"))

    reader = threading.Thread(target=read, name="gpudask-scheduler-file", daemon=True)
    reader.start()
    reader.join(timeout)
    if not result:
        raise GpudaskError(f"--scheduler-file {path}: not read within {timeout:g} s (--timeout); {accepted}")
    if isinstance(result[0], GpudaskError):
        raise result[0]
    data = result[0]
    if len(data) > MAX_SCHEDULER_FILE:
        raise GpudaskError(f"--scheduler-file {path}: more than {MAX_SCHEDULER_FILE} bytes; {accepted}")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        why = "nested too deep" if isinstance(e, RecursionError) else (str(e).splitlines() or ["?"])[0][:120]
        raise GpudaskError(f"cannot read the scheduler's address from {path}: not JSON ({why}); {accepted}") from None
    address = doc.get("address") if isinstance(doc, dict) else None
    if not isinstance(address, str) or not address:
        raise GpudaskError(f"cannot read the scheduler's address from {path}: no string 'address' in it; {accepted}")
    return address


def scheduler_address(address: str | None, scheduler_file: str | None, timeout: float = 30.0) -> str:
    """The scheduler's address, checked for form (a scheduler file read within ``timeout``).

    :raises GpudaskError: one line naming what is wrong and the accepted forms.
    """
    from distributed.comm.addressing import parse_address, parse_host_port

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
    """What ``Client(target, security=...)`` needs: distributed's TLS settings from dask
    config for a ``tls://`` scheduler, refused in one line when there are none (``Client``
    would end in a TypeError traceback and hang at exit); None for every other scheme."""
    if scheme(target) != "tls":
        return None
    from distributed.security import Security

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


def unreachable(target: str, timeout: float, error: BaseException) -> str:
    """The line ``gpudask check`` and ``gpudask status`` print when the scheduler cannot be reached."""
    return f"cannot reach the scheduler at {target}: {error}"


def _probe(address: str, timeout: float) -> None:
    """Connect once and hang up, so that an unreachable TCP scheduler fails here, within
    ``timeout``, and not inside ``Client()`` (whose half-made object hangs at exit)."""
    import asyncio
    import socket

    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.core import connect

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
    """Keep UCX off a client command's stdout, which is its report (``--json`` is read by programs).

    UCX's log goes to stdout unless told otherwise (``UCX_LOG_FILE``, read when UCX loads), and
    every UCX process warns there about a variable ucxx sets itself (``UCX_MEMTYPE_CACHE``): set
    before UCX loads, UCX logs to stderr and that warning is off, as in gpudask's own servers
    (the ucx plugin plans the same ``UCX_WARN_UNUSED_ENV_VARS=n``).  A user's own values win."""
    environ.setdefault("UCX_LOG_FILE", "stderr")
    environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")


MAX_TIMEOUT_S = 7 * 86400.0  # --timeout's upper end: a week


def check_timeout(value: float, option: str = "--timeout") -> float:
    """A command's ``--timeout`` (or ``--path-timeout``): refused in one line when it is
    not a number of seconds a wait can use."""
    if not (isinstance(value, (int, float)) and 0 < value <= MAX_TIMEOUT_S):
        raise GpudaskError(f"{option} {value:g}: accepted: a number of seconds above 0 and at most "
                           f"{MAX_TIMEOUT_S:g} (a week)")
    return float(value)


@contextlib.contextmanager
def deadline(seconds: float, target: str) -> Iterator[None]:
    """End the command with one line when the scheduler at ``target`` has not answered within
    ``seconds`` (plus one): a peer that accepts the connection and never answers does not hold
    a command past its ``--timeout``.  Python cannot cancel a blocked call from outside, so
    the process exits (status 2)."""
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
    """``gpudask check``: 0 when no error-level finding, 1 when there is one, 2 when the
    scheduler cannot be reached.  With ``probe``: data through every path instead
    (:mod:`gpudask.checks.probe`), 0 when every path works (slow ones are warnings), 1 when one does not."""
    from distributed import Client

    try:
        check_timeout(timeout)
        target = scheduler_address(address, scheduler_file, timeout)
        security = client_security(target)
        chosen = _probe_workers(workers) if probe else None
        if probe:
            check_timeout(path_timeout, "--path-timeout")
            nbytes = _payload(payload)
    except GpudaskError as e:
        echo(f"gpudask: error: {printable(e)}", err=True)
        return 2
    try:
        # plain TCP only: UCX is set up once per process and TLS needs the security
        # context, both of which Client() does itself
        ucx_output_to_stderr()
        with deadline(timeout, target):
            if scheme(target) in (None, "tcp"):
                _probe(target, timeout)
            client = Client(target, timeout=timeout, set_as_default=False, security=security)
    except Exception as e:  # noqa: BLE001 - OSError, TimeoutError ...
        echo(f"gpudask: error: {printable(unreachable(target, timeout, e))}", err=True)
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
    """``--payload``: a size from 8 bytes to 4 GiB (dask's parse_bytes)."""
    from dask.utils import parse_bytes

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

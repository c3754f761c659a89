"""Reaching the scheduler for ``gpudask check`` and ``gpudask status``: its address (given or
from a scheduler file), a client within ``--timeout``, every failure one line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
import sys
import threading
from collections.abc import Iterator
from typing import Any

from distributed.comm.addressing import parse_address, parse_host_port

from gpudask.checks.sides import scheme
from gpudask.errors import GpudaskError

ADDRESS_FORMS = "tcp://HOST:PORT, ucx://HOST:PORT, HOST:PORT, or --scheduler-file FILE"
MAX_SCHEDULER_FILE = 1 << 20  # what `dask scheduler --scheduler-file` writes is a few hundred bytes
MAX_TIMEOUT_S = 7 * 86400.0  # --timeout's upper end: a week


def target(address: str | None, address_option: str | None, scheduler_file: str | None, timeout: float) -> str:
    """The scheduler's address from :func:`scheduler_options`' values, checked for form."""
    accepted = "accepted: one of ADDRESS, --address ADDRESS, --scheduler-file FILE"
    if address and address_option and address != address_option:
        raise GpudaskError(f"two scheduler addresses given ({address!r} and --address {address_option!r}); {accepted}")
    address = address or address_option
    if address and scheduler_file:
        raise GpudaskError(f"both an address ({address!r}) and --scheduler-file given; {accepted}")
    check_timeout(timeout)
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


def read_scheduler_file(path: str, timeout: float = 30.0) -> str:
    """The ``address`` in a dask scheduler file, read within ``timeout`` seconds (in a thread: a hung
    network file system).  Only a regular file of at most :data:`MAX_SCHEDULER_FILE` bytes, opened
    non-blocking (a FIFO waits for a writer for ever), checked with ``fstat`` before a byte is read."""
    accepted = "accepted: the JSON file `dask scheduler --scheduler-file` writes"
    result: list[Any] = []

    def refused(why: str) -> GpudaskError:
        return GpudaskError(f"--scheduler-file {path}: {why}; {accepted}")

    def unreadable(why: str) -> GpudaskError:
        return GpudaskError(f"cannot read the scheduler's address from {path}: {why}")

    def read() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
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
    if len(result[0]) > MAX_SCHEDULER_FILE:
        raise refused(f"more than {MAX_SCHEDULER_FILE} bytes")
    try:
        doc = json.loads(result[0].decode("utf-8"))
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        why = "nested too deep" if isinstance(e, RecursionError) else (str(e).splitlines() or ["?"])[0][:120]
        raise unreadable(f"not JSON ({why}); {accepted}") from None
    address = doc.get("address") if isinstance(doc, dict) else None
    if not isinstance(address, str) or not address:
        raise unreadable(f"no string 'address' in it; {accepted}")
    return address


def check_timeout(value: float, option: str = "--timeout") -> float:
    if not 0 < value <= MAX_TIMEOUT_S:
        raise GpudaskError(f"{option} {value:g}: accepted: a number of seconds above 0 and at most "
                           f"{MAX_TIMEOUT_S:g} (a week)")
    return value


def client_security(address: str) -> Any:
    """distributed's TLS settings for a ``tls://`` scheduler, refused in one line when there are none
    (``Client`` would hang at exit); None for every other scheme."""
    if scheme(address) != "tls":
        return None
    from distributed.security import Security

    try:
        security = Security()
        context = security.get_connection_args("client").get("ssl_context")
    except Exception as e:  # noqa: BLE001 - a certificate file that is missing or not PEM
        raise GpudaskError(f"{address}: a TLS scheduler, and distributed's TLS settings cannot be used: "
                           f"{type(e).__name__}: {(str(e).splitlines() or ['?'])[0][:200]}") from None
    if context is None:
        raise GpudaskError(f"{address}: a TLS scheduler, and no TLS settings for this client; accepted: "
                           "distributed's TLS config (distributed.comm.tls.ca-file, .client.cert and .client.key, "
                           "e.g. DASK_DISTRIBUTED__COMM__TLS__CA_FILE=...)")
    return security


def unreachable(address: str, error: BaseException) -> GpudaskError:
    return GpudaskError(f"cannot reach the scheduler at {address}: {error}")


def open_client(address: str, timeout: float) -> Any:
    """A client of the scheduler at ``address``; GpudaskError when not reached within ``timeout``."""
    from distributed import Client

    security = client_security(address)
    ucx_output_to_stderr()
    try:
        with deadline(timeout, address):  # a peer that accepts and never answers: one line
            # plain TCP only: UCX is set up once per process and TLS needs the security
            # context, both of which Client() does itself
            if scheme(address) in (None, "tcp"):
                _probe(address, timeout)  # fails within the timeout, not inside Client()
            return Client(address, timeout=timeout, set_as_default=False, security=security)
    except Exception as e:  # noqa: BLE001 - OSError, TimeoutError ...
        raise unreachable(address, e) from None


def _probe(address: str, timeout: float) -> None:
    """Connect once and hang up: an unreachable TCP scheduler fails here, not inside ``Client()``
    (whose half-made object hangs at exit)."""
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
    """Keep UCX's log and its warning about ``UCX_MEMTYPE_CACHE`` (which ucxx sets itself) off a
    client command's stdout, its report; a user's own values win."""
    environ.setdefault("UCX_LOG_FILE", "stderr")
    environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")


@contextlib.contextmanager
def deadline(seconds: float, address: str) -> Iterator[None]:
    """Exit (status 2, one line) when the scheduler has not answered within ``seconds`` plus one:
    Python cannot cancel a blocked call from outside."""
    def expire() -> None:
        sys.stderr.write(f"gpudask: error: no answer from the scheduler at {address} within {seconds:g} s "
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

"""Where gpudask reaches into the standard library's multiprocessing beyond its API.

Held by a contract test (tests/test_compat_contract.py).
"""

from __future__ import annotations


def stop_forkserver() -> None:
    """Stop this process's multiprocessing fork server, if it runs; the next start of a
    ``forkserver`` process starts a new one, with the environment in effect then.

    Private: ``ForkServer._stop`` (CPython's own tests use it); there is no public way to
    replace a fork server started with another environment.  gpudask needs it when a
    ``dask worker`` planned ahead for one protocol and its scheduler listens on another."""
    import multiprocessing.forkserver

    multiprocessing.forkserver._forkserver._stop()

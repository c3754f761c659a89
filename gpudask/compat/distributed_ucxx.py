"""Where gpudask reaches into distributed-ucxx beyond its public API (see gpudask.compat.distributed).

Held by a contract test against the installed distributed-ucxx (tests/test_compat_contract.py).
"""

from __future__ import annotations


def start_ucx() -> None:
    """Start UCX in this process as distributed-ucxx's first ``listen()`` or connect would:
    its ``init_once``, which reads the dask config and environment in effect now, creates the
    CUDA context first when its rules say so, and does nothing on a second call.

    Private: ``init_once`` sets its module global ``ucxx`` before ``ucxx.init`` runs, so after
    a failure it would look done to the listen that follows; the global is reset here, and
    that listen starts UCX again and reports its error where distributed does."""
    import distributed_ucxx.ucxx as comm

    try:
        comm.init_once()
    except BaseException:
        comm.ucxx = None
        raise


def ucx_started() -> bool:
    """Has distributed-ucxx started UCX in this process (its ``ucxx`` global set)?"""
    import sys

    comm = sys.modules.get("distributed_ucxx.ucxx")
    return comm is not None and getattr(comm, "ucxx", None) is not None

"""The fork server's preload: import, once, what gpudask's plugins say a worker imports.

multiprocessing's fork server imports its preload modules by name and stops at any error
but ImportError: a library whose import raises anything else (an ``OSError`` from a shared
library) would take the fork server down, and every worker start with it.  gpudask names
this module instead, and the modules in ``GPUDASK_PREIMPORT`` (comma-separated, set in the
server's environment only): each is imported with every error caught.  It lives outside
the ``gpudask`` package because importing gpudask applies a plan (the workers the server
forks apply their own at their first ``import gpudask``).
"""

import importlib
import os

VARIABLE = "GPUDASK_PREIMPORT"


def _preimport() -> None:
    # the server's own environment: its children (the workers) do not inherit the list
    for name in filter(None, os.environ.pop(VARIABLE, "").split(",")):
        try:
            importlib.import_module(name.strip())
        except BaseException:  # noqa: BLE001 - the worker imports it later and meets the error there
            pass


_preimport()

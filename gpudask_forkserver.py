"""The fork server's preload: import, once, what gpudask's plugins say a worker imports.

multiprocessing's fork server stops at any preload error but ImportError (an ``OSError`` from
a shared library would take every worker start down), so gpudask names this module, which
imports each module of ``GPUDASK_PREIMPORT`` (comma-separated, the server's environment only)
with every error caught.  It lives outside the ``gpudask`` package: importing gpudask applies
a plan (each forked worker applies its own at its first ``import gpudask``).
"""

import importlib
import os
import sys

VARIABLE = "GPUDASK_PREIMPORT"


def _preimport() -> None:
    # the server's own environment: its children (the workers) do not inherit the list
    had_gpudask = "gpudask" in sys.modules  # a nanny importing this module: its own, applied
    for name in filter(None, os.environ.pop(VARIABLE, "").split(",")):
        try:
            importlib.import_module(name.strip())
        except BaseException:  # noqa: BLE001 - the worker imports it later and meets the error there
            pass
    # gpudask's own modules are in the list too, but not the package module: each forked
    # worker's own ``import gpudask`` must run its __init__, which applies that worker's plan
    if not had_gpudask:
        sys.modules.pop("gpudask", None)


_preimport()

"""The fork server's preload: import, once, what gpudask's plugins say a worker imports.

multiprocessing's fork server imports its preload modules by name and stops at any error
but ImportError: a library whose import raises anything else (an ``OSError`` from a shared
library) would take the fork server down, and every worker start with it.  gpudask names
this module instead, and the modules in ``GPUDASK_PREIMPORT`` (comma-separated, set in the
server's environment only): each is imported with every error caught.  It lives outside
the ``gpudask`` package because importing gpudask applies a plan (the workers the server
forks apply their own at their first ``import gpudask``); gpudask's own modules, named in the
list, are imported here with the package module left out (:func:`_preimport`).
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
    # gpudask's own modules are in the list too (a worker finds them loaded), but not the package
    # module: importing it here did nothing (no dask server process), and each forked worker's own
    # ``import gpudask`` must run its __init__, which applies that worker's plan
    if not had_gpudask:
        sys.modules.pop("gpudask", None)


_preimport()

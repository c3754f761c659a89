"""``gpudask bench`` and the process-cluster helper it shares with the tests.

* :mod:`~gpudask.bench.cli` -- the command, the time box, the run over configurations;
* :mod:`~gpudask.bench.configs` -- what each configuration (tcp, ucx-stock, gpudask,
  dask-cuda) starts, on which host;
* :mod:`~gpudask.bench.raw_ucxx` -- the raw-ucxx column: two plain ucxx processes placed like
  gpudask's workers (:mod:`~gpudask.bench.ucxx_peer`), the transfers' ceiling;
* :mod:`~gpudask.bench.processes` -- real ``dask scheduler`` / ``dask worker`` processes:
  start, wait, stop (also the tests' ``cluster`` fixture);
* :mod:`~gpudask.bench.cluster` -- one launch of a configuration;
* :mod:`~gpudask.bench.runner` -- the measurements of one configuration;
* :mod:`~gpudask.bench.workers` -- the functions sent to the workers (by value);
* :mod:`~gpudask.bench.measures` -- GPU memory per process, UCX's transport choices, the profile;
* :mod:`~gpudask.bench.report` -- figures, ratios, the table.

Importing it is cheap: numpy, cupy, dask, distributed, psutil and pynvml are imported
inside the functions that use them.
"""

from __future__ import annotations


def bench_main(args: list[str]) -> None:
    """Entry point of ``gpudask bench`` (the CLI passes its arguments through)."""
    from gpudask.bench.cli import bench_main as main

    main(args)

"""``gpudask bench``: the gpudask-bench distribution, outside the gpudask runtime package.

The command reaches ``gpudask`` through the ``gpudask.commands`` entry point group; it starts
its clusters with :mod:`gpudask.testing.processes`, the process helper the tests use too.

* :mod:`~gpudask_bench.cli` -- the command, the time box, the run over configurations;
* :mod:`~gpudask_bench.configs` -- what each configuration starts, on which host;
* :mod:`~gpudask_bench.raw_ucxx` -- the raw-ucxx column: two plain ucxx processes
  (:mod:`~gpudask_bench.ucxx_peer`), the transfers' ceiling;
* :mod:`~gpudask_bench.cluster` / :mod:`~gpudask_bench.runner` -- one launch / all launches of a configuration;
* :mod:`~gpudask_bench.workloads` -- what one launch measures; :mod:`~gpudask_bench.workers` what runs on workers;
* :mod:`~gpudask_bench.measures` -- GPU memory per process, UCX's transport choices, the profile;
* :mod:`~gpudask_bench.report` -- figures, ratios, the table.

Importing it is cheap: numpy, cupy, dask, distributed, psutil and pynvml are imported
inside the functions that use them.
"""

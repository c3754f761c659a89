"""``gpudask bench``: the gpudask-bench distribution, outside the gpudask runtime package.

The command (:mod:`~gpudask_bench.cli`) reaches ``gpudask`` through the ``gpudask.commands`` entry
point group and starts its clusters with :mod:`gpudask.testing.processes`, as the tests do.
Importing it is cheap: numpy, cupy, dask, distributed, psutil and pynvml are imported inside the
functions that use them.
"""

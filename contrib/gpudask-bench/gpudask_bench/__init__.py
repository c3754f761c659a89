"""``gpudask bench``, the gpudask-bench distribution: reached through the ``gpudask.commands`` entry
point, its clusters started with :mod:`gpudask.testing.processes`.  Importing it is cheap: numpy,
cupy, dask, distributed, psutil and pynvml are imported inside the functions that use them.
"""

"""A stand-in for a GPU array library on a machine without a GPU (the tests of gpu-graph-data).

Its arrays pickle as ``standin_gpu.to_device(host_copy)``, as CuPy's do
(``cupy._core.core.array(host_copy)``), and making one fails wherever
``STANDIN_GPU_VISIBLE=0`` -- the stand-in for a scheduler started with
``CUDA_VISIBLE_DEVICES=""`` (``cudaErrorNoDevice``).  Each process counts the arrays it made,
so a test can ask a scheduler whether it made any.  Array-like enough for ``da.from_array``.
"""

from __future__ import annotations

import os

import numpy as np

MADE = [0]  # arrays made in this process ("device memory" allocated here)


class NoDevice(RuntimeError):
    pass


def to_device(host):
    if os.environ.get("STANDIN_GPU_VISIBLE") == "0":
        raise NoDevice("cudaErrorNoDevice: no CUDA-capable device is detected (standin_gpu)")
    MADE[0] += 1
    return DeviceArray(host)


class DeviceArray:
    """An array "in GPU memory": a NumPy array behind ``__cuda_array_interface__``."""

    def __init__(self, host):
        self.host = np.asarray(host)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.host.shape, "typestr": self.host.dtype.str, "data": (0, False), "version": 3}

    shape = property(lambda self: self.host.shape)
    dtype = property(lambda self: self.host.dtype)
    ndim = property(lambda self: self.host.ndim)
    nbytes = property(lambda self: self.host.nbytes)

    def __getitem__(self, index):
        return DeviceArray(self.host[index])

    def __array__(self, dtype=None, copy=None):
        return self.host if dtype is None else self.host.astype(dtype)

    def __len__(self):
        return len(self.host)

    def __mul__(self, other):
        return DeviceArray(self.host * other)

    def get(self):
        return self.host

    def __reduce__(self):
        return to_device, (self.host,)

    def __repr__(self):
        return f"DeviceArray({self.host!r})"


def make_stateful(value):
    return Stateful(value)


class Stateful:
    """An object pickled as a call and then a state (pickle's BUILD), as cuDF's objects may be."""

    def __init__(self, value):
        self.value = value
        self.extra = None

    def __reduce__(self):
        return make_stateful, (self.value,), {"extra": "set by BUILD"}

"""A worker data store with a device tier: GPU objects up to a byte limit, then host, then disk.

GPU objects (types with ``__cuda_array_interface__``, cuDF and CuPy-sparse objects, short
containers of them) live in a ``zict.LRU`` bounded by the device memory limit; what it evicts is
serialised with host serializers and kept, as a :class:`HostCopy`, in the worker's own store
(normally distributed's ``SpillBuffer``), so host memory stays under distributed's limits and
spills to disk as usual.  No CUDA library is imported here: device objects are recognised by
their type and moved by the serializers their libraries register with distributed.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

import zict
from dask.sizeof import sizeof
from dask.utils import format_bytes
from distributed.protocol import dask_deserialize, dask_serialize, deserialize, serialize
from distributed.sizeof import safe_sizeof

# a child of distributed.worker, so spill lines reach client.get_worker_logs() as well
logger = logging.getLogger("distributed.worker.gpudask.spill")

# libraries whose objects hold device memory without exposing __cuda_array_interface__
DEVICE_PACKAGES = ("cudf", "cupyx", "dask_cudf", "pylibcudf")
# containers are looked into one level deep, and only when short (a task returning a
# tuple of arrays); a long list of Python objects is host data and is not scanned
MAX_SCANNED_ITEMS = 64
HOST_SERIALIZERS = ("dask", "pickle")


def _is_device_leaf(value: Any) -> bool:
    cls = type(value)
    return hasattr(cls, "__cuda_array_interface__") or cls.__module__.partition(".")[0] in DEVICE_PACKAGES


def _items(value: Any) -> list[Any] | None:
    cls = type(value)
    if cls in (list, tuple) and len(value) <= MAX_SCANNED_ITEMS:
        return list(value)
    if cls is dict and len(value) <= MAX_SCANNED_ITEMS:
        return list(value.values())
    return None


def is_device_object(value: Any) -> bool:
    """Does ``value`` hold device memory the device tier should account for?"""
    return _is_device_leaf(value) or any(_is_device_leaf(v) for v in _items(value) or ())


def device_nbytes(value: Any) -> int:
    """Bytes of device memory ``value`` holds (its ``nbytes``, else dask's sizeof)."""
    items = _items(value)
    if items is not None:
        return sum(device_nbytes(v) for v in items if _is_device_leaf(v))
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int) and not isinstance(nbytes, bool):
        return nbytes
    usage = getattr(value, "memory_usage", None)
    if callable(usage) and type(value).__module__.partition(".")[0] == "cudf":
        # cuDF frames have no nbytes; dask's sizeof knows them only once dask_cudf is imported
        try:
            total = usage(deep=True)
            return int(total.sum() if hasattr(total, "sum") else total)
        except Exception:  # noqa: BLE001 - fall back to dask's estimate
            pass
    return int(safe_sizeof(value))


def _release_cupy_cache() -> bool:
    """Give CuPy's cached free blocks back to the device; True if there were any."""
    cupy = sys.modules.get("cupy")  # never imported here: only if the worker uses it
    if cupy is None:
        return False
    pool = cupy.get_default_memory_pool()
    cached = pool.free_bytes()
    pool.free_all_blocks()
    return bool(cached > 0)


class HostCopy:
    """A device object moved to host memory: distributed's serialization of it."""

    __slots__ = ("header", "frames", "nbytes", "device_nbytes")

    def __init__(self, header: dict[str, Any], frames: list[Any], device_nbytes: int):
        self.header = header
        self.frames = list(frames)
        self.nbytes = sum(memoryview(f).nbytes for f in self.frames)
        self.device_nbytes = device_nbytes

    def restore(self) -> Any:
        return deserialize(self.header, self.frames)  # type: ignore[no-untyped-call]  # distributed is untyped

    def __repr__(self) -> str:
        return f"<HostCopy of {format_bytes(self.device_nbytes)} of device memory>"


# dask's and distributed's dispatchers are untyped: the functions they register keep their types
@sizeof.register(HostCopy)  # type: ignore[untyped-decorator, no-untyped-call]
def _sizeof_host_copy(x: HostCopy) -> int:
    return x.nbytes


@dask_serialize.register(HostCopy)  # type: ignore[untyped-decorator, no-untyped-call]
def _serialize_host_copy(x: HostCopy) -> tuple[dict[str, Any], list[Any]]:
    return {"inner": x.header, "device_nbytes": x.device_nbytes}, x.frames


@dask_deserialize.register(HostCopy)  # type: ignore[untyped-decorator, no-untyped-call]
def _deserialize_host_copy(header: dict[str, Any], frames: list[Any]) -> HostCopy:
    return HostCopy(header["inner"], frames, header["device_nbytes"])


@dataclass
class SpillCounters:
    spilled_count: int = 0  # device -> host moves
    spilled_bytes: int = 0  # device bytes moved to host
    unspilled_count: int = 0  # host -> device moves (on access)
    unspilled_bytes: int = 0
    spill_seconds: float = 0.0  # serialising to host and storing in the host tier
    unspill_seconds: float = 0.0  # reading from the host tier (or disk) and re-creating on the device
    unspillable_count: int = 0  # device objects with no host serializer: kept as they were


class DeviceHostStore(MutableMapping[Any, Any]):
    """``Worker.data`` with a device tier of ``device_memory_limit`` bytes over ``host``, the
    worker's own store (kept as it is, keys and all: it may already hold data)."""

    host: Any  # distributed's SpillBuffer (its .fast, .slow, .spilled_total), or a dict

    def __init__(self, host: MutableMapping[Any, Any], device_memory_limit: int, *, log_spilling: bool = False,
                 worker_name: str | None = None):
        if isinstance(device_memory_limit, bool) or not isinstance(device_memory_limit, int) \
                or device_memory_limit <= 0:
            raise ValueError(f"device_memory_limit must be a positive number of bytes, got {device_memory_limit!r}")
        self.host = host
        self.device_memory_limit = device_memory_limit
        self.device: zict.LRU[Any, Any] = zict.LRU(device_memory_limit, {}, weight=lambda k, v: device_nbytes(v),
                                                   on_evict=[self._move_to_host])
        self.counters = SpillCounters()
        self.log_spilling = log_spilling
        self.worker_name = worker_name
        # one lock for both tiers: a key must never be seen in neither (or both)
        self.lock = threading.RLock()
        self._warned_types: set[str] = set()

    # -- tiers -------------------------------------------------------------------------
    def _move_to_host(self, key: Any, value: Any) -> None:
        """LRU eviction: serialise to host frames and store them in the host tier."""
        nbytes = int(self.device.weights.get(key) or device_nbytes(value))  # the weights are device_nbytes ints
        start = time.perf_counter()
        try:
            header, frames = serialize(value, serializers=HOST_SERIALIZERS, on_error="raise")
            held: Any = HostCopy(header, frames, nbytes)
        except Exception as e:  # noqa: BLE001 - any serializer failure: keep the object, say so once
            held = value
            self.counters.unspillable_count += 1
            name = f"{type(value).__module__}.{type(value).__qualname__}"
            if name not in self._warned_types:
                self._warned_types.add(name)
                logger.warning("gpudask spill: cannot move %s to host memory (%s: %s); such objects stay on the "
                               "device, outside the device memory limit", name, type(e).__name__, e)
        self.host[key] = held
        elapsed = time.perf_counter() - start
        if held is value:
            return
        self.counters.spilled_count += 1
        self.counters.spilled_bytes += nbytes
        self.counters.spill_seconds += elapsed
        self._log(key, nbytes, "from device to host", elapsed)

    def _restore(self, key: Any, held: HostCopy) -> Any:
        start = time.perf_counter()
        try:
            value = held.restore()
        except MemoryError:
            # distributed re-creates CuPy arrays through RMM; without an RMM resource for
            # CuPy, CuPy's own pool may still cache the blocks that spilled objects freed
            if not _release_cupy_cache():
                raise
            value = held.restore()
        elapsed = time.perf_counter() - start
        self.counters.unspilled_count += 1
        self.counters.unspilled_bytes += held.device_nbytes
        self.counters.unspill_seconds += elapsed
        self._log(key, held.device_nbytes, "from host to device", elapsed)
        return value

    def _log(self, key: Any, nbytes: int, move: str, elapsed: float) -> None:
        if self.log_spilling:
            logger.info("gpudask spill: worker %s moved key %s (%s) %s in %.3f s",
                        self.worker_name, key, format_bytes(nbytes), move, elapsed)

    # -- MutableMapping ------------------------------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        with self.lock:
            if is_device_object(value):
                if key in self.host:
                    del self.host[key]
                # the LRU evicts the least recently used device objects to the host tier
                # until the limit holds; an object larger than the limit goes there at once
                self.device[key] = value
            else:
                if key in self.device:
                    del self.device[key]
                self.host[key] = value

    def __getitem__(self, key: Any) -> Any:
        with self.lock:
            if key in self.device:
                return self.device[key]
            held = self.host[key]
            if not isinstance(held, HostCopy):
                return held
            value = self._restore(key, held)
            if held.device_nbytes <= self.device.n:
                del self.host[key]
                self.device[key] = value  # newest, so others are evicted to make room
            # else: larger than the whole device tier; the caller gets a device copy,
            # the host copy stays where it is
            return value

    def __delitem__(self, key: Any) -> None:
        with self.lock:
            if key in self.device:
                del self.device[key]
            else:
                del self.host[key]

    def __contains__(self, key: object) -> bool:
        with self.lock:
            return key in self.device or key in self.host

    def __iter__(self) -> Iterator[Any]:
        with self.lock:
            keys = list(self.device)
            keys += [k for k in self.host if k not in self.device]
        return iter(keys)

    def __len__(self) -> int:
        with self.lock:
            return len(self.device) + len(self.host)

    def __repr__(self) -> str:
        return (f"<DeviceHostStore: {len(self.device)} key(s), {format_bytes(self.device_bytes)} of "
                f"{format_bytes(self.device_memory_limit)} on device; host tier {type(self.host).__name__} "
                f"with {len(self.host)} key(s)>")

    # -- what distributed reads from a SpillBuffer (the host tier's) ---------------------
    @property
    def fast(self) -> Any:
        """Host memory the memory monitor may move to disk."""
        return getattr(self.host, "fast", self.host)

    @property
    def slow(self) -> Any:
        return self.host.slow  # AttributeError without a disk tier, as distributed expects

    @property
    def spilled_total(self) -> Any:
        return self.host.spilled_total  # AttributeError without a disk tier, as distributed expects

    def evict(self) -> int:
        """Memory monitor: move one host object to disk (-1: nothing can move)."""
        return getattr(self.host, "evict", lambda: -1)()

    def close(self) -> None:
        getattr(self.host, "close", lambda: None)()

    # -- numbers -------------------------------------------------------------------------
    @property
    def device_bytes(self) -> int:
        return int(self.device.total_weight)

    def metrics(self, worker: Any = None) -> dict[str, Any]:
        """The counters (``worker``: what distributed passes a worker metric, unused)."""
        with self.lock:
            return {"device_bytes": self.device_bytes, "device_count": len(self.device),
                    **asdict(self.counters), "limit": self.device_memory_limit}

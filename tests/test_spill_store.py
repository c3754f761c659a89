"""The spill plugin's store: device tier (LRU, limit in bytes) over the worker's own store.

No GPU here: a stand-in "device" class has ``__cuda_array_interface__`` and ``nbytes`` (its
memory is a NumPy buffer), and the serializer CuPy registers with distributed for real
arrays is registered for it below, so eviction and unspilling go through distributed's
serialization exactly as they do for CuPy.  The host tier is distributed's own
``SpillBuffer`` on ``tmp_path`` where disk matters.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from distributed.protocol import dask_deserialize, dask_serialize
from distributed.spill import SpillBuffer

from gpudask.plugins.spill.store import DeviceHostStore, HostCopy, device_nbytes, is_device_object

CALLS = {"to_host": 0, "to_device": 0}


class FakeDeviceArray:
    """Stands in for a GPU array: what the store looks at is the type's
    ``__cuda_array_interface__`` and ``nbytes``."""

    def __init__(self, data: np.ndarray):
        self.data = data

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.data.shape, "typestr": self.data.dtype.str, "data": (self.data.ctypes.data, False),
                "version": 3}

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def sum(self):
        return self.data.sum()


@dask_serialize.register(FakeDeviceArray)
def _to_host(x):
    CALLS["to_host"] += 1
    return {"dtype": x.data.dtype.str, "shape": x.data.shape}, [memoryview(x.data.copy())]


@dask_deserialize.register(FakeDeviceArray)
def _to_device(header, frames):
    CALLS["to_device"] += 1
    data = np.frombuffer(frames[0], dtype=header["dtype"]).reshape(header["shape"]).copy()
    return FakeDeviceArray(data)


class NoSerializer:
    """A device object nothing can move to host (it cannot even be pickled)."""

    __cuda_array_interface__ = {"shape": (10,), "typestr": "|u1", "data": (0, False), "version": 3}
    nbytes = 100

    def __reduce__(self):
        raise TypeError("not picklable")


def dev(n: int, fill: int = 0) -> FakeDeviceArray:
    return FakeDeviceArray(np.full(n, fill, dtype="u1"))


@pytest.fixture
def store():
    return DeviceHostStore({}, 300)


def test_device_objects_are_recognised_by_type_and_shallow_containers():
    assert is_device_object(dev(10)) and is_device_object((dev(10), 1)) and is_device_object({"a": dev(1)})
    assert not is_device_object(np.zeros(10)) and not is_device_object([1, 2]) and not is_device_object("x")
    assert device_nbytes((dev(10), dev(30), np.zeros(1000))) == 40


def test_least_recently_used_objects_move_to_host_first(store):
    for key in "abc":
        store[key] = dev(100, ord(key))
    assert list(store.device) == ["a", "b", "c"] and store.device_bytes == 300 and store.host == {}
    store["a"]  # noqa: B018 - touch: a is now the most recently used
    store["d"] = dev(100)
    assert sorted(store.device) == ["a", "c", "d"] and isinstance(store.host["b"], HostCopy)
    store["e"] = dev(100)
    assert sorted(store.device) == ["a", "d", "e"] and sorted(store.host) == ["b", "c"]
    assert store.device_bytes == 300 and len(store) == 5 and sorted(store) == list("abcde")
    m = store.metrics()
    assert m["spilled_count"] == 2 and m["spilled_bytes"] == 200 and m["device_count"] == 3
    assert m["device_bytes"] == 300 and m["limit"] == 300 and m["spill_seconds"] >= 0


def test_host_copies_hold_host_frames_of_the_right_size(store):
    before = CALLS["to_host"]
    for key in "abcd":
        store[key] = dev(100, ord(key))
    copy = store.host["a"]
    assert CALLS["to_host"] == before + 1 and copy.nbytes == 100 and copy.device_nbytes == 100
    assert all(isinstance(f, (bytes, memoryview)) for f in copy.frames)


def test_access_unspills_to_the_device_and_evicts_another(store):
    for key in "abcd":
        store[key] = dev(100, ord(key))
    before = CALLS["to_device"]
    value = store["a"]
    assert isinstance(value, FakeDeviceArray) and (value.data == ord("a")).all() and value.nbytes == 100
    assert CALLS["to_device"] == before + 1
    assert "a" in store.device and "a" not in store.host and "b" in store.host  # b was least recently used
    assert store.device_bytes == 300
    m = store.metrics()
    assert (m["unspilled_count"], m["unspilled_bytes"], m["spilled_count"]) == (1, 100, 2)
    assert store["a"] is value  # on the device now: no second unspill
    assert store.metrics()["unspilled_count"] == 1


def test_host_objects_bypass_the_device_tier(store):
    store["h"] = np.zeros(10_000)
    store["d"] = dev(100)
    assert "h" in store.host and store.device_bytes == 100 and list(store.device) == ["d"]
    assert store["h"] is store.host["h"]


def test_object_larger_than_the_limit_goes_to_host_at_once_and_is_lent_out_on_access(store):
    store["small"] = dev(100)
    store["big"] = dev(1000, 7)
    assert list(store.device) == ["small"] and isinstance(store.host["big"], HostCopy)
    value = store["big"]
    assert (value.data == 7).all() and "big" in store.host and "big" not in store.device
    assert list(store.device) == ["small"]


def test_overwriting_moves_a_key_between_tiers(store):
    for key in "abcd":
        store[key] = dev(100)
    store["a"] = "now on host"
    assert store.host["a"] == "now on host" and store["a"] == "now on host"
    store["c"] = dev(50)
    assert "c" in store.device and store.device_bytes == 250
    store["a"] = dev(100)
    assert "a" in store.device and "a" not in store.host


def test_deletion_from_either_tier(store):
    for key in "abcd":
        store[key] = dev(100)
    del store["a"]  # on host
    del store["d"]  # on device
    assert "a" not in store and "d" not in store and len(store) == 2 and store.device_bytes == 200
    assert sorted(store) == ["b", "c"]
    with pytest.raises(KeyError):
        del store["a"]
    with pytest.raises(KeyError):
        store["nope"]  # noqa: B018


def test_host_tier_is_distributeds_spill_buffer_down_to_disk(tmp_path):
    """Host memory under distributed's target (here 250 bytes), then disk in the local directory."""
    host = SpillBuffer(str(tmp_path / "storage"), target=250)
    store = DeviceHostStore(host, 200)
    for i in range(6):
        store[f"x{i}"] = dev(100, i)
    # 2 on the device; of the 4 host copies, 2 fit the host target, 2 went to disk
    assert sorted(store.device) == ["x4", "x5"]
    assert len(host.fast) == 2 and len(host.slow) == 2 and sorted(host.slow) == ["x0", "x1"]
    assert store.spilled_total[1] > 0 and len(store.slow) == 2 and list(store.fast) == list(host.fast)
    assert any((tmp_path / "storage").iterdir())
    value = store["x0"]  # from disk, through the host tier, back to the device
    assert (value.data == 0).all() and "x0" in store.device and "x0" not in host
    assert store.metrics()["unspilled_count"] == 1
    # distributed's memory monitor moves host objects to disk through the store
    assert store.evict() > 0 and len(host.slow) >= 2
    del store["x1"]
    assert "x1" not in host and len(store) == 5


def test_without_a_disk_tier_the_monitor_finds_nothing_to_evict(store):
    assert store.evict() == -1
    with pytest.raises(AttributeError):
        store.spilled_total  # noqa: B018 - distributed reads "spilling disabled" from this


def test_a_device_object_without_serializer_stays_as_it_is_and_is_counted(store, caplog):
    store["a"] = dev(100)
    store["b"] = dev(100)
    store["c"] = dev(100)
    with caplog.at_level(logging.WARNING, logger="distributed.worker.gpudask.spill"):
        store["n"] = NoSerializer()
        store["d"] = dev(100)
    # the LRU moved "a" normally; "n" could not be serialised: kept, live, in the host tier
    assert store.host["a"].__class__ is HostCopy
    assert store.metrics()["unspillable_count"] == 0
    store["e"] = dev(100)
    store["f"] = dev(100)
    assert isinstance(store.host["n"], NoSerializer) and store["n"] is store.host["n"]
    assert store.metrics()["unspillable_count"] == 1
    assert "cannot move" in caplog.text and "NoSerializer" in caplog.text


def test_spill_logging_says_what_moved(caplog):
    store = DeviceHostStore({}, 100, log_spilling=True, worker_name="w0")
    with caplog.at_level(logging.INFO, logger="distributed.worker.gpudask.spill"):
        store["a"] = dev(100)
        store["b"] = dev(100)
        store["a"]  # noqa: B018
    assert "worker w0 moved key a (100 B) from device to host" in caplog.text
    assert "worker w0 moved key a (100 B) from host to device" in caplog.text


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_limit_must_be_positive_bytes(limit):
    with pytest.raises(ValueError):
        DeviceHostStore({}, limit)


def test_unspill_retries_once_after_freeing_cupys_cached_blocks(store, monkeypatch):
    """Out of device memory while bringing an object back: CuPy's pool may hold freed blocks
    (a stand-in pool here, as no CuPy runs on this machine); they are released, then retried."""
    import sys
    import types

    released = []
    pool = types.SimpleNamespace(free_bytes=lambda: 512, free_all_blocks=lambda: released.append(True))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(get_default_memory_pool=lambda: pool))
    for key in "abcd":
        store[key] = dev(100, ord(key))
    failures = iter([MemoryError("out_of_memory")])

    def restore_once_failing(self):
        for error in failures:
            raise error
        return FakeDeviceArray(np.full(100, ord("a"), dtype="u1"))

    monkeypatch.setattr(HostCopy, "restore", restore_once_failing)
    assert (store["a"].data == ord("a")).all() and released == [True]
    failures = iter([MemoryError("still out")] * 2)
    with pytest.raises(MemoryError):
        store["b"]  # noqa: B018 - a second failure after the release is the caller's
    assert "b" in store.host  # nothing lost

"""GPU objects in task graphs stay host bytes on the scheduler (part of gpu-graph-data).

distributed unpickles every task graph on the scheduler (``Scheduler.update_graph``) and
pickles each task's ``run_spec`` again for the worker that runs it.  A CuPy argument to
``submit``, the meta of a CuPy-backed collection or a chunk of ``da.from_array(cupy_array)``
then turns into a device array *on the scheduler*: cupy's ``__reduce__`` is
``(cupy._core.core.array, (host_copy,))`` and distributed's own pickler reduces it to
``(distributed.protocol.cupy.dask_deserialize_cupy_ndarray, (header, frames))``.  A
scheduler without a GPU (or without cupy) fails there -- ``cudaErrorNoDevice``, "Error
during deserialization of the task graph" -- and one with a GPU creates a CUDA context and
holds the copy in GPU memory.

Here the scheduler reads graphs with an unpickler whose ``find_class`` answers a *deferred
global* for any name in a deferred module (cupy, cupyx, cudf, rmm, numba.cuda and
distributed's serializers of those, by default): calling it records the call instead of
making it, and the recorded :class:`DeferredCall` pickles as a call of :func:`call_deferred`
with the same module, name, arguments and state.  The worker that unpickles the task makes
the call there, on its GPU: the result is the object the client sent.  The scheduler never
imports those modules, touches a GPU or copies the bytes into device memory.

Only the graph of an ``update-graph`` message is read this way (a context variable set by
the wrapped stream handler); everything else the scheduler's process unpickles -- a client
and a scheduler in one process (``LocalCluster``) included -- is read by distributed's own
``pickle_loads``.  Nothing here imports cupy or distributed's CUDA modules; a worker imports
this module (light: the standard library only) when it unpickles a deferred call.
"""

from __future__ import annotations

import contextvars
import importlib
import io
import pickle
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# The top-level modules whose objects live in GPU memory, and distributed's serializers of
# them: their globals are deferred in a graph the scheduler reads.  A plugin option extends it.
DEFAULT_DEFERRED_MODULES = ("cupy", "cupyx", "cudf", "dask_cudf", "pylibcudf", "rmm", "numba.cuda", "cuml",
                            "cugraph", "cuspatial", "distributed.protocol.cupy", "distributed.protocol.numba",
                            "distributed.protocol.rmm", "distributed.protocol.cuda")

# set while the scheduler reads the graph of one update-graph message (the wrapped handler)
READING_GRAPH: contextvars.ContextVar[bool] = contextvars.ContextVar("gpudask_reading_graph", default=False)


def is_deferred(module: str, deferred: Iterable[str]) -> bool:
    """Is ``module`` (a pickled global's module) one of ``deferred`` or inside one of them?"""
    return any(module == d or module.startswith(d + ".") for d in deferred)


class DeferredGlobal:
    """A global of a deferred module, named but not imported: calling it records the call."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str):
        self.module = module
        self.name = name

    def __call__(self, *args: Any) -> DeferredCall:
        return DeferredCall(self.module, self.name, args)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[str, str]]:
        # a bare reference (a class object in the graph, say): the worker imports it
        return load_global, (self.module, self.name)

    def __repr__(self) -> str:
        return f"<deferred {self.module}.{self.name}>"


class DeferredCall:
    """``module.name(*args)`` as the client pickled it, not made here: host bytes only.

    Pickles as :func:`call_deferred` (state applied after, as pickle's ``BUILD`` would), so
    the worker that unpickles the task makes the call; sized by what it holds, so the
    scheduler's accounting sees the bytes it carries."""

    __slots__ = ("module", "name", "args", "state")

    def __init__(self, module: str, name: str, args: tuple[Any, ...]):
        self.module = module
        self.name = name
        self.args = args
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:  # pickle's BUILD on the deferred object
        self.state = state

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return call_deferred, (self.module, self.name, self.args, self.state)

    def __sizeof__(self) -> int:
        return 64 + sum(_nbytes(a) for a in self.args)

    def __repr__(self) -> str:
        return f"<deferred call {self.module}.{self.name}: {self.__sizeof__()} bytes on the host>"


def _nbytes(value: Any) -> int:
    """Bytes a deferred argument holds (frames, arrays, headers), without importing anything."""
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    if isinstance(value, pickle.PickleBuffer):
        return value.raw().nbytes
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    nbytes = getattr(value, "nbytes", None)  # a NumPy array
    return nbytes if isinstance(nbytes, int) else 0


def _resolve(module: str, name: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in name.split("."):  # a qualified name: Class.method
        obj = getattr(obj, part)
    return obj


def load_global(module: str, name: str) -> Any:
    """What a :class:`DeferredGlobal` is where it is unpickled outside a graph read: the global."""
    return _resolve(module, name)


def call_deferred(module: str, name: str, args: Sequence[Any], state: Any = None) -> Any:
    """Make the call the scheduler deferred: in the worker that runs the task, on its GPU.

    (In a graph the scheduler reads, :class:`DeferringUnpickler` keeps this call deferred too.)"""
    obj = _resolve(module, name)(*args)
    if state is not None:
        setstate = getattr(obj, "__setstate__", None)
        if setstate is not None:
            setstate(state)
        else:  # pickle's BUILD without __setstate__: the instance dict, and slots
            inst_state, slot_state = state if isinstance(state, tuple) and len(state) == 2 else (state, None)
            if inst_state:
                obj.__dict__.update(inst_state)
            for key, value in (slot_state or {}).items():
                setattr(obj, key, value)
    return obj


class DeferringUnpickler(pickle.Unpickler):
    """An unpickler that defers every global of a deferred module (and makes no such call)."""

    def __init__(self, data: bytes | memoryview, deferred: Sequence[str], buffers: Iterable[Any] = ()):
        super().__init__(io.BytesIO(data), buffers=buffers)
        self.deferred = tuple(deferred)

    def find_class(self, module: str, name: str) -> Any:
        if is_deferred(module, self.deferred):
            return DeferredGlobal(module, name)
        if module == __name__ and name == "call_deferred":
            return _call_deferred_here
        return super().find_class(module, name)


def _call_deferred_here(module: str, name: str, args: Sequence[Any], state: Any = None) -> DeferredCall:
    """:func:`call_deferred` met in a graph the scheduler reads: it stays deferred."""
    deferred = DeferredCall(module, name, tuple(args))
    deferred.state = state
    return deferred


def deferring_pickle_loads(original: Callable[[dict[str, Any], list[Any]], Any],
                           deferred: Callable[[], Sequence[str]]) -> Callable[[dict[str, Any], list[Any]], Any]:
    """distributed's ``pickle`` family loader, deferring GPU globals while a graph is read.

    ``original`` is distributed's ``pickle_loads(header, frames)``: used whenever no graph is
    being read.  The buffers are handed over as it hands them (writeable where the header says)."""

    def loads(header: dict[str, Any], frames: list[Any]) -> Any:
        if not READING_GRAPH.get():
            return original(header, frames)
        pik, buffers = frames[0], frames[1:]
        writeable = header.get("writeable") or [False] * len(buffers)
        views = []
        for frame, w in zip(buffers, writeable):
            mv = frame if isinstance(frame, memoryview) else memoryview(frame)
            if w and mv.readonly:
                mv = memoryview(bytearray(mv))
            elif not w and not mv.readonly:
                mv = mv.toreadonly()
            views.append(mv)
        return DeferringUnpickler(pik, deferred(), buffers=views).load()

    return loads

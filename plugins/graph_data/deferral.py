"""GPU objects in task graphs stay host bytes on the scheduler (part of gpu-graph-data).

distributed unpickles every task graph on the scheduler, so a CuPy argument becomes a device array
there (``cudaErrorNoDevice`` without a GPU).  The graph of an ``update-graph`` message is read with
an unpickler that defers the globals of GPU modules: calls are recorded, and pickle again as
:func:`call_deferred`, made by the worker that runs the task.  Standard library only: a worker
imports this when it unpickles a deferred call."""

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

    def __init__(self, module: str, name: str, args: Sequence[Any], state: Any = None):
        self.module = module
        self.name = name
        self.args = tuple(args)
        self.state = state

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


def load_global(module: str, name: str) -> Any:
    """What a :class:`DeferredGlobal` is where it is unpickled outside a graph read: the global."""
    obj: Any = importlib.import_module(module)
    for part in name.split("."):  # a qualified name: Class.method
        obj = getattr(obj, part)
    return obj


def call_deferred(module: str, name: str, args: Sequence[Any], state: Any = None) -> Any:
    """Make the call the scheduler deferred: in the worker that runs the task, on its GPU.

    (In a graph the scheduler reads, :class:`DeferringUnpickler` keeps this call deferred too.)"""
    obj = load_global(module, name)(*args)
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
            return DeferredCall  # met in a graph the scheduler reads: it stays deferred
        return super().find_class(module, name)


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

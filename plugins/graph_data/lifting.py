"""Large GPU objects in a client's graph travel worker-direct (part of gpu-graph-data).

A large CuPy argument pickled into the graph goes host -> scheduler -> worker -> GPU (a second,
where ``scatter(direct=True)`` then ``submit`` takes 21 ms).  :func:`lift` scatters the large GPU
objects of task arguments and materialised layers straight to a worker, the task taking the key
as a dependency; the rest stays in the graph (:mod:`.deferral` keeps it host bytes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .deferral import is_deferred

Scatter = Callable[[dict[str, Any]], dict[str, Any]]  # {key: object} -> {key: Future}, worker-direct


def device_nbytes(obj: Any, deferred_modules: Iterable[str]) -> int | None:
    """The size of ``obj`` if it is a GPU object (None if it is not); imports nothing."""
    cls = type(obj)
    if cls in (int, float, str, bytes, bool, type(None), list, tuple, dict):
        return None
    if not (hasattr(obj, "__cuda_array_interface__") or is_deferred(getattr(cls, "__module__", "") or "",
                                                                     deferred_modules)):
        return None
    try:
        nbytes = obj.nbytes
    except Exception:  # noqa: BLE001 - an object without a size is left where it is
        return None
    if callable(nbytes):  # cudf's memory_usage-like methods
        return None
    return nbytes if isinstance(nbytes, int) and nbytes >= 0 else None


class Lifter:
    """One graph's lift: the objects to scatter, each under a key of its own, found once."""

    def __init__(self, threshold: int, deferred_modules: Iterable[str], prefix: str):
        self.threshold = threshold
        self.deferred_modules = tuple(deferred_modules)
        self.prefix = prefix
        self.found: dict[str, Any] = {}  # key -> object, to scatter
        self._refs: dict[int, Any] = {}  # id(object) -> the TaskRef the rewritten graph holds

    def _ref(self, obj: Any) -> Any:
        from dask._task_spec import TaskRef

        if id(obj) not in self._refs:  # found kept obj alive: its id is not reused meanwhile
            key = f"{self.prefix}-{len(self.found)}"
            self.found[key] = obj
            self._refs[id(obj)] = TaskRef(key)
        return self._refs[id(obj)]

    def large(self, obj: Any) -> bool:
        n = device_nbytes(obj, self.deferred_modules)
        return n is not None and n >= self.threshold

    # -- task arguments ----------------------------------------------------------------------
    def arg(self, value: Any) -> Any:
        """A task argument with its large GPU objects replaced by references (same object if none)."""
        from dask._task_spec import DataNode, Task

        if self.large(value):
            return self._ref(value)
        cls = type(value)
        if cls in (list, tuple):
            items = [self.arg(v) for v in value]
            return value if all(a is b for a, b in zip(items, value)) else cls(items)
        if cls is dict:
            items_d = {k: self.arg(v) for k, v in value.items()}
            return value if all(items_d[k] is value[k] for k in value) else items_d
        if isinstance(value, DataNode):
            inner = value.value
            return self._ref(inner) if self.large(inner) else value
        if isinstance(value, Task):
            return self.task(value)
        return value  # aliases, references, containers of tasks, host data: nothing of ours inside

    def task(self, task: Any) -> Any:
        from dask._task_spec import Task

        args = tuple(self.arg(a) for a in task.args)
        kwargs = {k: self.arg(v) for k, v in task.kwargs.items()}
        if all(a is b for a, b in zip(args, task.args)) and all(kwargs[k] is task.kwargs[k] for k in kwargs):
            return task
        return Task(task.key, task.func, *args, **kwargs)

    # -- graphs --------------------------------------------------------------------------------
    def graph_value(self, key: Any, value: Any) -> Any:
        from dask._task_spec import Alias, DataNode, Task

        inner = value.value if isinstance(value, DataNode) else value
        if self.large(inner):
            return Alias(key, self._ref(inner).key)
        if isinstance(value, Task):
            new = self.task(value)
            return None if new is value else new
        return None

    def mapping(self, graph: Mapping[Any, Any]) -> dict[Any, Any] | None:
        """A graph (key -> task or data) with its large GPU objects lifted, or None if it has none."""
        changed = {k: new for k, v in graph.items() if (new := self.graph_value(k, v)) is not None}
        return {**graph, **changed} if changed else None

    def hlg(self, hlg: Any) -> Any:
        from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

        layers = {}
        changed = False
        for name, layer in hlg.layers.items():
            if type(layer) is MaterializedLayer:
                new = self.mapping(layer.mapping)
                if new is not None:
                    layer = MaterializedLayer(new, annotations=layer.annotations,
                                              collection_annotations=layer.collection_annotations)
                    changed = True
            layers[name] = layer
        return HighLevelGraph(layers, hlg.dependencies) if changed else None

    def expr(self, expr: Any) -> Any:
        """``expr`` (what the client sends: LLGExpr, HLGExpr, sequences of them) rewritten, or None."""
        from dask._expr import Expr
        from dask.highlevelgraph import HighLevelGraph

        operands = list(expr.operands)
        changed = False
        for i, operand in enumerate(operands):
            new: Any = None
            if isinstance(operand, Expr):
                new = self.expr(operand)
            elif isinstance(operand, HighLevelGraph):
                new = self.hlg(operand)
            elif type(operand) is dict:
                new = self.mapping(operand)
            if new is not None:
                operands[i] = new
                changed = True
        if not changed:
            return None
        # the same token, so the same names: the client already made futures for its output keys
        return type(expr)(*operands, _determ_token=expr.deterministic_token)


def lift(expr: Any, scatter: Scatter, threshold: int, deferred_modules: Iterable[str], prefix: str
         ) -> tuple[Any, dict[str, Any]]:
    """``expr`` with its large GPU objects scattered by ``scatter``; and the scattered futures.

    The futures must live until the graph reaches the scheduler (the caller keeps them for
    the call): the graph's tasks then hold the keys as dependencies."""
    lifter = Lifter(threshold, deferred_modules, prefix)
    new = lifter.expr(expr)
    if new is None or not lifter.found:
        return expr, {}
    return new, scatter(lifter.found)

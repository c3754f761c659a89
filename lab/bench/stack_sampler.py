"""Where a process's Python threads spend a benchmark's time: a sampling profiler of every thread.

cProfile sees one thread, and a distributed client's work happens in another (the event loop's, and
the offload thread's when the scheduler shares the process, as in ``LocalCluster``).  This reads
every other thread's stack (``sys._current_frames``) every ``interval`` seconds while it runs, and
counts, per thread name, how often each function is on the stack (inclusive) and at its top
(exclusive).  Sampling takes the GIL briefly; run it on both sides of a comparison alike.
No third-party profiler: the GPU machine has none, and this needs nothing but the standard library.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any


def _where(code: Any) -> str:
    parts = code.co_filename.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{code.co_name}:{code.co_firstlineno}"


class StackSampler:
    """Start and stop as often as wanted (``with sampler:``); counts add up until :meth:`result`."""

    def __init__(self, interval: float = 0.002, max_depth: int = 200):
        self.interval = interval
        self.max_depth = max_depth
        self.samples: collections.Counter[str] = collections.Counter()
        self.inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.exclusive: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StackSampler:
        self._stop.clear()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.seconds += time.perf_counter() - self._t0

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, f"thread-{ident}")
                self.samples[name] += 1
                self.exclusive[name][_where(frame.f_code)] += 1
                seen = set()
                depth = 0
                while frame is not None and depth < self.max_depth:
                    seen.add(_where(frame.f_code))
                    frame = frame.f_back
                    depth += 1
                for where in seen:
                    self.inclusive[name][where] += 1

    def result(self, top: int = 40) -> dict[str, Any]:
        """Per thread: its samples, and its ``top`` functions by inclusive and by exclusive count."""
        return {"interval_s": self.interval, "sampled_s": round(self.seconds, 3),
                "threads": {name: {"samples": n,
                                   "inclusive": self.inclusive[name].most_common(top),
                                   "exclusive": self.exclusive[name].most_common(top)}
                            for name, n in self.samples.most_common()}}

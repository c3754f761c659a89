"""Facts: what this host is (docs/architecture.md, "Facts"): read from a facts file
(:mod:`~gpudask.facts.loader`) or probed (:mod:`~gpudask.facts.probe`; the plugins' sections:
:mod:`~gpudask.facts.sections`).  Importing this package never touches CUDA.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpudask.errors import FactsError
from gpudask.facts.loader import SCHEMA_PATH, facts_from_dict, load_facts, parse_json, schema
from gpudask.facts.model import GPU, SCHEMA_VERSION, Facts
from gpudask.facts.probe import probe_facts

__all__ = ["GPU", "Facts", "FactsError", "SCHEMA_VERSION", "SCHEMA_PATH", "schema", "facts_from_dict",
           "load_facts", "probe_facts", "get_facts", "clear_cache"]


_cached_file = functools.lru_cache(maxsize=None)(load_facts)


@functools.lru_cache(maxsize=None)
def _cached_env(text: str) -> Facts:
    return facts_from_dict(parse_json(text, "$GPUDASK_PROBED_FACTS"), "probed", "$GPUDASK_PROBED_FACTS")


@functools.lru_cache(maxsize=None)
def _cached_probe(packages: tuple[tuple[str, tuple[str, ...]], ...]) -> Facts:
    return probe_facts(dict(packages))


def get_facts(path: str | os.PathLike[str] | None = None,
              packages: Mapping[str, Sequence[str]] | None = None) -> Facts:
    """Facts for this process, cached: ``path`` > $GPUDASK_FACTS > $GPUDASK_PROBED_FACTS > a
    probe (``packages``: the plugins', beside the core's).  ``cuda_visible_devices`` is this
    process's (a nanny gives each worker its own)."""
    path = path or os.environ.get("GPUDASK_FACTS") or None
    if path:
        return _cached_file(os.fspath(path))
    text = os.environ.get("GPUDASK_PROBED_FACTS")
    wanted = tuple((key, tuple(dists)) for key, dists in (packages or {}).items())
    facts = _cached_env(text) if text else _cached_probe(wanted)
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if facts.cuda_visible_devices != cvd:
        facts = replace(facts, cuda_visible_devices=cvd)
    return facts


def clear_cache() -> None:
    from gpudask import session

    session.current().probed_sections.clear()  # the plugins' sections (gpudask.facts.sections)
    _cached_file.cache_clear()
    _cached_env.cache_clear()
    _cached_probe.cache_clear()

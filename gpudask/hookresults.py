"""What a plugin's hook returned, checked before the core uses it.

Each function takes one plugin's result of one hook and returns what is wrong with it, in
the words of the one-line :class:`~gpudask.errors.PluginError` the manager raises (or the
problem line a report shows), or None when the result is what the hook's specification in
:mod:`gpudask.hookspecs` asks for; :func:`findings_of` turns a check's result into findings,
whatever it holds.  Nothing here calls a plugin.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from gpudask.config import Option
from gpudask.findings import Finding
from gpudask.plan.values import value_problem


def options_problem(result: Any) -> str | None:
    """``gpudask_config_options``: None or a list of Options whose keys are under ``gpudask.``."""
    if result is not None and not isinstance(result, (list, tuple)):
        return (f"returned a {type(result).__name__} ({result!r:.60}); expected a list of "
                "gpudask.pluginapi.Option")
    for opt in result or []:
        if not isinstance(opt, Option) or not opt.key.startswith("gpudask."):
            return f"options must be gpudask.pluginapi.Option with keys under 'gpudask.', got {opt!r}"
    return None


def facts_packages_problem(result: Any) -> str | None:
    """``gpudask_facts_packages``: None or ``{key: [distribution, ...]}`` of non-empty strings."""
    if result is None:
        return None
    if not isinstance(result, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, (list, tuple)) and v and all(isinstance(d, str) for d in v)
            for k, v in result.items()):
        return f"returned {result!r:.80}; expected {{key: [distribution, ...]}} of strings"
    return None


def ucx_offered_problem(result: Any) -> str | None:
    """``gpudask_ucx_offered``: None or a list of transport names."""
    if result is None:
        return None
    if not isinstance(result, (list, tuple)) or not all(isinstance(t, str) for t in result):
        return f"returned {result!r:.80}; expected a list of transport names (strings) or None"
    return None


def setup_memory_problem(result: Any) -> str | None:
    """``gpudask_setup_memory``: None or a dict of JSON values (the worker publishes it: refused
    here, not on the wire)."""
    if result is None:
        return None
    problem = value_problem(result) if isinstance(result, Mapping) else f"a {type(result).__name__}"
    if problem is not None:
        return f"returned {problem}; expected None or a dict of JSON values"
    return None


def applied_state_problem(result: Any) -> str | None:
    """``gpudask_applied_state``: None, or ``{key: {"planned": value, "actual": value}}``."""
    if not result:
        return None
    problem = _applied_state_shape(result)
    if problem is not None:
        return f"returned {problem}; expected None or a dict {{key: {{'planned': value, 'actual': value}}}}"
    return None


def _applied_state_shape(result: Any) -> str | None:
    if not isinstance(result, Mapping):
        return f"a {type(result).__name__}"
    for key, pair in result.items():
        if not isinstance(key, str):
            return f"a {type(key).__name__} key {key!r:.60}"
        if not isinstance(pair, Mapping):
            return f"{type(pair).__name__} for key {key!r:.60}"
        if "planned" not in pair or "actual" not in pair:
            return f"{sorted(map(str, pair))!r:.80} for key {key!r:.60}"
    # NaN is allowed (the page shows it as text); an integer msgpack cannot carry is not
    return value_problem(dict(result), finite=False)


def findings_of(plugin: str, result: Any) -> list[Finding]:
    """``gpudask_scheduler_check``: its findings (dicts of the published form read back), each
    naming ``plugin`` unless it names another; anything else becomes a ``plugin-failed`` finding."""
    out = []
    for finding in result or []:
        if isinstance(finding, dict) and Finding.is_finding_dict(finding):
            finding = Finding.from_dict(finding)
        if not isinstance(finding, Finding):
            finding = Finding("warning", "plugin-failed", f"the check could not finish: plugin returned "
                              f"{type(finding).__name__}, not a gpudask.pluginapi.Finding", plugin=plugin)
        finding.plugin = finding.plugin or plugin
        out.append(finding)
    return out


REPORT_ROW_KEYS: dict[str, type | tuple[type, ...]] = {"column": str, "summary": str, "note": (str, type(None)),
                                                      "bytes": bool, "keys": (list, tuple)}


def report_rows_problem(result: Any) -> str | None:
    """``gpudask_report_rows``: None or a list of rows, each a dict with a string ``column``."""
    if result is None:
        return None
    if not isinstance(result, (list, tuple)):
        return f"returned a {type(result).__name__}; expected None or a list of rows"
    for row in result:
        if not isinstance(row, Mapping) or not isinstance(row.get("column"), str) or not isinstance(
                row.get("summary", ""), str):
            return f"a row {row!r:.80} is not a dict with a string 'column' and 'summary'"
        for key, kinds in REPORT_ROW_KEYS.items():
            if key in row and not isinstance(row[key], kinds):
                return f"a row's {key!r} is a {type(row[key]).__name__}"
    return None


_COLUMNS_WARNED: set[tuple[str, str, str]] = set()


def warn_column_twice(column: str, first: str, second: str) -> None:
    """A report column two plugins name: the first keeps it, said once per process."""
    if (column, first, second) in _COLUMNS_WARNED:
        return
    _COLUMNS_WARNED.add((column, first, second))
    warnings.warn(f"report column {column!r} of plugin {second!r} left out: plugin {first!r} (earlier in "
                  "priority order) already has a column of that name; accepted: a column name of its own",
                  UserWarning, stacklevel=3)

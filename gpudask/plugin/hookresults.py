"""What a plugin's hook returned, checked and copied into plain data before the core uses it.

:func:`take` runs inside the call's isolation (:func:`gpudask.plugin.hookcall.call_isolated`), so
whatever plugin code the check or the copy runs (a ``__str__``, a mapping's ``items``) is bounded
there, and what leaves the call cannot turn into plugin code on an event loop.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from gpudask.config import Option
from gpudask.errors import GpudaskError
from gpudask.findings import SEVERITIES, Finding
from gpudask.plaindata import MAX_STR, NotPlain, plain, text, type_name
from gpudask.plan.values import ACCEPTED, value_problem

MAX_FINDINGS = 1000  # findings of one plugin's check; the rest are counted in one more


def options_problem(result: Any) -> str | None:
    """``gpudask_config_options``: a list of Options whose keys are under ``gpudask.``."""
    if not isinstance(result, (list, tuple)):
        return (f"returned a {type(result).__name__} ({result!r:.60}); expected a list of "
                "gpudask.pluginapi.Option")
    for opt in result:
        if not isinstance(opt, Option) or not opt.key.startswith("gpudask."):
            return f"options must be gpudask.pluginapi.Option with keys under 'gpudask.', got {opt!r}"
    return None


def _returned(what: str, found: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    """A check whose message is ``returned <what found() says is wrong>; expected <what>``."""
    def problem(result: Any) -> str | None:
        wrong = found(result)
        return None if wrong is None else f"returned {wrong}; expected {what}"
    return problem


def _expected(what: str, fits: Callable[[Any], Any]) -> Callable[[Any], str | None]:
    """A check whose message is ``returned <the result>; expected <what>``."""
    return _returned(what, lambda result: None if fits(result) else f"{result!r:.80}")


def _strings(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value)


# gpudask_facts_packages: {key: [distribution, ...]} of non-empty strings
facts_packages_problem = _expected("{key: [distribution, ...]} of strings", lambda result: isinstance(
    result, Mapping) and all(isinstance(k, str) and k and _strings(v) and v for k, v in result.items()))
ucx_offered_problem = _expected("a list of transport names (strings) or None", _strings)
# gpudask_setup_memory: a dict of JSON values (the worker publishes it: refused here, not on the wire)
setup_memory_problem = _returned("None or a dict of JSON values", lambda result: value_problem(
    result) if isinstance(result, Mapping) else f"a {type(result).__name__}")
applied_state_problem = _returned("None or a dict {key: {'planned': value, 'actual': value}}",
                                  lambda result: _applied_state_shape(result) if result else None)


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
    """``gpudask_scheduler_check``: its findings (Findings, or dicts of the published form),
    each a new :class:`Finding` of exact strings and plain details, naming ``plugin`` unless it
    names another; anything else becomes a ``plugin-failed`` finding."""
    if result is None:
        return []
    if not isinstance(result, (list, tuple)):
        return [_not_a_finding(plugin, result)]
    items = list.__iter__(result) if isinstance(result, list) else tuple.__iter__(result)
    out: list[Finding] = []
    more = 0
    for item in items:
        if len(out) >= MAX_FINDINGS:
            more += 1
            continue
        if isinstance(item, Finding):
            fields = {name: getattr(item, name) for name in _FINDING_FIELDS}
        elif isinstance(item, dict) and Finding.is_finding_dict(plain(item)):
            fields = plain(item)
        else:
            out.append(_not_a_finding(plugin, item))
            continue
        out.append(_plain_finding(plugin, fields))
    if more:
        out.append(Finding("warning", "too-many-findings", f"... and {more} more finding(s) of this plugin left out "
                           f"(the first {MAX_FINDINGS} are kept)", plugin=plugin, details={"more": more}))
    return out


_FINDING_FIELDS = ("severity", "code", "message", "plugin", "subject", "reference", "details")


def _plain_finding(plugin: str, fields: Mapping[str, Any]) -> Finding:
    severity = fields.get("severity")
    severity = severity if isinstance(severity, str) and str.__str__(severity) in SEVERITIES else "warning"
    named = fields.get("plugin")
    details = plain(fields.get("details"))

    def optional(value: Any) -> str | None:
        return None if value is None else text(value, 1000)

    return Finding(str.__str__(severity), text(fields.get("code", ""), 200), text(fields.get("message", ""), MAX_STR),
                   plugin=text(named, 200) if isinstance(named, str) and named else plugin,
                   subject=optional(fields.get("subject")), reference=optional(fields.get("reference")),
                   details=details if isinstance(details, dict) else {})


def _not_a_finding(plugin: str, item: Any) -> Finding:
    return Finding("warning", "plugin-failed", f"the check could not finish: plugin returned "
                   f"{type_name(item)}, not a gpudask.pluginapi.Finding", plugin=plugin)


REPORT_ROW_KEYS: dict[str, type | tuple[type, ...]] = {"column": str, "summary": str, "note": (str, type(None)),
                                                      "bytes": bool, "keys": (list, tuple)}


def report_rows_problem(result: Any) -> str | None:
    """``gpudask_report_rows``: a list of rows, each a dict with a string ``column``."""
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


@functools.cache  # said once per process
def warn_column_twice(column: str, first: str, second: str) -> None:
    """A report column two plugins name: the first keeps it."""
    warnings.warn(f"report column {column!r} of plugin {second!r} left out: plugin {first!r} (earlier in "
                  "priority order) already has a column of that name; accepted: a column name of its own",
                  UserWarning, stacklevel=3)


class ResultProblem(GpudaskError):
    """What is wrong with a result (the cause of the manager's one-line PluginError)."""


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
MAX_PREIMPORT = 32


def preimport_problem(result: Any) -> str | None:
    """``gpudask_preimport``: a list of at most 32 dotted module names."""
    if (not isinstance(result, list) or len(result) > MAX_PREIMPORT
            or not all(isinstance(m, str) and len(m) <= 200 and _MODULE_NAME.fullmatch(m) for m in result)):
        return (f"returned {result!r:.80}; expected None or a list of at most {MAX_PREIMPORT} "
                "dotted module names such as ['numpy', 'scipy.linalg']")
    if any(m == "gpudask" or m.startswith("gpudask.") for m in result):
        return f"returned {result!r:.80}; a module of gpudask cannot be imported ahead (its import applies the plan)"
    return None


_PROTOCOL_NAME = re.compile(r"[a-z][a-z0-9+.-]{0,15}")
likely_protocol_problem = _expected("None or a protocol name such as 'ucx' or 'tcp'",
                                    lambda result: isinstance(result, str) and _PROTOCOL_NAME.fullmatch(result))


def _strict(result: Any) -> Any:
    try:
        return plain(result, strict=True)
    except NotPlain as e:
        raise ResultProblem(f"returned {e}; {ACCEPTED}") from None


def _rows(result: Any) -> Any:
    # the rows as the page and `gpudask status` show them: plain, an object's value as its text
    return [r for r in plain(result) if isinstance(r, dict)]


# hook -> (what is wrong with a result, the result made plain)
_TAKE: dict[str, tuple[Callable[[Any], str | None], Callable[[Any], Any]]] = {
    "gpudask_config_options": (options_problem, list),
    "gpudask_facts_packages": (facts_packages_problem, _strict),
    "gpudask_ucx_offered": (ucx_offered_problem, _strict),
    "gpudask_preimport": (preimport_problem, _strict),
    "gpudask_likely_protocol": (likely_protocol_problem, _strict),
    "gpudask_setup_memory": (setup_memory_problem, _strict),
    "gpudask_applied_state": (applied_state_problem, _strict),
    "gpudask_report_rows": (report_rows_problem, _rows),
}


def take(hook: str, plugin: str, result: Any) -> Any:
    """One plugin's result of ``hook``, checked and copied into plain data (None, every hook's
    "nothing": as it is).

    :raises ResultProblem: with the one line of what is wrong."""
    if hook == "gpudask_scheduler_check":
        return findings_of(plugin, result)
    if result is None or hook not in _TAKE:
        return result
    problem, made_plain = _TAKE[hook]
    found = problem(result)
    if found is not None:
        raise ResultProblem(found)
    return made_plain(result)

"""The plan of one host, and its file format (``to_json`` / ``from_json``; docs/architecture.md,
"The host plan file"): what ``gpudask info`` prints and what a planning process hands its
workers, with its resolved settings, so a worker bootstraps nothing.  :func:`parse_document`
trusts nothing in the file: every field of the expected type, or one line (:class:`PlanFileError`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudask.config import shown
from gpudask.config_files import kind
from gpudask.errors import FactsError, GpudaskError
from gpudask.plan.model import ROLES, ProcessPlan

if TYPE_CHECKING:
    from gpudask.facts import Facts
    from gpudask.plan.context import PlanContext
    from gpudask.plan.inputs import PlanInputs

FORMAT = 1  # the version of the host plan file this gpudask writes and reads
MAX_PLAN_BYTES = 64 * 2**20  # a host plan larger than this is not one gpudask wrote
_ACCEPTED = f"accepted: a host plan written by gpudask (format {FORMAT})"


class PlanFileError(GpudaskError):
    """A host plan document gpudask cannot read (one line: where, what, what is accepted)."""


@dataclass(frozen=True)
class UserValues:
    """The user's own value (None: not set) of every variable and dask config key any process
    of a plan sets, put back by a worker process before it applies its part."""

    env: Mapping[str, str | None] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {"env": dict(self.env), "config": dict(self.config)}


@dataclass(frozen=True)
class PlanDocument:
    """A host plan file :func:`parse_document` accepted, its parts parsed."""

    facts: Facts
    protocol: str
    nworkers: int
    plugins: list[dict[str, Any]]
    warnings: list[str]
    processes: list[ProcessPlan]  # scheduler, nanny, client, then the workers
    user_values: UserValues
    # the planning process's resolved settings: {key: {"value": ..., "source": str}}
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class HostPlan:
    """The plan for one host: every process gpudask may run in."""

    facts: Facts
    protocol: str
    nworkers: int
    plugins: list[dict[str, Any]]
    scheduler: ProcessPlan
    nanny: ProcessPlan
    client: ProcessPlan
    workers: list[ProcessPlan]
    warnings: list[str] = field(default_factory=list)
    user_values: UserValues = field(default_factory=UserValues)
    # the context it was built (or read) with: its settings, its plugin manager
    ctx: PlanContext = field(kw_only=True, repr=False, compare=False)

    def __str__(self) -> str:
        return f"host plan for {self.facts.hostname} ({self.protocol}, {self.nworkers} workers)"

    def processes(self) -> list[ProcessPlan]:
        return [self.scheduler, self.nanny, self.client, *self.workers]

    def for_role(self, role: str, index: int | None = None) -> ProcessPlan:
        if role == "worker":
            return self.workers[(index or 0) % len(self.workers)]
        return {"scheduler": self.scheduler, "nanny": self.nanny, "client": self.client}[role]

    def to_dict(self) -> dict[str, Any]:
        """What ``gpudask info --json`` prints."""
        return {
            "facts": self.facts.to_dict(),
            "facts_origin": self.facts.origin,
            "protocol": self.protocol,
            "nworkers": self.nworkers,
            "plugins": self.plugins,
            "warnings": list(self.warnings),
            "scheduler": self.scheduler.to_dict(),
            "nanny": self.nanny.to_dict(),
            "client": self.client.to_dict(),
            "workers": [w.to_dict() for w in self.workers],
        }

    def to_json(self) -> str:
        """The host plan file (a config value JSON cannot hold is written as its ``str``)."""
        data = self.to_dict()
        return json.dumps({"format": FORMAT, **data, "user_values": self.user_values.to_dict(),
                           "settings": self.ctx.settings.resolved(), "facts_digest": facts_digest(data["facts"])},
                          default=str)

    @classmethod
    def from_json(cls, text: str | bytes, inputs: PlanInputs, where: str = "host plan") -> HostPlan:
        """The plan in ``text``, with a context made of ``inputs``.  :raises PlanFileError:"""
        return cls.from_document(parse_document(text, where), inputs)

    @classmethod
    def from_document(cls, doc: PlanDocument, inputs: PlanInputs) -> HostPlan:
        """A document :func:`parse_document` accepted, as a plan (``inputs``: the reading process's)."""
        from gpudask.plan.context import PlanContext

        ctx = PlanContext(doc.facts, inputs.settings, doc.protocol, doc.nworkers, user_env=inputs.user_env,
                          user_config=inputs.user_config, manager=inputs.manager)
        scheduler, nanny, client, *workers = doc.processes
        return cls(doc.facts, doc.protocol, doc.nworkers, list(doc.plugins), scheduler, nanny, client, workers,
                   list(doc.warnings), doc.user_values, ctx=ctx)


def _list_of(kind: type) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(isinstance(v, kind) for v in value)


# the plain keys of a host plan file, checked in this order: (test, what is accepted)
_TOP_LEVEL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "protocol": (lambda value: isinstance(value, str), "a string"),
    "nworkers": (lambda value: type(value) is int and value >= 1, "an integer >= 1"),
    "facts_origin": (lambda value: isinstance(value, str), "a string"),
    "plugins": (_list_of(dict), "a list of objects"),
    "warnings": (_list_of(str), "a list of strings"),
    "workers": (_list_of(dict), "a list of objects"),
}


def parse_document(text: str | bytes, where: str = "host plan") -> PlanDocument:
    """Validate a host plan file and parse its parts.

    :raises PlanFileError: one line: ``where``, what was wrong, what is accepted."""
    if len(text) > MAX_PLAN_BYTES:
        raise PlanFileError(f"{where}: {len(text)} bytes, over the {MAX_PLAN_BYTES}-byte limit; {_ACCEPTED}")
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        at = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        raise PlanFileError(f"{where}: not valid JSON{at}; {_ACCEPTED}") from None
    if not isinstance(doc, dict):
        raise PlanFileError(f"{where}: the top level is {kind(doc)}; {_ACCEPTED}, a JSON object")
    version = doc.get("format")
    if version != FORMAT or isinstance(version, bool):
        said = "has no 'format'" if "format" not in doc else f"has format {_shown(version)}"
        raise PlanFileError(f"{where}: {said}, which this gpudask does not read; {_ACCEPTED} (a planning "
                            "process and its workers must run the same gpudask)")
    for key, (ok, accepted) in _TOP_LEVEL.items():
        if not ok(doc.get(key)):
            raise _wrong(where, key, doc.get(key), accepted)
    if len(doc["workers"]) != doc["nworkers"]:
        raise PlanFileError(f"{where}: key 'workers' holds {len(doc['workers'])} plans for nworkers "
                            f"{doc['nworkers']}; accepted: one plan per worker")
    settings = _settings(doc.get("settings"), where)
    try:
        from gpudask.facts.loader import facts_from_dict

        # the planning process validated these facts before it wrote them: the same bytes need
        # no second schema validation; anything else is validated in full
        checked = isinstance(doc.get("facts_digest"), str) and doc["facts_digest"] == facts_digest(doc.get("facts"))
        facts = facts_from_dict(doc.get("facts"), doc["facts_origin"], f"{where}, key 'facts'", checked)
    except FactsError as e:
        raise PlanFileError(f"{e}; {_ACCEPTED}") from None
    plans = [("scheduler", doc.get("scheduler")), ("nanny", doc.get("nanny")), ("client", doc.get("client"))]
    plans += [(f"workers[{i}]", w) for i, w in enumerate(doc["workers"])]
    processes = [_process(data, key, where) for key, data in plans]
    return PlanDocument(facts, doc["protocol"], doc["nworkers"], doc["plugins"], doc["warnings"], processes,
                        _user_values(doc.get("user_values"), where), settings)


def facts_digest(facts: Any) -> str:
    """SHA-256 of ``facts`` (parsed JSON) in one canonical form."""
    try:
        text = json.dumps(facts, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return ""  # not JSON facts: never the digest of validated ones
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _settings(data: Any, where: str) -> dict[str, dict[str, Any]]:
    accepted = 'an object {key: {"value": ..., "source": a string}}'
    if not isinstance(data, dict):
        raise _wrong(where, "settings", data, accepted)
    for key, item in data.items():
        if not (isinstance(item, dict) and set(item) == {"value", "source"} and isinstance(item["source"], str)):
            raise _wrong(where, f"settings.{key}", item, '{"value": ..., "source": a string}')
    return dict(data)


def _process(data: Any, key: str, where: str) -> ProcessPlan:
    expected = key.split("[")[0].removesuffix("s")
    if not isinstance(data, dict):
        raise _wrong(where, key, data, "a process plan (a JSON object)")
    if data.get("role") != expected or data.get("role") not in ROLES:
        raise _wrong(where, f"{key}.role", data.get("role"), repr(expected))
    for name, kind, accepted in (("env", dict, "an object of strings"), ("config", dict, "an object"),
                                 ("reasons", list, "a list of reasons")):
        if not isinstance(data.get(name, kind()), kind):
            raise _wrong(where, f"{key}.{name}", data.get(name), accepted)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in data.get("env", {}).items()):
        raise _wrong(where, f"{key}.env", data.get("env"), "an object of strings")
    for i, reason in enumerate(data.get("reasons", [])):
        if not (isinstance(reason, dict) and set(reason) == {"plugin", "decision", "why"}
                and all(isinstance(v, str) for v in reason.values())):
            raise _wrong(where, f"{key}.reasons[{i}]", reason, "an object of strings plugin, decision, why")
    try:
        return ProcessPlan.from_dict(data)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise PlanFileError(f"{where}: key '{key}' is not a process plan ({type(e).__name__}: {e}); "
                            f"{_ACCEPTED}") from None


def _user_values(data: Any, where: str) -> UserValues:
    if not (isinstance(data, dict) and set(data) == {"env", "config"} and isinstance(data["env"], dict)
            and isinstance(data["config"], dict)):
        raise _wrong(where, "user_values", data, 'an object {"env": {...}, "config": {...}}')
    if not all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in data["env"].items()):
        raise _wrong(where, "user_values.env", data["env"], "an object of strings or nulls")
    return UserValues(dict(data["env"]), dict(data["config"]))


def _wrong(where: str, key: str, value: Any, accepted: str) -> PlanFileError:
    return PlanFileError(f"{where}: key '{key}' is {_shown(value)}; accepted: {accepted}")


def _shown(value: Any) -> str:
    return "missing (or null)" if value is None else shown(value)

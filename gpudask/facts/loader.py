"""Reading a facts file (a described host) against the shipped JSON Schema.

``facts.schema.json`` (next to this module, shipped in the wheel) is the one
definition of the format: the loader validates with it, the tests check every file in
``tests/hosts/`` with it, and docs/facts.md describes it.  The schema holds, for every
key, an ``x-accepts`` text; an error is one line naming the file, the key path and that
text.  What JSON Schema cannot say (unique GPU indices, CPUs below ``cpu_count``,
``cuda_visible_devices`` entries) is checked here after it.

Schema 2 holds the core's facts; the plugins' own facts are its ``sections``
(:mod:`gpudask.facts.sections`).  A file of the pre-release schema 1 is refused with one line
saying to rewrite it as schema 2.

``jsonschema`` is imported when a file is first read, never at ``import gpudask``.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import os
import pathlib
import stat
from collections.abc import Iterable
from typing import Any

from gpudask.errors import FactsError
from gpudask.facts.model import GPU, SCHEMA_VERSION, Facts, resolve_visible

SCHEMA_PATH = pathlib.Path(__file__).with_name("facts.schema.json")

# A facts file describes one host in a few kilobytes; anything larger is refused unread
# (docs/facts.md states the limit).
MAX_FACTS_BYTES = 16 * 2**20


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The facts JSON Schema (draft 2020-12) as shipped with gpudask."""
    data: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return data


@functools.lru_cache(maxsize=1)
def strict_validator() -> Any:
    """Draft 2020-12, where an integer is a Python int (JSON Schema counts 1.0 as an
    integer; a facts file means an int, never a bool): the validator class of the facts
    schema and of the plugins' facts sections."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    return jsonschema.validators.extend(base, type_checker=checker)


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    return strict_validator()(schema())


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def _key(path: Iterable[Any]) -> str:
    """('gpus', 1, 'memory_total') -> 'gpus[1].memory_total'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# the same facts are read again and again (every worker's published facts, at every check):
# data that passed the schema once passes again
_VALID: set[bytes] = set()


def _schema_error(where: str, data: Any) -> FactsError | None:
    """The first schema violation in ``data`` as a one-line FactsError, or None."""
    from gpudask.findings import fingerprint

    # msgpack, not json.dumps(sort_keys=True): a third of the time, and {1: x} is not {"1": x}
    key = fingerprint(data)
    if key is not None and key in _VALID:
        return None
    error = _first_schema_error(where, data)
    if error is None and key is not None and len(_VALID) < 256:
        _VALID.add(key)
    return error


def _first_schema_error(where: str, data: Any) -> FactsError | None:
    if isinstance(data, dict) and type(data.get("schema")) is int and data["schema"] == 1:
        # the pre-release format (plugins' facts as GPU and top-level keys): not read any more
        return FactsError(f"{where}: key 'schema' is 1, a format gpudask no longer reads; rewrite the file as "
                          f"schema {SCHEMA_VERSION} (the plugins' facts move into 'sections': docs/facts.md)")
    return first_error(_validator(), data, where)


def first_error(validator: Any, data: Any, where: str, prefix: Iterable[Any] = ()) -> FactsError | None:
    """The first violation of ``validator``'s schema in ``data`` as a one-line FactsError
    naming ``where`` and the key path (under ``prefix``), or None."""
    # a wrong value before a missing key, the outermost first, keys in a stable order
    errors = sorted(validator.iter_errors(data),
                    key=lambda e: (e.validator == "required", len(e.absolute_path), str(list(e.absolute_path))))
    if not errors:
        return None
    error = errors[0]
    path = [*prefix, *error.absolute_path]
    if error.validator == "required":
        missing = next(k for k in error.validator_value if k not in error.instance)
        sub = error.schema.get("properties", {}).get(missing, {})
        expected = sub.get("x-missing") or sub.get("x-accepts") or "a value"
        return FactsError(f"{where}: key {_key([*path, missing])!r} is missing (expected {expected})")
    if not path:
        return FactsError(f"{where}: must hold {error.schema.get('x-accepts', 'a JSON object')}, got "
                          f"{_show(error.instance)}")
    # the innermost schema with an x-accepts text along the failing keyword's path
    accepts = error.schema.get("x-accepts")
    if accepts is None:
        accepts = f"{error.validator} {error.validator_value!r}"
        for parent in _parents(error):
            if "x-accepts" in parent:
                accepts = parent["x-accepts"]
                break
    return FactsError(f"{where}: key {_key(path)!r} must be {accepts}, got {_show(error.instance)}")


def _parents(error: Any) -> list[dict[str, Any]]:
    out = []
    while error is not None:
        if isinstance(error.schema, dict):
            out.append(error.schema)
        error = error.parent
    return out


def _fail(where: str, key: str, expected: str, value: Any) -> FactsError:
    return FactsError(f"{where}: key {key!r} must be {expected}, got {_show(value)}")


def _cross_checks(data: dict[str, Any], where: str, described: bool) -> None:
    """What the schema cannot say: references between keys.  CPU numbers are checked in
    described files only: a probe reports what NVML says, whatever numbering the kernel uses."""
    gpus = data["gpus"]
    indices = [g["index"] for g in gpus]
    cpu_count = data["cpu_count"]
    for i, g in enumerate(gpus):
        if g["index"] in indices[:i]:
            raise _fail(where, f"gpus[{i}].index", "unique among the GPUs", g["index"])
    for i, g in enumerate(gpus):
        for j, cpu in enumerate(g["cpu_affinity"] if described else []):
            if cpu >= cpu_count:
                raise _fail(where, f"gpus[{i}].cpu_affinity[{j}]", f"a CPU below cpu_count ({cpu_count})", cpu)


def _pair(value: list[int] | None) -> tuple[int, int] | None:
    return None if value is None else (value[0], value[1])


def _build(data: dict[str, Any], origin: str) -> Facts:
    gpus = [
        GPU(
            index=g["index"], uuid=g["uuid"], name=g["name"], memory_total=g["memory_total"],
            compute_capability=_pair(g["compute_capability"]),
            pci_bus_id=g["pci_bus_id"], pci_path=g["pci_path"], numa_node=g["numa_node"],
            cpu_affinity=list(g["cpu_affinity"]),
            # extra instance keys (gpu_instance_id, ...) are kept; extra GPU keys are not
            mig={"enabled": g["mig"]["enabled"], "instances": copy.deepcopy(g["mig"]["instances"])},
        )
        for g in data["gpus"]
    ]
    return Facts(
        hostname=data["hostname"],
        cpu_count=data["cpu_count"],
        driver_version=data["driver_version"],
        cuda_driver_version=data["cuda_driver_version"],
        gpus=gpus,
        net_interfaces={k: list(v) for k, v in data["net_interfaces"].items()},
        # The one key that may be left out: unset is its natural state.
        cuda_visible_devices=data.get("cuda_visible_devices"),
        packages=dict(data["packages"]),
        # the plugins' own facts, by section (validated by each plugin's schema fragment)
        sections=copy.deepcopy(dict(data.get("sections") or {})),
        origin=origin,
        schema=SCHEMA_VERSION,
    )


MAX_FACT_STR = 4096  # characters of one string (a name, a version, an interface)
MAX_FACT_INT = 2**53  # bytes, versions, indices: anything larger is not a real host's
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _bounds_error(where: str, value: Any, path: tuple[Any, ...] = ()) -> FactsError | None:
    """What the schema does not bound, everywhere in the file: strings (and keys) of at most
    MAX_FACT_STR characters without control characters (they would reach a terminal),
    integers within +-MAX_FACT_INT."""
    if isinstance(value, str):
        if len(value) > MAX_FACT_STR:
            return _fail(where, _key(path), f"a string of at most {MAX_FACT_STR} characters",
                         f"{len(value)} characters")
        if _CONTROL.search(value):
            return _fail(where, _key(path), "a string without control characters", value)
    elif isinstance(value, int) and not isinstance(value, bool):
        if not -MAX_FACT_INT <= value <= MAX_FACT_INT:
            return _fail(where, _key(path), "an integer of at most 2**53", f"{str(value)[:20]}...")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            error = _bounds_error(where, item, (*path, i))
            if error is not None:
                return error
    elif isinstance(value, dict):
        for k, item in value.items():
            error = _bounds_error(where, k, (*path, "<key>")) or _bounds_error(where, item, (*path, k))
            if error is not None:
                return error
    return None


def from_dict(data: Any, origin: str, where: str, described: bool) -> Facts:
    """Validate parsed JSON and build Facts; errors name ``where`` and the key.  A
    ``described`` host is also checked for CPU numbers and its ``cuda_visible_devices``."""
    error = _schema_error(where, data)
    if error is None:
        error = _bounds_error(where, data)
    if error is not None:
        raise error
    _cross_checks(data, where, described)
    facts = _build(data, origin)
    if described:
        # A described host with a wrong CUDA_VISIBLE_DEVICES is a broken file: say so now.
        resolve_visible(facts, facts.cuda_visible_devices, "key 'cuda_visible_devices'")
    return facts


def facts_from_dict(data: Any, origin: str) -> Facts:
    """Validate parsed facts JSON (schema 2); errors name ``origin`` and the key."""
    return from_dict(data, origin, where=origin, described=origin != "probed")


def load_facts(path: str | os.PathLike[str]) -> Facts:
    """Read a facts file (a described host)."""
    where = os.fspath(path)
    text = _read_regular(where)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FactsError(f"{where}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    return from_dict(data, where, where, described=True)


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


def _read_regular(where: str) -> str:
    """The text of a regular file of at most MAX_FACTS_BYTES; anything else is one FactsError.

    Opened non-blocking (a FIFO would wait for a writer forever) and checked with fstat
    before a byte is read (``/dev/zero`` never ends)."""
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise FactsError(f"{where}: cannot read facts file: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a file")
            raise FactsError(f"{where}: not a regular file ({kind}); a facts file must be a regular JSON file")
        if st.st_size > MAX_FACTS_BYTES:
            raise FactsError(f"{where}: {st.st_size} bytes, more than a facts file may hold "
                             f"({MAX_FACTS_BYTES // 2**20} MiB); a facts file describes one host in a few kilobytes")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FACTS_BYTES + 1)
    except OSError as e:
        raise FactsError(f"{where}: cannot read facts file: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FACTS_BYTES:  # it grew while being read
        raise FactsError(f"{where}: more than a facts file may hold ({MAX_FACTS_BYTES // 2**20} MiB)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FactsError(f"{where}: cannot read facts file: not UTF-8 text ({e.reason} at byte {e.start})") from None

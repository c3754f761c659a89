"""Reading a facts file (a described host) against ``facts.schema.json``, the one definition
of the format (docs/facts.md): an error is one line naming the file, the key path and the
key's ``x-accepts`` text.  References between keys and the bounds are checked here.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import re
import os
import pathlib
import stat
from collections.abc import Iterable
from typing import Any

from gpudask import session
from gpudask.errors import FactsError
from gpudask.facts.model import GPU, Facts, resolve_visible

SCHEMA_PATH = pathlib.Path(__file__).with_name("facts.schema.json")

# a facts file describes one host in a few kilobytes; anything larger is refused unread
MAX_FACTS_BYTES = 16 * 2**20
# what the bytes do not bound: the largest hosts have 16 GPUs (and up to 7 MIG instances each);
# planning goes through every GPU for every worker, so 10 000 GPUs would run for hours
MAX_FACT_GPUS = 64
MAX_FACT_ITEMS = 4096  # items of any other list or mapping (CPUs, interfaces, packages)
MAX_FACT_DEPTH = 16  # lists and mappings inside each other (the schema's deepest is 5)
MAX_FACT_STR = 4096  # characters of one string (a name, a version, an interface)
MAX_FACT_INT = 2**53  # bytes, versions, indices: anything larger is not a real host's
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")

logger = logging.getLogger("distributed.gpudask")


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The facts JSON Schema (draft 2020-12) as shipped with gpudask."""
    data: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return data


@functools.lru_cache(maxsize=1)
def strict_validator() -> Any:
    """Draft 2020-12 where an integer is a Python int, never 1.0 or a bool: the validator
    class of the facts schema and of the plugins' facts sections."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    return jsonschema.validators.extend(base, type_checker=checker)


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def _key(path: Iterable[Any]) -> str:
    """('gpus', 1, 'memory_total') -> 'gpus[1].memory_total'."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def remembered_error(schema: Any, data: Any, where: str, prefix: Iterable[Any] = ()) -> FactsError | None:
    """The first violation of ``schema`` in ``data`` as a one-line FactsError naming ``where``
    and the key path (under ``prefix``), or None; at once None when the same data passed the
    same schema before on this host (:mod:`gpudask.facts.validated`)."""
    from gpudask.facts import validated

    key = validated.digest(schema, data)
    if validated.passed_before(key):
        return None
    session.count("facts schema")
    # a wrong value before a missing key, the outermost first, keys in a stable order
    errors = sorted(strict_validator()(schema).iter_errors(data),
                    key=lambda e: (e.validator == "required", len(e.absolute_path), str(list(e.absolute_path))))
    if not errors:
        validated.remember(key)
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
    inner = error
    while inner is not None and not (isinstance(inner.schema, dict) and "x-accepts" in inner.schema):
        inner = inner.parent
    accepts = inner.schema["x-accepts"] if inner is not None else f"{error.validator} {error.validator_value!r}"
    return FactsError(f"{where}: key {_key(path)!r} must be {accepts}, got {_show(error.instance)}")


def _fail(where: str, key: str, expected: str, value: Any) -> FactsError:
    return FactsError(f"{where}: key {key!r} must be {expected}, got {_show(value)}")


def _cross_checks(data: dict[str, Any], where: str, described: bool) -> None:
    """What the schema cannot say: references between keys.  CPU numbers are checked in
    described files only: a probe reports what NVML says, whatever numbering the kernel uses."""
    gpus, cpu_count = data["gpus"], data["cpu_count"]
    indices, uuids = [g["index"] for g in gpus], [g["uuid"] for g in gpus]
    for i, g in enumerate(gpus):
        if g["index"] in indices[:i]:
            raise _fail(where, f"gpus[{i}].index", "unique among the GPUs", g["index"])
        if g["uuid"] in uuids[:i]:  # one GPU described twice: two workers would share it
            raise _fail(where, f"gpus[{i}].uuid", f"unique among the GPUs (gpus[{uuids.index(g['uuid'])}] has it)",
                        g["uuid"])
    for i, g in enumerate(gpus if described else []):
        for j, cpu in enumerate(g["cpu_affinity"]):
            if cpu >= cpu_count:
                raise _fail(where, f"gpus[{i}].cpu_affinity[{j}]", f"a CPU below cpu_count ({cpu_count})", cpu)


def _build(data: dict[str, Any], origin: str) -> Facts:
    # extra instance keys (gpu_instance_id, ...) are kept; extra GPU keys are not
    gpus = [GPU(**{f.name: copy.deepcopy(g[f.name]) for f in dataclasses.fields(GPU)}
                | {"compute_capability": g["compute_capability"] and tuple(g["compute_capability"]),
                   "mig": {"enabled": g["mig"]["enabled"], "instances": copy.deepcopy(g["mig"]["instances"])}})
            for g in data["gpus"]]
    return Facts(**{k: data[k] for k in ("hostname", "cpu_count", "driver_version", "cuda_driver_version")},
                 gpus=gpus, net_interfaces={k: list(v) for k, v in data["net_interfaces"].items()},
                 cuda_visible_devices=data.get("cuda_visible_devices"), packages=dict(data["packages"]),
                 sections=copy.deepcopy(dict(data.get("sections") or {})), origin=origin)


def _bounds_error(where: str, data: Any) -> FactsError | None:
    """What the schema does not bound, everywhere in the file, checked iteratively before
    anything walks ``data`` recursively: nesting, sizes, strings (and keys) of at most
    MAX_FACT_STR characters without control characters (they would reach a terminal),
    integers within +-MAX_FACT_INT."""
    if isinstance(data, dict) and isinstance(data.get("gpus"), list) and len(data["gpus"]) > MAX_FACT_GPUS:
        return _fail(where, "gpus", f"a list of at most {MAX_FACT_GPUS} GPUs", f"{len(data['gpus'])} GPUs")
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if len(value) > MAX_FACT_STR:
                return _fail(where, _key(path), f"a string of at most {MAX_FACT_STR} characters",
                             f"{len(value)} characters")
            if _CONTROL.search(value):
                return _fail(where, _key(path), "a string without control characters", value)
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate ("\ud800"): no terminal, msgpack or file takes it
                    return _fail(where, _key(path), "a string of Unicode characters (no lone surrogates)",
                                 value.encode("utf-8", "backslashreplace").decode("ascii"))
        elif isinstance(value, int) and not isinstance(value, bool):
            if not -MAX_FACT_INT <= value <= MAX_FACT_INT:
                return _fail(where, _key(path), "an integer of at most 2**53", f"{str(value)[:20]}...")
        elif isinstance(value, (list, dict)):
            if len(path) >= MAX_FACT_DEPTH:
                return _fail(where, _key(path), f"nested at most {MAX_FACT_DEPTH} deep", "deeper")
            if len(value) > MAX_FACT_ITEMS:
                return _fail(where, _key(path) or "the top level", f"at most {MAX_FACT_ITEMS} items",
                             f"{len(value)} items")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, item in reversed(list(items)):  # popped in the file's order
                stack.append((item, (*path, k if isinstance(k, (int, str)) else "<key>")))
                if isinstance(value, dict):
                    stack.append((k, (*path, "<key>")))
    return None


def facts_from_dict(data: Any, origin: str, where: str | None = None, schema_checked: bool = False) -> Facts:
    """Validate parsed facts JSON (schema 2) and build Facts; errors name ``where`` (else
    ``origin``) and the key.  A described host (``origin`` not "probed") is also checked for CPU
    numbers and its ``cuda_visible_devices``.  ``schema_checked``: a host plan's digest says its
    writer ran the schema (the rest runs)."""
    where = where or origin
    error = _bounds_error(where, data) or (None if schema_checked else remembered_error(schema(), data, where))
    if error is not None:
        raise error
    described = origin != "probed"
    _cross_checks(data, where, described)
    facts = _build(data, origin)
    if described:
        # A described host with a wrong CUDA_VISIBLE_DEVICES is a broken file: say so now.
        resolve_visible(facts, facts.cuda_visible_devices, "key 'cuda_visible_devices'")
    return facts


def load_facts(path: str | os.PathLike[str]) -> Facts:
    """Read a facts file (a described host)."""
    where = os.fspath(path)
    return facts_from_dict(parse_json(_read_regular(where), where), where)


def parse_json(text: str, where: str) -> Any:
    """Facts JSON as parsed, or one FactsError naming ``where``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise FactsError(f"{where}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise FactsError(f"{where}: nested deeper than a facts file may be (at most {MAX_FACT_DEPTH} levels)") from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise FactsError(f"{where}: invalid JSON: {(str(e).splitlines() or ['?'])[0][:120]}; integers in a facts "
                         "file are at most 2**53") from None


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


def _check_writers(where: str, st: os.stat_result) -> None:
    """A facts file another user may write is refused, as the state directory is
    (docs/security.md); one its group may write is a warning (a group of one user is common)."""
    from gpudask.facts.statedir import owner

    mode = stat.S_IMODE(st.st_mode)
    fix = f"accepted: a facts file only you (or root) can write (chown, chmod go-w {where})"
    if st.st_uid not in (0, os.getuid()):
        raise FactsError(f"{where}: owned by {owner(st.st_uid)}, not by you ({owner(os.getuid())}): another user "
                         f"could change the host gpudask plans for; {fix}")
    if mode & stat.S_IWOTH:
        raise FactsError(f"{where}: every user can write it (mode {mode:04o}): another user could change the host "
                         f"gpudask plans for; {fix}")
    if mode & stat.S_IWGRP:
        logger.warning("gpudask: warning: facts file %s: its group can write it (mode %04o): whoever is in group "
                       "%d can change the host gpudask plans for; chmod g-w %s", where, mode, st.st_gid, where)


def _read_regular(where: str) -> str:
    """The text of a regular file of at most MAX_FACTS_BYTES, else one FactsError (opened
    non-blocking, fstat checked first: a FIFO or ``/dev/zero`` never ends)."""
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise FactsError(f"{where}: cannot read facts file: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a file")
            raise FactsError(f"{where}: not a regular file ({kind}); a facts file must be a regular JSON file")
        _check_writers(where, st)
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

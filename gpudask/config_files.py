"""Config files into dask's config: ``gpudask.toml``, ``--config`` files and gpudask's YAML
defaults (:func:`load_dask_config`), each refused in one line when it is not a readable,
regular TOML or YAML file of at most :data:`MAX_CONFIG_BYTES`.
"""

from __future__ import annotations

import errno
import os
import pathlib
import stat
import sys
from collections.abc import Callable
from typing import Any

from gpudask import session
from gpudask.errors import ConfigError

_HERE = pathlib.Path(__file__).parent

MAX_CONFIG_BYTES = 1 << 20  # a gpudask.toml / YAML config file larger than this is refused
# what one config file may hold once parsed: YAML aliases repeat a node without repeating its
# text (a 1 KB "billion laughs" file expands to 10**9 values), so the bytes alone bound nothing
MAX_CONFIG_NODES = 100_000  # values (mappings, lists and scalars), aliases counted as expanded
MAX_CONFIG_DEPTH = 32  # mappings and lists inside each other (dask's own config nests 6 deep)
_NAMESPACES = ("gpudask", "distributed", "distributed-ucxx", "dask", "array")
_ACCEPTED_FILE = "accepted: a regular TOML or YAML file"


def _read_text(path: pathlib.Path, where: str) -> str:
    """The text of a config file, refused in one line when missing, not a regular file or too large."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{where}: a symlink loop; {_ACCEPTED_FILE}") from None
        if e.errno == errno.ENOENT:
            raise ConfigError(f"{where}: no such file; {_ACCEPTED_FILE}") from None
        raise ConfigError(f"{where}: cannot read it ({e.strerror}); {_ACCEPTED_FILE}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{where}: a directory, not a file; {_ACCEPTED_FILE}")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where}: not a regular file (a FIFO, socket or device); {_ACCEPTED_FILE}")
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: {st.st_size} bytes, over the {MAX_CONFIG_BYTES}-byte limit; {_ACCEPTED_FILE}")
    try:
        # non-blocking and bounded: the file may have been swapped for a FIFO or grown since
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{where}: over the {MAX_CONFIG_BYTES}-byte limit; {_ACCEPTED_FILE}")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot read it ({getattr(e, 'strerror', None) or e})") from None


def _too_big(where: str, what: str) -> ConfigError:
    return ConfigError(f"{where}: {what}; accepted: at most {MAX_CONFIG_NODES} values (YAML aliases counted as "
                       f"expanded), nested at most {MAX_CONFIG_DEPTH} deep")


def _values(value: Any) -> Any:
    return value.values() if isinstance(value, dict) else value if isinstance(value, list) else None


def _yaml_children(node: Any) -> Any:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [c for pair in node.value for c in pair]
    return node.value if isinstance(node, yaml.SequenceNode) else None


def check_parsed_size(doc: Any, where: str, children: Callable[[Any], Any] = _values, expanded: str = "") -> None:
    """Refuse a parsed config (or, with ``children``, a composed YAML graph, walked as constructing
    it would expand its aliases) deeper than :data:`MAX_CONFIG_DEPTH`, with more than
    :data:`MAX_CONFIG_NODES` values, or holding itself; iteratively, at most that many steps."""
    count, on_path = 0, set()  # on_path: the ids of the containers above (met again: a cycle)
    stack: list[tuple[Any, int, bool]] = [(doc, 1, False)]
    while stack:
        value, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(value))
            continue
        count += 1
        if count > MAX_CONFIG_NODES:
            raise _too_big(where, f"more than {MAX_CONFIG_NODES} values{expanded}")
        items = children(value)
        if items is None:
            continue
        if depth > MAX_CONFIG_DEPTH:
            raise _too_big(where, f"nested more than {MAX_CONFIG_DEPTH} deep")
        if id(value) in on_path:
            raise _too_big(where, "an alias inside the node it names (a recursive value)")
        on_path.add(id(value))
        stack.append((value, depth, True))
        stack.extend((item, depth + 1, False) for item in items)


def read_toml(path: pathlib.Path, where: str) -> dict[str, Any]:
    """Read a gpudask.toml: top-level tables are dask config namespaces (``[gpudask.rmm]``,
    ``[distributed.comm.ucx]``); a file without one (``[rmm]``) is the ``gpudask`` namespace."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    text = _read_text(path, where)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not a valid TOML file ({e})") from None
    except RecursionError:  # arrays in arrays, thousands deep
        raise _too_big(where, f"nested more than {MAX_CONFIG_DEPTH} deep") from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise ConfigError(f"{where}: not a valid TOML file ({_first_line(e)})") from None
    check_parsed_size(data, where)
    if not any(k in data for k in _NAMESPACES):
        data = {"gpudask": data}
    return dict(data)


def read_yaml(path: pathlib.Path, where: str) -> dict[str, Any]:
    """Read a dask YAML config file: a mapping of dask config namespaces (or nothing)."""
    import yaml

    text = _read_text(path, where)
    loader = yaml.SafeLoader(text)
    try:
        # composed (a graph: an alias is one more edge to a node), counted, then constructed
        node = loader.get_single_node()
        if node is not None:
            check_parsed_size(node, where, _yaml_children, " once its aliases are expanded")
        doc = loader.construct_document(node) if node is not None else None
    except RecursionError:
        raise _too_big(where, f"nested more than {MAX_CONFIG_DEPTH} deep") from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise ConfigError(f"{where}: not valid YAML ({_first_line(e)})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(f"{where}: not valid YAML{at}: {problem}") from None
    finally:
        loader.dispose()
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: the top level is {kind(doc)}; accepted: a mapping of dask config "
                          f"namespaces ({', '.join(n + ':' for n in _NAMESPACES)})")
    return doc


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def kind(value: Any) -> str:
    """What a parsed document's top level is, in words: "a list", "null"."""
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), "null" if value is None else f"a {type(value).__name__}")


def _check_gpudask_section(from_env: dict[str, Any]) -> None:
    """The ``gpudask`` config section must be a mapping (``DASK_GPUDASK='[1,2]'`` would hide
    every gpudask setting)."""
    import dask.config

    section = dask.config.config.get("gpudask", None)
    if section is None or isinstance(section, dict):
        return
    where = "$DASK_GPUDASK" if "gpudask" in from_env or "DASK_GPUDASK" in os.environ else "dask config 'gpudask'"
    raise ConfigError(f"{where} = {section!r:.80} is not valid: it is gpudask's whole section of settings; accepted: "
                      "a mapping, or set single keys (DASK_GPUDASK__RMM__POOL_SIZE=4GiB)")


def load_dask_config(extra_file: str | os.PathLike[str] | None = None) -> None:
    """Merge gpudask's YAML defaults, gpudask.toml (and ``extra_file``) into dask.config.  A
    file sets a key only where nobody set it explicitly (``dask.config.set``, ``DASK_*`` win,
    as over dask's own YAML files).  Safe to call more than once."""
    import dask.config
    import yaml

    # DASK_* variables exported after dask was imported (dask reads them at import): they
    # count, unless dask.config.set(...) chose the key already
    from_env = dask.config.collect_env()
    if "gpudask" in from_env and not isinstance(from_env["gpudask"], dict):
        dask.config.set({"gpudask": from_env["gpudask"]})  # refused just below, naming the variable
    _check_gpudask_section(from_env)
    with open(_HERE / "gpudask.yaml") as f:
        # libyaml's loader where PyYAML has it: 0.1 ms, against 1.2 ms in Python, every planning process
        dask.config.update_defaults(yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    for key in flatten(from_env):
        name = key.replace("_", "-")
        if _not_chosen(name):
            dask.config.set({name: dask.config.get(key, config=from_env)})
    env_keys = {k.replace("_", "-") for k in flatten(from_env)}
    # the gpudask.toml in effect: $GPUDASK_CONFIG or ./gpudask.toml
    named, local = os.environ.get("GPUDASK_CONFIG"), pathlib.Path.cwd() / "gpudask.toml"
    files = [(pathlib.Path(named), f"GPUDASK_CONFIG={named}")] if named else []
    if not named and os.path.lexists(local):
        files.append((local, str(local)))
    if extra_file:
        files.append((pathlib.Path(extra_file), f"--config {extra_file}"))
    for path, where in files:
        read = read_yaml if str(path).endswith((".yaml", ".yml")) else read_toml
        doc = read(path, where)
        for key in flatten(doc):
            name = key.replace("_", "-")
            value = dask.config.get(key, config=doc)
            previous = session.current().file_values.get(name)
            current = dask.config.get(name, default=None)
            # explicit elsewhere (DASK_*, or neither the default nor what a file set before): kept
            if name in env_keys or (not _not_chosen(name) and (previous is None or previous[1] != current)):
                continue
            session.current().file_values[name] = (str(path), value)
            dask.config.set({name: value})


def _not_chosen(key: str) -> bool:
    """Nobody set ``key`` explicitly: it is missing or has its default value."""
    import dask.config

    current = dask.config.get(key, default=None)
    return current is None or current == dask.config.get(key, default=None, config=dask_defaults())


def dask_defaults() -> dict[str, Any]:
    """dask's config defaults as they are now (every registered default merged)."""
    import dask.config

    merged: dict[str, Any] = {}
    for d in dask.config.defaults:
        dask.config.update(merged, d, priority="new")
    return merged


def flatten(tree: Any, prefix: str = "") -> list[str]:
    """The dotted keys of the leaves of a nested config mapping."""
    if not isinstance(tree, dict) or not tree:
        return [prefix] if prefix else []
    return [key for k, v in tree.items() for key in flatten(v, f"{prefix}.{k}" if prefix else str(k))]


def file_value(key: str) -> tuple[str | None, Any]:
    """``(path, value)`` of ``key`` as a config file last set it, or ``(None, None)``."""
    return session.current().file_values.get(key.replace("_", "-"), (None, None))

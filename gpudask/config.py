"""Settings: the ``gpudask.*`` namespace of dask's config, plus ``gpudask.toml``.

Where a value comes from, in increasing precedence:

1. the option's default (``gpudask/gpudask.yaml`` for core keys, each plugin's
   :class:`Option` list for its own);
2. a *legacy* key users already have (``distributed.comm.ucx.nvlink``,
   ``distributed.rmm.pool-size`` ...), used only when the gpudask key is not set;
3. dask's YAML files (``~/.config/dask/*.yaml``, ``DASK_CONFIG``) and
   ``dask.config.set``;
4. ``gpudask.toml`` in the working directory, or the file named by
   ``$GPUDASK_CONFIG``;
5. ``DASK_GPUDASK__...`` environment variables.

Dask's own machinery does the merging, so ``dask.config.get("gpudask.x")`` works in
user code too; this module adds typed parsing, one-line errors, did-you-mean warnings
and the *source* of each value, which the plan reasons quote.
"""

from __future__ import annotations

import difflib
import os
import pathlib
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpudask.errors import ConfigError

_HERE = pathlib.Path(__file__).parent
_MISSING = object()


@dataclass(frozen=True)
class Option:
    """One setting: ``key`` under ``gpudask.``, its default and how to parse it."""

    key: str
    default: Any
    doc: str
    parse: Callable[[Any], Any] = lambda value: value
    accepts: str = "any value"
    legacy: tuple[str, ...] = ()


@dataclass(frozen=True)
class Setting:
    key: str
    value: Any
    source: str  # "default", "dask config", "gpudask.toml (path)", "$DASK_...", "legacy key ..."

    @property
    def explicit(self) -> bool:
        """Set by the user somewhere (config, environment, file, legacy key)."""
        return self.source != "default"


# -- parsers: each raises ValueError; Settings turns that into a ConfigError ---------
def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError("true or false")


def parse_optional_bool(value: Any) -> bool | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto", "none", "null")):
        return None
    try:
        return parse_bool(value)
    except ValueError:
        raise ValueError("true, false or null (auto)") from None


def choice(*choices: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        raise ValueError(" | ".join(choices))

    return parse


def parse_name_list(value: Any) -> list[str]:
    """A list of names, or a comma-separated string (``"nvlink,rmm"``)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return [v.strip() for v in value if v.strip()]
    raise ValueError("a list of names or a comma-separated string")


def parse_optional_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError("a number of seconds or null") from None


CORE_OPTIONS = [
    Option("gpudask.plugins.enable", [], "Only these plugins are loaded (empty: all). Also $GPUDASK_PLUGINS.",
           parse_name_list, "a list of plugin names"),
    Option("gpudask.plugins.disable", [], "These plugins are not loaded. Also $GPUDASK_DISABLE_PLUGINS.",
           parse_name_list, "a list of plugin names"),
    Option("gpudask.plugins.autoload", True,
           "Load third-party plugins from the 'gpudask' entry point group "
           "($GPUDASK_DISABLE_PLUGIN_AUTOLOAD=1 turns it off).", parse_bool, "true or false"),
    Option("gpudask.plugins.trace", False, "Log every hook call (also $GPUDASK_TRACE_PLUGINS=1).",
           parse_bool, "true or false"),
    Option("gpudask.scheduler-check.action", "warn",
           "What the scheduler does with scheduler-check findings: warn (log and 'gpudask' event), error (also "
           "warn every client), refuse (also close the offending worker).", choice("warn", "error", "refuse"),
           "warn | error | refuse"),
    Option("gpudask.scheduler-check.timeout", 5.0,
           "Seconds the plugins' scheduler checks of one worker may take: they run off the scheduler's event loop; "
           "past this the check reports a check-timeout finding naming the slow plugin (its result, when it comes, "
           "replaces it).", lambda v: _positive_seconds(v), "a positive number of seconds or a duration such as \"5s\""),
]


MAX_CONFIG_BYTES = 1 << 20  # a gpudask.toml / YAML config file larger than this is refused
_NAMESPACES = ("gpudask", "distributed", "distributed-ucxx", "dask", "array")


def _positive_seconds(value: Any) -> float:
    from dask.utils import parse_timedelta

    try:
        seconds = None if isinstance(value, bool) else parse_timedelta(value, default="seconds")
    except (TypeError, ValueError, KeyError, AttributeError):
        seconds = None
    if seconds is None or not 0 < float(seconds) < float("inf"):
        raise ValueError('a positive number of seconds or a duration such as "5s"')
    return float(seconds)


def toml_path() -> pathlib.Path | None:
    """The gpudask.toml in effect: ``$GPUDASK_CONFIG`` or ``./gpudask.toml``."""
    named = os.environ.get("GPUDASK_CONFIG")
    if named:
        path = pathlib.Path(named)
        check_config_file(path, f"GPUDASK_CONFIG={named}")
        return path
    local = pathlib.Path.cwd() / "gpudask.toml"
    if not os.path.lexists(local):
        return None
    check_config_file(local, str(local))
    return local


def check_config_file(path: pathlib.Path, where: str) -> None:
    """Refuse, in one line, a config file that is missing, not a regular file (a directory,
    a FIFO, a symlink loop) or larger than :data:`MAX_CONFIG_BYTES`."""
    import errno
    import stat

    accepted = "accepted: a regular TOML or YAML file"
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{where}: a symlink loop; {accepted}") from None
        if e.errno == errno.ENOENT:
            raise ConfigError(f"{where}: no such file; {accepted}") from None
        raise ConfigError(f"{where}: cannot read it ({e.strerror}); {accepted}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{where}: a directory, not a file; {accepted}")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where}: not a regular file (a FIFO, socket or device); {accepted}")
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: {st.st_size} bytes, over the {MAX_CONFIG_BYTES}-byte limit; {accepted}")


def _read_text(path: pathlib.Path, where: str) -> str:
    check_config_file(path, where)
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot read it ({getattr(e, 'strerror', None) or e})") from None


def read_toml(path: pathlib.Path, where: str | None = None) -> dict[str, Any]:
    """Read a gpudask.toml: top-level tables are dask config namespaces.

    ``[gpudask.rmm] pool-size = "4GB"`` and ``[distributed.comm.ucx] nvlink = true``
    both work; a file whose tables are not namespaced (``[rmm]``) is read as the
    ``gpudask`` namespace, which is the short form the docs show.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    where = where or str(path)
    try:
        data = tomllib.loads(_read_text(path, where))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not a valid TOML file ({e})") from None
    if not any(k in data for k in _NAMESPACES):
        data = {"gpudask": data}
    return dict(data)


def read_yaml(path: pathlib.Path, where: str | None = None) -> dict[str, Any]:
    """Read a dask YAML config file: a mapping of dask config namespaces (or nothing)."""
    import yaml

    where = where or str(path)
    try:
        doc = yaml.safe_load(_read_text(path, where))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(f"{where}: not valid YAML{at}: {problem}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: the top level is a {_kind(doc)}; accepted: a mapping of dask config "
                          f"namespaces ({', '.join(n + ':' for n in _NAMESPACES)})")
    return doc


def _kind(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(value), type(value).__name__)


def _check_gpudask_section(from_env: dict[str, Any]) -> None:
    """The ``gpudask`` config section must be a mapping: ``DASK_GPUDASK='[1,2]'`` (or a dask
    YAML file with ``gpudask: [1, 2]``) would hide every gpudask setting."""
    import dask.config

    section = dask.config.config.get("gpudask", None)
    if section is None or isinstance(section, dict):
        return
    where = "$DASK_GPUDASK" if "gpudask" in from_env or "DASK_GPUDASK" in os.environ else "dask config 'gpudask'"
    raise ConfigError(f"{where} = {section!r:.80} is not valid: it is gpudask's whole section of settings; accepted: "
                      "a mapping, or set single keys (DASK_GPUDASK__RMM__POOL_SIZE=4GiB)")


def load_dask_config(extra_file: str | os.PathLike[str] | None = None) -> None:
    """Merge gpudask's YAML defaults, gpudask.toml (and ``extra_file``) into dask.config.

    A file sets a key only where nobody set it explicitly: ``dask.config.set(...)`` and
    ``DASK_*`` variables (already in dask.config since dask was imported) win over it,
    as they win over dask's own YAML files.  Safe to call more than once.
    """
    import dask.config
    import yaml

    # DASK_* variables exported after dask was imported (dask reads them at import): they
    # count, unless dask.config.set(...) chose the key already
    from_env = dask.config.collect_env()
    if "gpudask" in from_env and not isinstance(from_env["gpudask"], dict):
        dask.config.set({"gpudask": from_env["gpudask"]})  # refused just below, naming the variable
    _check_gpudask_section(from_env)
    with open(_HERE / "gpudask.yaml") as f:
        dask.config.update_defaults(yaml.safe_load(f))
    for key in _flatten(from_env):
        name = key.replace("_", "-")
        if _not_chosen(name):
            dask.config.set({name: dask.config.get(key, config=from_env)})
    env_keys = {k.replace("_", "-") for k in _flatten(from_env)}
    named = os.environ.get("GPUDASK_CONFIG")
    files = [(p, f"GPUDASK_CONFIG={named}" if named else str(p)) for p in [toml_path()] if p]
    if extra_file:
        files.append((pathlib.Path(extra_file), f"--config {extra_file}"))
    for path, where in files:
        if str(path).endswith((".yaml", ".yml")):
            doc = read_yaml(path, where)
        else:
            doc = read_toml(path, where)
        for key in _flatten(doc):
            name = key.replace("_", "-")
            value = dask.config.get(key, config=doc)
            previous = _FILE_VALUES.get(name)
            current = dask.config.get(name, default=None)
            # explicit elsewhere (a DASK_* variable, or a value that differs from the default
            # and from what a file set before): keep it
            if name in env_keys or (not _not_chosen(name) and (previous is None or previous[1] != current)):
                continue
            _FILE_VALUES[name] = (str(path), value)
            dask.config.set({name: value})


def _not_chosen(key: str) -> bool:
    """Nobody set ``key`` explicitly: it is missing or has its default value."""
    import dask.config

    current = dask.config.get(key, default=None)
    return current is None or current == _default_of(key)


def _default_of(key: str) -> Any:
    import dask.config

    merged: dict[str, Any] = {}
    for d in dask.config.defaults:
        dask.config.update(merged, d, priority="new")
    return dask.config.get(key, default=None, config=merged)


# key -> (file, value) as last merged from gpudask.toml / --config, to name the source
_FILE_VALUES: dict[str, tuple[str, Any]] = {}


def register_defaults(options: Iterable[Option]) -> None:
    """Make plugin defaults visible through ``dask.config.get`` (without overriding users)."""
    import dask.config

    tree: dict[str, Any] = {}
    for opt in options:
        node = tree
        *parents, leaf = opt.key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = opt.default
    dask.config.update_defaults(tree)


class Settings:
    """Typed, validated view of the options in effect for one process."""

    def __init__(self, options: Iterable[Option], config: dict[str, Any] | None = None,
                 environ: dict[str, str] | None = None):
        import dask.config

        self.options = {o.key: o for o in options}
        self._config = dask.config.config if config is None else config
        self._environ = os.environ if environ is None else environ
        self._cache: dict[str, Setting] = {}

    def _raw(self, key: str) -> Any:
        import dask.config

        return dask.config.get(key, default=_MISSING, config=self._config)

    def _source(self, key: str) -> str:
        env_name = "DASK_" + key.upper().replace(".", "__").replace("-", "_")
        if env_name in self._environ:
            return f"${env_name}"
        path, value = _FILE_VALUES.get(key.replace("_", "-"), (None, _MISSING))
        if path is not None and value == self._raw(key):
            return f"{pathlib.Path(path).name} ({path})"
        return "dask config"

    def get(self, key: str) -> Setting:
        if key in self._cache:
            return self._cache[key]
        opt = self.options.get(key)
        if opt is None:
            raise KeyError(f"gpudask has no option {key!r}")
        raw, source = self._raw(key), "dask config"
        if raw is _MISSING or raw == opt.default:
            raw, source = opt.default, "default"
            for legacy in opt.legacy:
                value = self._raw(legacy)
                if value is not _MISSING and value is not None:
                    raw, source = value, f"legacy key {legacy}"
                    break
        else:
            source = self._source(key)
        try:
            value = opt.parse(raw)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"{key} = {raw!r} (from {source}) is not valid; accepted: {e or opt.accepts}") from None
        setting = Setting(key, value, source)
        self._cache[key] = setting
        return setting

    def __getitem__(self, key: str) -> Any:
        return self.get(key).value

    def check_sections(self) -> None:
        """A section of settings given a single value (``rmm = 5`` in gpudask.toml,
        ``DASK_GPUDASK__RMM=5``) is refused: every option under it would silently fall back
        to its default."""
        for key in self.options:
            parts = key.split(".")
            for depth in range(2, len(parts)):
                section = ".".join(parts[:depth])
                value = self._raw(section)
                if value is not _MISSING and value is not None and not isinstance(value, dict):
                    options = sorted(k[len(section) + 1:] for k in self.options if k.startswith(section + "."))
                    raise ConfigError(f"{section} = {value!r} (from {self._source(section)}) is not valid: it is a "
                                      f"section of settings; accepted: its keys {', '.join(options)}")

    def validate_all(self) -> list[str]:
        """Parse every option (raising on the first bad one); return unknown-key warnings."""
        for key in self.options:
            self.get(key)
        return self.unknown_keys()

    def unknown_keys(self) -> list[str]:
        known = set(self.options) | {"gpudask.version"}
        # plugins may keep a whole table of free-form settings (e.g. extra environment)
        tables = {k for k, o in self.options.items() if isinstance(o.default, dict)}
        out = []
        for key in _flatten({"gpudask": self._config.get("gpudask", {})}):
            norm = key.replace("_", "-")
            if norm in known or any(norm.startswith(t + ".") for t in tables):
                continue
            close = difflib.get_close_matches(norm, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            out.append(f"unknown gpudask setting {key!r} (from {self._source(key)}){hint}")
        return out


def _flatten(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict) or not tree:
        return [prefix] if prefix else []
    keys: list[str] = []
    for k, v in tree.items():
        keys += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    return keys


def warn_unknown(messages: list[str]) -> None:
    for message in messages:
        warnings.warn(message, UserWarning, stacklevel=3)

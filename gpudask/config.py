"""Settings: the ``gpudask.*`` namespace of dask's config, plus ``gpudask.toml``.

Where a value comes from, in increasing precedence: the option's default (``gpudask.yaml``
for core keys, each plugin's :class:`Option` list for its own); a *legacy* key users already
have (``distributed.comm.ucx.nvlink`` ...), used only when the gpudask key is not set; dask's
YAML files and ``dask.config.set``; ``gpudask.toml`` in the working directory (or
``$GPUDASK_CONFIG``); ``DASK_GPUDASK__...`` variables.  Dask merges them, so
``dask.config.get("gpudask.x")`` works in user code too; this module adds the options, typed
parsing (:class:`Settings`), one-line errors, did-you-mean warnings and each value's *source*,
which the plan reasons quote.  Reading the files is :mod:`gpudask.config_files`.
"""

from __future__ import annotations

import difflib
import json
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpudask.config_files import MAX_CONFIG_BYTES as MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH as MAX_CONFIG_DEPTH
from gpudask.config_files import MAX_CONFIG_NODES as MAX_CONFIG_NODES, load_dask_config as load_dask_config
from gpudask.config_files import file_value, flatten
from gpudask import session
from gpudask.errors import ConfigError

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
    # the LocalCUDACluster keyword this setting stands for (LocalGPUCluster takes it:
    # docs/migrating-from-dask-cuda.md), converted by ``dask_cuda_convert`` (a converted None: not set)
    dask_cuda_kwarg: str | None = None
    dask_cuda_convert: Callable[[Any], Any] | None = None
    # the ``dask cuda worker`` option it stands for (``"--rmm-pool-size"``; ``"--enable-x/--disable-x"``
    # is a flag), taken on stock ``dask worker`` / ``dask scheduler`` (converted as the keyword)
    dask_cuda_option: str | None = None
    # only meaningful over UCX: that option given with another protocol is named in one warning
    ucx_only: bool = False


@dataclass(frozen=True)
class Setting:
    key: str
    value: Any
    source: str  # "default", "dask config", "gpudask.toml (path)", "$DASK_...", "legacy key ..."
    # the value as the user wrote it ("40GiB"), when it is not the parsed value itself
    given: Any = None

    @property
    def explicit(self) -> bool:
        """Set by the user somewhere (config, environment, file, legacy key)."""
        return self.source != "default"


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for one error line (a huge int has no repr)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


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
        value = value.split(",")
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
    Option("gpudask.plugins.hook-timeout", 60.0,
           "Seconds one plugin hook called on a process's main thread (where dask servers run their event loop "
           "and every command plans) may take: past this the call is interrupted and fails with one line naming "
           "the plugin and the hook.", lambda v: _positive_seconds(v),
           "a positive number of seconds or a duration such as \"60s\""),
    Option("gpudask.start.plan-ahead", True,
           "A dask worker started before its scheduler's file is written plans and applies for the protocol the "
           "plugins call likely (UCX on a GPU host) while it waits, and plans again if the scheduler's differs.",
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


def _positive_seconds(value: Any) -> float:
    from dask.utils import parse_timedelta

    try:
        seconds = None if isinstance(value, bool) else parse_timedelta(value, default="seconds")
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError):  # "" -> IndexError
        seconds = None
    if seconds is None or not 0 < float(seconds) <= 7 * 86400:
        raise ValueError('a positive number of seconds (at most a week) or a duration such as "5s"')
    return float(seconds)


def env_variable(key: str) -> str:
    """The ``DASK_*`` variable that sets ``key``."""
    return "DASK_" + key.upper().replace(".", "__").replace("-", "_")


def label_source(key: str, value: Any, label: str) -> None:
    """Name where ``key``'s ``value`` came from, instead of "dask config", while it has that value."""
    session.current().labels[key] = (value, label)


def forget_source(key: str) -> None:
    session.current().labels.pop(key, None)


def register_defaults(options: Iterable[Option]) -> None:
    """Make plugin defaults visible through ``dask.config.get`` (without overriding users)."""
    import dask.config

    tree: dict[str, Any] = {}
    dask.config.set({opt.key: opt.default for opt in options}, config=tree)  # nested into ``tree`` only
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

    def add_options(self, options: Iterable[Option]) -> None:
        """Add options (the plugins', once they are loaded: the core's decide which load)."""
        added = {o.key: o for o in options}
        for key, opt in added.items():  # the values already read (the core's) stand
            if self.options.get(key) != opt:
                self._cache.pop(key, None)
        self.options.update(added)

    def resolved(self) -> dict[str, dict[str, Any]]:
        """Every option's value and source as JSON (``{key: {"value", "source"}}``), for the host
        plan: its readers parse nothing again.  A value JSON does not hold exactly is left out."""
        out: dict[str, dict[str, Any]] = {}
        for key in self.options:
            setting = self.get(key)
            try:
                exact = json.loads(json.dumps(setting.value)) == setting.value
            except (TypeError, ValueError):
                exact = False
            if exact:
                out[key] = {"value": setting.value, "source": setting.source}
        return out

    def take_resolved(self, resolved: Mapping[str, Mapping[str, Any]]) -> None:
        """Take a planning process's :meth:`resolved` as these options' values (keys not
        declared here are ignored; options it lacks are read from the config)."""
        for key, item in resolved.items():
            if key in self.options:
                self._cache[key] = Setting(key, item["value"], str(item["source"]))

    def read_config(self, config: dict[str, Any]) -> None:
        """Read from ``config`` from now on; a value read already stands where ``config`` gives
        its key (and legacy keys) the same raw value."""
        before = {key: self._raws(key) for key in self._cache}
        self._config = config
        self._cache = {key: s for key, s in self._cache.items() if self._raws(key) == before[key]}

    def _raws(self, key: str) -> list[Any]:
        return [self._raw(k) for k in (key, *self.options[key].legacy)]

    def _raw(self, key: str) -> Any:
        import dask.config

        return dask.config.get(key, default=_MISSING, config=self._config)

    def _source(self, key: str) -> str:
        labelled = session.current().labels.get(key)
        if labelled is not None and labelled[0] == self._raw(key):
            return labelled[1]
        env_name = env_variable(key)
        if env_name in self._environ:
            return f"${env_name}"
        path, value = file_value(key)
        if path is not None and value == self._raw(key):
            return f"{pathlib.Path(path).name} ({path})"
        return "dask config"

    def get(self, key: str) -> Setting:
        if key in self._cache:
            return self._cache[key]
        opt = self.options.get(key)
        if opt is None:
            raise KeyError(f"gpudask has no option {key!r}")
        raw = self._raw(key)
        if raw is _MISSING or raw == opt.default:
            raw, source = opt.default, "default"
            for legacy in opt.legacy:
                value = self._raw(legacy)
                if value is not _MISSING and value is not None:
                    raw, source = value, f"legacy key {legacy}"
                    break
        else:
            source = self._source(key)
        session.count(f"parsed {key}")
        try:
            value = opt.parse(raw)
        except (ValueError, TypeError, OverflowError, RecursionError) as e:
            # OverflowError: "1e400GB" is float infinity, which no size or count can be
            accepted = opt.accepts if isinstance(e, (OverflowError, RecursionError)) else e
            raise ConfigError(f"{key} = {shown(raw)} (from {source}) is not valid; accepted: {accepted}") from None
        setting = Setting(key, value, source, raw if raw is not value and raw != value else None)
        self._cache[key] = setting
        return setting

    def __getitem__(self, key: str) -> Any:
        return self.get(key).value

    def check_sections(self) -> None:
        """Refuse a section of settings given a single value (``rmm = 5``, ``DASK_GPUDASK__RMM=5``):
        every option under it would silently fall back to its default."""
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
        for key in flatten({"gpudask": self._config.get("gpudask", {})}):
            norm = key.replace("_", "-")
            if norm in known or any(norm.startswith(t + ".") for t in tables):
                continue
            close = difflib.get_close_matches(norm, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            out.append(f"unknown gpudask setting {key!r} (from {self._source(key)}){hint}")
        return out


_WARNED_ENV = "GPUDASK_WARNED"  # what this process (or the one that started it) has said already


def warn_unknown(messages: list[str]) -> None:
    """``gpudask: warning: ...`` on stderr, once per message, here and in the processes this one
    starts (they inherit a digest of each message said)."""
    import hashlib
    import sys

    said = set(filter(None, os.environ.get(_WARNED_ENV, "").split(",")))
    for message in messages:
        digest = hashlib.sha1(message.encode()).hexdigest()[:12]
        if digest not in said:
            said.add(digest)
            os.environ[_WARNED_ENV] = ",".join(sorted(said))
            print(f"gpudask: warning: {message}", file=sys.stderr, flush=True)

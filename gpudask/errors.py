"""Errors gpudask raises on purpose.

Every error here is meant to be shown to a user as one line: it names what was wrong
(the key, the value, the file, the plugin) and what is accepted.  The CLI and the
preload entry points print ``str(error)`` and never a traceback for these.
"""

from __future__ import annotations


class GpudaskError(Exception):
    """Base class: a problem the user can fix, described in one line."""


class ConfigError(GpudaskError):
    """A setting has a value gpudask cannot accept."""


class FactsError(GpudaskError):
    """A facts file (or a probed host) does not match the facts schema (2)."""


class PluginError(GpudaskError):
    """A plugin failed to load, to validate, or raised inside a hook."""

    def __init__(self, plugin: str, distribution: str | None, hook: str, cause: BaseException | str):
        self.plugin = plugin
        self.distribution = distribution
        self.hook = hook
        self.cause = cause
        where = f"plugin {plugin!r}" + (f" (from {distribution})" if distribution else "")
        text = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        super().__init__(f"gpudask {where} failed in {hook}: {text}")

    def __reduce__(self) -> tuple[type[PluginError], tuple[str, str | None, str, str]]:
        # Pickled across processes (a nanny receives a worker's startup failure): the cause
        # travels as its text, so an exception type the other side cannot import never matters.
        cause = self.cause if isinstance(self.cause, str) else f"{type(self.cause).__name__}: {self.cause}"
        return PluginError, (self.plugin, self.distribution, self.hook, cause)

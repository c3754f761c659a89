"""Errors gpudask raises on purpose, each shown to a user as one line naming what was wrong
(the key, the value, the file, the plugin) and what is accepted, never with a traceback.
"""

from __future__ import annotations

from gpudask.plaindata import exception_text


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
        # the cause as its text, read once here (exception_text: an exception whose text raises
        # is only named): nothing formats a plugin's exception later, and pickled to another
        # process (a nanny gets a worker's startup failure) no exception type needs importing
        self.cause = str.__str__(cause) if isinstance(cause, str) else exception_text(cause)
        where = f"plugin {plugin!r}" + (f" (from {distribution})" if distribution else "")
        super().__init__(f"gpudask {where} failed in {hook}: {self.cause}")

    def __reduce__(self) -> tuple[type[PluginError], tuple[str, str | None, str, str]]:
        return PluginError, (self.plugin, self.distribution, self.hook, self.cause)

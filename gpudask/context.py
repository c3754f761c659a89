"""What a plan hook can read: facts, settings, protocol, and the user's own choices."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

UCX_PROTOCOLS = ("ucx", "ucxx")


@dataclass
class PlanContext:
    facts: Any  # gpudask.facts.Facts
    settings: Any  # gpudask.config.Settings
    protocol: str
    nworkers: int
    # The environment and dask config as the *user* set them: gpudask's own changes
    # in parent processes are taken out, so "explicit wins" compares with the user.
    user_env: Mapping[str, str] = field(default_factory=dict)
    user_config: Mapping[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    user_interface: str | None = None  # `dask worker --interface` given by the user

    @property
    def uses_ucx(self) -> bool:
        return self.protocol in UCX_PROTOCOLS

    @property
    def gpus(self) -> list[Any]:
        """The GPUs this host's workers may use (CUDA_VISIBLE_DEVICES applied)."""
        return self.facts.visible_gpus()

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def user_dask_config(self, key: str, default: Any = None) -> Any:
        """A dask config value the user set explicitly (differs from dask's default)."""
        import dask.config

        value = dask.config.get(key, default=None, config=dict(self.user_config))
        base = dask.config.get(key, default=None, config=_dask_defaults())
        return default if value is None or value == base else value


_DEFAULTS: dict[str, Any] | None = None


def _dask_defaults() -> dict[str, Any]:
    global _DEFAULTS
    if _DEFAULTS is None:
        import dask.config

        merged: dict[str, Any] = {}
        for d in dask.config.defaults:
            dask.config.update(merged, d, priority="new")
        _DEFAULTS = merged
    return _DEFAULTS

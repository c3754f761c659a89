"""What a plan is computed from, made once per process by :mod:`gpudask.bootstrap`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudask.config import Settings
    from gpudask.facts import Facts
    from gpudask.plugin.manager import PluginManager


@dataclass(frozen=True)
class PlanInputs:
    """Facts, typed settings, plugins and the user's own environment and dask config
    (gpudask's changes taken out)."""

    facts: Facts
    settings: Settings
    manager: PluginManager = field(repr=False)
    user_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    user_config: Mapping[str, Any] = field(default_factory=dict, repr=False)

"""What a plan hook can read: :class:`PlanContext`, one frozen snapshot of a plan's inputs,
captured once per plan (later changes to ``os.environ`` or ``dask.config`` do not reach it).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpudask.errors import GpudaskError

if TYPE_CHECKING:
    from gpudask.config import Setting, Settings
    from gpudask.facts import GPU, Facts

UCX_PROTOCOLS = ("ucx", "ucxx")


@dataclass(frozen=True)
class PlanContext:
    facts: Facts
    settings: Settings
    protocol: str
    nworkers: int
    # The environment and dask config as the *user* set them: gpudask's own changes
    # in parent processes are taken out, so "explicit wins" compares with the user.
    user_env: Mapping[str, str] = field(default_factory=dict)
    user_config: Mapping[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    user_interface: str | None = None  # `dask worker --interface` given by the user
    # the plugin manager the plan was built with (apply hooks of the same process use it)
    manager: Any = field(default=None, repr=False, compare=False)
    # the role of the process planning, or None (gpudask info, a check): a worker planning
    # for itself leaves host-wide work to the others
    planner: str | None = None
    # every process's plan (ProcessPlan), in the planner's order
    plans: list[Any] = field(default_factory=list, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "user_env", MappingProxyType(dict(self.user_env)))
        object.__setattr__(self, "user_config", MappingProxyType(snapshot(self.user_config)))

    def __str__(self) -> str:  # short, for traces
        return f"plan context of {self.facts.hostname} ({self.protocol}, {self.nworkers} workers)"

    @property
    def uses_ucx(self) -> bool:
        return self.protocol in UCX_PROTOCOLS

    @property
    def gpus(self) -> list[GPU]:
        """The GPUs this host's workers may use (CUDA_VISIBLE_DEVICES applied)."""
        return self.facts.visible_gpus()

    def setting(self, key: str) -> Setting | None:
        """The typed value of option ``key`` with its source (``.value``, ``.source``,
        ``.explicit``), or None when no loaded plugin declares ``key``."""
        return self.settings.get(key) if key in self.settings.options else None

    def require(self, key: str) -> Setting:
        """Like :meth:`setting`, but :class:`~gpudask.errors.GpudaskError` (one line naming
        ``key``) when no loaded plugin declares it (a typo, or its plugin disabled)."""
        try:
            return self.settings.get(key)
        except KeyError:
            import difflib

            close = difflib.get_close_matches(key, sorted(self.settings.options), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "is the plugin that declares it disabled?"
            raise GpudaskError(f"no loaded plugin declares the option {key!r}; {hint}") from None

    def value(self, key: str) -> Any:
        """``require(key).value``: the parsed value of an option a plugin declares."""
        return self.require(key).value

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def user_dask_config(self, key: str, default: Any = None) -> Any:
        """A dask config value the user set explicitly (differs from dask's default)."""
        import dask.config

        value = dask.config.get(key, default=None, config=dict(self.user_config))
        base = dask.config.get(key, default=None, config=_dask_defaults())
        return default if value is None or value == base else value


_ATOMS = (str, int, float, bool, bytes, type(None))


def snapshot(config: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of a dask config, its plain values shared, others deep-copied where they can
    be (a lock cannot).  Not ``copy.deepcopy`` of the whole: its memo cost 7 ms of a start."""
    return {k: _copied(v) for k, v in config.items()}


def _copied(value: Any) -> Any:
    if isinstance(value, _ATOMS):
        return value
    if type(value) is dict:
        return {k: _copied(v) for k, v in value.items()}
    if type(value) is list:
        return [_copied(v) for v in value]
    if type(value) is tuple:
        return tuple(_copied(v) for v in value)
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - a config value that cannot be copied
        return value


@functools.lru_cache(maxsize=1)
def _dask_defaults() -> dict[str, Any]:
    from gpudask.config_files import dask_defaults

    return dask_defaults()

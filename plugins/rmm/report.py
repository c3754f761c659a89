"""The rmm plugin's rows in ``gpudask info`` / ``status`` / ``/gpudask`` and its check finding;
published data comes from another process: anything of the wrong type is skipped, never raised on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpudask.pluginapi import Finding, hookimpl

if TYPE_CHECKING:
    from gpudask.pluginapi import PlanContext, ProcessSide

SECTION = "rmm"


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    found = value.get(key) if isinstance(value, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _size(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@hookimpl
def gpudask_report_rows(plan: Mapping[str, Any],
                        published: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """The ``pool`` column: the planned initial size against the pool in place."""
    section = _mapping(_mapping(plan, "sections"), SECTION)
    allocator = section.get("allocator")
    if not isinstance(allocator, str):
        return None
    planned = _size(section.get("initial_pool_size"))
    row: dict[str, Any] = {"column": "pool", "summary": allocator + (f" {planned / 2**30:.1f} GiB" if planned else ""),
                           "planned": planned, "actual": None, "note": None, "bytes": True, "keys": ["pool_size"]}
    if published is None:
        return [row]
    pair = _mapping(_mapping(_mapping(_mapping(published, "applied"), "plugins"), SECTION), "pool_size")
    if pair:
        row["actual"] = pair.get("actual")
        if _size(pair.get("planned")) is not None:  # counted again at start: another command's workers joined
            row["planned"] = pair["planned"]
        return [row]
    report = _mapping(_mapping(published, "memory"), SECTION)
    if report.get("pool_size") is not None:
        row["actual"] = report["pool_size"]
    elif report.get("applied") is False and planned is not None:
        note = report.get("skipped") or report.get("why") or "not built"
        row["note"] = note if isinstance(note, str) else repr(note)
    return [row]


@hookimpl
def gpudask_scheduler_check(ctx: PlanContext | None, reference: ProcessSide,
                            subject: ProcessSide | None) -> list[Finding] | None:
    """A worker whose default pool had to start smaller than planned (its GPU shared with other processes)."""
    fitted = _mapping(_mapping(subject, "memory"), SECTION).get("fitted")
    if not isinstance(fitted, str):
        return []
    return [Finding("warning", "pool-fitted",
                    f"the worker's pool could not start at its planned size -- {fitted[:600]}: other processes "
                    "share its GPU; fix: one dask worker command per host with --nworkers N (its workers split "
                    "each GPU between them), or gpudask.rmm.pool-size for each command so the pools fit together",
                    details={"fitted": fitted[:600]})]

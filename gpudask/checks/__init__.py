"""The scheduler check: do the scheduler and the client match the workers?  The scheduler
deserialises some data and, over UCX, relays GPU frames, so it needs what the workers have
(docs/scheduler-check.md); the plugins' ``gpudask_scheduler_check`` hooks compare.
"""

from __future__ import annotations

from typing import Any

# imported on first use (PEP 562): a worker reads ``checks.published`` and ``scheme`` at start,
# and the client, runner and probe modules would cost it a dozen imports it never uses
_WHERE = {
    **dict.fromkeys(["check", "format_report", "run_check"], "gpudask.checks.client"),
    **dict.fromkeys(["SchedulerCheck", "install", "plan_here", "report_on_scheduler"], "gpudask.checks.runner"),
    **dict.fromkeys(["ACTION_KEY", "ACTIONS", "CLIENT_WARN_TOPIC", "EVENT_TOPIC", "EXTRA_KEY", "HANDLER",
                     "PLUGIN_NAME", "PUBLISHED_KEY", "evaluate_worker", "local_side", "run_hooks", "scheme",
                     "side_from_published"], "gpudask.checks.sides"),
    **dict.fromkeys(["SEVERITIES", "Finding", "worst"], "gpudask.findings"),
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gpudask.checks' has no attribute {name!r}")

"""The job manager's web dashboard, REST API and Prometheus endpoint (see ``server``).

The runner opens a `Dashboard` per job: it joins (or starts) the driver's server for
``ui_host``/``ui_port`` and publishes the job's snapshots to it (``snapshot``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobmanager.metrics import RunMetrics
from jobmanager.web.server import DashboardServer, UiError, close_all, serve
from jobmanager.web.snapshot import JobBoard, SnapshotBuilder
from runtime.config import JobConfig
from runtime.plan import JobPlan

__all__ = ["Dashboard", "DashboardServer", "UiError", "close_all", "serve"]


class Dashboard:
    """One job on the dashboard (``ui=False``: does nothing, ``url`` is None)."""

    def __init__(
        self, plan: JobPlan, config: JobConfig, metrics: RunMetrics, say: Callable[[str], None]
    ) -> None:
        self.url: str | None = None
        self.builder: SnapshotBuilder | None = None
        if not config.ui:
            return
        server = serve(config.ui_host, config.ui_port, say)
        board = JobBoard(plan, config)
        self.builder = SnapshotBuilder(board, plan, metrics)
        self.url = self.builder.ui_url = f"{server.url}?job={board.job_id}"
        self.builder.finish("starting")  # the plan and config show before the first task
        server.add(board)

    def publish(self, attempt: Any) -> None:
        if self.builder is not None:
            self.builder.publish(attempt)

    def finish(self, state: str, error: str | None = None) -> None:
        if self.builder is not None:
            self.builder.finish(state, error)

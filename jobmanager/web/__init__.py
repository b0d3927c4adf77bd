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
    """One job on the dashboard: ``open`` joins (or starts) the driver's server
    (``ui=False``: does nothing, ``url`` stays None)."""

    def __init__(self, plan: JobPlan, config: JobConfig, metrics: RunMetrics) -> None:
        self.plan, self.config, self.metrics = plan, config, metrics
        self.url: str | None = None
        self.builder: SnapshotBuilder | None = None

    def open(self, say: Callable[[str], None]) -> str | None:
        """Serve this job; its address (None with ``ui=False``)."""
        if not self.config.ui:
            return None
        server = serve(self.config.ui_host, self.config.ui_port, say)
        board = JobBoard(self.plan, self.config)
        self.builder = SnapshotBuilder(board, self.plan, self.metrics)
        self.url = self.builder.ui_url = f"{server.url}?job={board.job_id}"
        self.builder.finish("starting")  # the plan and config show before the first task
        server.add(board)
        return self.url

    def publish(self, attempt: Any) -> None:
        if self.builder is not None:
            self.builder.publish(attempt)

    def restarting(self, message: str) -> None:
        """The job is between attempts; ``message`` says what it waits for."""
        if self.builder is not None:
            self.builder.restarting(message)

    def finish(self, state: str, error: str | None = None) -> None:
        if self.builder is not None:
            self.builder.finish(state, error)

"""A published job for the web modules' tests: fake attempt, coordinator and iteration
driver (the shapes ``jobmanager.web.snapshot`` reads), and a GET that returns errors."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from jobmanager.coordinator import CompletedCheckpoint
from jobmanager.failures import FailureCause
from jobmanager.metrics import RunMetrics
from jobmanager.result import FailedCheckpoint, Restart
from jobmanager.services import TaskInfo
from jobmanager.supersteps import IterationPhase
from jobmanager.web.server import DashboardServer
from jobmanager.web.snapshot import JobBoard, SnapshotBuilder
from runtime.config import JobConfig
from runtime.control import CheckpointFailureReason
from statebackend.metrics import AckMetrics, CheckpointSummary, TaskMetrics
from tests.jobmanager.fakes import small_plan


@dataclass
class FakeCoordinator:
    pending: dict[int, Any] = field(default_factory=dict)
    failed: list[FailedCheckpoint] = field(default_factory=list)


@dataclass
class FakeAttempt:
    number: int
    tasks: dict[int, TaskInfo]
    coordinator: FakeCoordinator = field(default_factory=FakeCoordinator)
    supersteps: Any = None  # an iteration's driver (jobmanager.supersteps)


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as res:
            return res.status, res.headers["Content-Type"], res.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


def published(srv: DashboardServer) -> tuple[JobBoard, SnapshotBuilder, FakeAttempt]:
    """A job with 4 tasks, a completed and a failed checkpoint and a restart, published."""
    plan = small_plan()
    metrics = RunMetrics(plan)
    metrics.start_attempt(None)
    board = JobBoard(plan, JobConfig(checkpoint_interval=1.0, storage_options={"secret": "x"}))
    builder = SnapshotBuilder(board, plan, metrics, interval=0.0)
    srv.add(board)
    tasks = {t.index: TaskInfo(t.task_id, t.subtask, pid=100 + t.index) for t in plan.tasks}
    for i, t in tasks.items():
        t.records_in = t.records_out = 10 * (i + 1)  # as the heartbeats set them
        t.metrics = TaskMetrics(
            records_in=10 * (i + 1),
            records_out=10 * (i + 1),
            bytes_out=1000,
            backpressure_seconds=0.25,
            uptime_seconds=1.0,
            idle_seconds=0.25,
            input_queue=i,
        )
    attempt = FakeAttempt(1, tasks, FakeCoordinator({5: object()}))
    attempt.coordinator.failed.append(
        FailedCheckpoint(3, CheckpointFailureReason.EXPIRED, "2 task(s) did not ack", attempt=1)
    )
    acks = {"src[0]": AckMetrics(alignment_ms=1.5, start_delay_ms=0.5, state_bytes=40)}
    summary = CheckpointSummary(tasks=1, mode="exactly_once", state_bytes=40)
    metrics.completed.append(CompletedCheckpoint(4, False, 42.0, summary, None, 1.0, acks))
    metrics.restarts.append(
        Restart(0, FailureCause.TASK_DIED, "task count[1] died", 2, time.time() - 2, None, None)
    )
    builder.publish(attempt)
    return board, builder, attempt


@dataclass
class FakeSupersteps:
    phase: IterationPhase
    current: int

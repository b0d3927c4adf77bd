"""The job manager's state as the dashboard sees it: immutable snapshots.

`SnapshotBuilder` runs on the job-manager thread. The attempt loop calls ``publish``
on every turn; at most every ``interval`` seconds it builds a new `JobSnapshot` from the
task table (the last heartbeat of each task: `statebackend.metrics.TaskMetrics`), the
run's checkpoints and restarts, and hands it to the `JobBoard` by replacing one
reference. The web server's threads only ever read ``board.latest``: they never lock,
wait for or call into the job manager, so a slow or stuck browser cannot slow the job.
Building costs O(tasks + new checkpoints) per interval, nothing per record; the
checkpoint history kept is bounded (``HISTORY``); the duration histogram counts all.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypedDict

from jobmanager.metrics import RecordCounts, RunMetrics
from runtime.config import JobConfig
from runtime.plan import JobPlan
from statebackend.metrics import TaskMetrics

if TYPE_CHECKING:
    from jobmanager.coordinator import CompletedCheckpoint
    from jobmanager.result import FailedCheckpoint, IterationProgress, Restart
    from jobmanager.services import TaskInfo

HISTORY = 200  # completed (and failed) checkpoints kept for the API and the dashboard
DURATION_BUCKETS_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
"""Upper bounds (ms) of the checkpoint duration histogram (``/metrics``)."""


# -- the JSON payloads of the REST API (and the dashboard), one per kind of row -----------
JsonScalar = str | int | float | bool | None
"""A setting as ``/config`` shows it: enums by value, other objects by ``repr``."""


class JobRow(TypedDict):
    id: str
    name: str
    state: str  # running | finished | failed
    error: str | None
    message: str | None  # what the job waits for (e.g. task slots for a restart), if anything
    attempt: int
    started_at: float
    duration_seconds: float
    records_in: int
    records_out: int
    tasks: int
    checkpoints_completed: int
    checkpoints_failed: int
    checkpoints_pending: list[int]
    last_checkpoint_id: int | None
    restarts: int
    refused_connections: int
    ui_url: str


class TaskCheckpointRow(TypedDict):
    alignment_ms: float
    start_delay_ms: float
    sync_ms: float
    async_ms: float
    state_bytes: int
    full_state_bytes: int
    keys: int
    channel_state_bytes: int
    backedge_bytes: int


class CheckpointRow(TypedDict):
    checkpoint_id: int
    attempt: int
    final: bool
    mode: str
    trigger_time: float
    duration_ms: float
    state_bytes: int
    full_state_bytes: int
    keys: int
    channel_state_bytes: int
    backedge_bytes: int
    spilled_bytes: int
    max_alignment_ms: float
    max_start_delay_ms: float
    critical_task: str
    queueing_ms: float
    alignment_ms: float
    write_ms: float
    committed_records_in: int | None
    path: str | None
    tasks: dict[str, TaskCheckpointRow]


class FailedRow(TypedDict):
    checkpoint_id: int
    attempt: int
    reason: str
    detail: str


class RestartRow(TypedDict):
    attempt: int
    cause: str
    cause_text: str
    reason: str
    error: str | None
    restored_checkpoint: int | None
    failed_at: float
    resumed_at: float | None
    recovery_seconds: float | None


class TaskRow(TypedDict):
    index: int
    task_id: str
    subtask: int
    chain: int
    source: bool
    sink: bool
    host: str
    pid: int
    endpoint: str
    state: str  # starting | running | finished
    records_in: int
    records_out: int
    records_in_per_second: float
    records_out_per_second: float
    bytes_in: int
    bytes_out: int
    backpressure_seconds: float
    backpressure_share: float
    busy_share: float
    input_queue: int
    output_queue: int
    rss_bytes: int
    uptime_seconds: float
    watermark: float | None
    state_keys: int | None
    state_bytes: int | None
    refused_connections: int
    malformed_frames: int
    aligned_pause_seconds: float  # a source paused by watermark alignment (max_drift)


class PlanStep(TypedDict):
    id: int
    name: str
    kind: str
    parallelism: int
    chain: int | None


class PlanChain(TypedDict):
    id: int
    name: str
    parallelism: int
    steps: list[str]


class PlanTask(TypedDict):
    index: int
    task_id: str
    chain: int
    subtask: int


class PlanChannel(TypedDict):
    id: int
    source_task: int
    target_task: int
    source_step: str
    target_step: str
    partitioning: str
    back_edge: bool


class PlanView(TypedDict):
    name: str
    max_parallelism: int
    steps: list[PlanStep]
    chains: list[PlanChain]
    tasks: list[PlanTask]
    channels: list[PlanChannel]
    back_edges: list[int]


class CoordinatorView(Protocol):
    @property
    def pending(self) -> Mapping[int, object]: ...
    @property
    def failed(self) -> Sequence[FailedCheckpoint]: ...


class SuperstepsView(Protocol):
    """What a snapshot reads of an iteration's driver (``jobmanager.supersteps``)."""

    @property
    def phase(self) -> enum.Enum: ...
    @property
    def current(self) -> int: ...


class AttemptView(Protocol):
    """What a snapshot reads of the running attempt (``jobmanager.attempt.Attempt``)."""

    @property
    def number(self) -> int: ...
    @property
    def tasks(self) -> Mapping[int, TaskInfo]: ...
    @property
    def coordinator(self) -> CoordinatorView: ...
    @property
    def supersteps(self) -> SuperstepsView | None: ...


@dataclass(frozen=True)
class JobSnapshot:
    """One published state of a job; JSON-ready maps, never changed once published."""

    job: JobRow
    tasks: tuple[TaskRow, ...]
    checkpoints: tuple[CheckpointRow, ...]  # completed, oldest first
    failed_checkpoints: tuple[FailedRow, ...]
    restarts: tuple[RestartRow, ...]
    duration_buckets: tuple[int, ...]  # cumulative counts per DURATION_BUCKETS_MS, then +Inf
    duration_sum_ms: float
    iteration: Mapping[str, object] | None = None  # an iteration's supersteps (iteration_view)
    published_at: float = field(default_factory=time.time)


class JobBoard:
    """What the server knows of one job: its static plan and config, and the latest
    snapshot (replaced, never mutated, by the job-manager thread)."""

    def __init__(self, plan: JobPlan, config: JobConfig) -> None:
        self.job_id = f"{plan.name}-{uuid.uuid4().hex[:6]}"
        self.name = plan.name
        self.plan = plan_view(plan)
        self.config = config_view(config)
        self.latest: JobSnapshot | None = None


def plan_view(plan: JobPlan) -> PlanView:
    chain_of_step = {s: c.id for c in plan.chains for s in c.step_ids}
    return {
        "name": plan.name,
        "max_parallelism": plan.max_parallelism,
        "steps": [
            {
                "id": s.id,
                "name": s.name,
                "kind": s.kind.value,
                "parallelism": s.parallelism,
                "chain": chain_of_step.get(s.id),
            }
            for s in plan.steps
        ],
        "chains": [
            {
                "id": c.id,
                "name": c.name,
                "parallelism": c.parallelism,
                "steps": [plan.steps[s].name for s in c.step_ids],
            }
            for c in plan.chains
        ],
        "tasks": [
            {"index": t.index, "task_id": t.task_id, "chain": t.chain, "subtask": t.subtask}
            for t in plan.tasks
        ],
        "channels": [
            {
                "id": c.id,
                "source_task": c.source_task,
                "target_task": c.target_task,
                "source_step": plan.steps[c.source_step].name,
                "target_step": plan.steps[c.target_step].name,
                "partitioning": c.partitioning.value,
                "back_edge": c.back_edge,
            }
            for c in plan.channels
        ],
        "back_edges": [c.id for c in plan.channels if c.back_edge],
    }


def config_view(config: JobConfig) -> dict[str, JsonScalar]:
    """The settings, JSON-ready; ``storage_options`` (credentials) are left out."""
    out: dict[str, JsonScalar] = {}
    for f in dataclasses.fields(config):
        if f.name == "storage_options":
            continue
        value = getattr(config, f.name)
        if hasattr(value, "value") and not isinstance(value, int | float | str):
            value = value.value  # enums
        elif value is not None and not isinstance(value, bool | int | float | str):
            value = repr(value)
        out[f.name] = value
    return out


def iteration_view(progress: IterationProgress, phase: str, superstep: int) -> dict[str, object]:
    """An iteration's supersteps, JSON-ready: ``phase`` (loading, superstep, checkpoint,
    emitting, ended, stopped; ``finished``/``failed`` once the job ended), the
    ``superstep`` running (or last started), those agreed so far, the convergence
    aggregate of each (the last ``HISTORY``), superstep checkpoints and recoveries."""
    aggregates = progress.aggregates[-HISTORY:]
    return {
        "phase": phase,
        "superstep": superstep,
        "supersteps_done": progress.supersteps,
        "supersteps_started": progress.supersteps_started,
        "converged": progress.converged,
        "aggregate": aggregates[-1][1] if aggregates else None,
        "aggregates": [{"superstep": k, "aggregate": a} for k, a in aggregates],
        "superstep_seconds": [
            {"superstep": k, "seconds": round(t, 6)}
            for k, t in progress.superstep_seconds[-HISTORY:]
        ],
        "checkpoints": [{"superstep": k, "checkpoint_id": n} for k, n in progress.checkpoints],
        "recoveries": [
            {"failed_during": r.failed_during, "resumed_from": r.resumed_from, "rerun": r.rerun}
            for r in progress.recoveries
        ],
        "rerun": progress.rerun,
    }


class SnapshotBuilder:
    """Publishes the running job's state to ``board`` (see the module docstring)."""

    def __init__(
        self, board: JobBoard, plan: JobPlan, metrics: RunMetrics, interval: float = 0.5
    ) -> None:
        self.board, self.plan, self.metrics, self.interval = board, plan, metrics, interval
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.ui_url = ""
        self._next = 0.0
        self._seen_completed = 0
        self._history: deque[CheckpointRow] = deque(maxlen=HISTORY)
        self._buckets = [0] * (len(DURATION_BUCKETS_MS) + 1)
        self._duration_sum = 0.0
        self._rates: dict[int, tuple[float, int, int, float, float]] = {}
        self._attempt_of: dict[int, int] = {}  # checkpoint id -> attempt
        self._tasks: tuple[TaskRow, ...] = ()
        self._attempt = 0
        self._last: AttemptView | None = None  # the attempt last published
        self._phase, self._superstep = "", 0  # an iteration's, as last published

    # -- called by the job manager ----------------------------------------------------------
    def publish(self, attempt: AttemptView) -> None:
        """From the attempt loop (every turn): a new snapshot at most every ``interval``."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.interval
        self._attempt, self._last = attempt.number, attempt
        for n in attempt.coordinator.pending:
            self._attempt_of.setdefault(n, attempt.number)
        self._tasks = tuple(self._task_rows(attempt))
        if attempt.supersteps is not None:
            self._phase = attempt.supersteps.phase.value
            self._superstep = attempt.supersteps.current
        failed = [*self.metrics.failed_checkpoints, *attempt.coordinator.failed]
        live = self.metrics.live(attempt.tasks)
        self._publish("running", failed, sorted(attempt.coordinator.pending), live)

    def restarting(self, message: str) -> None:
        """Between two attempts (the failed one ended, the next is not submitted yet, e.g.
        while the job waits for task slots): published at once, ``message`` says why."""
        self._last = None
        self._publish(
            "restarting",
            list(self.metrics.failed_checkpoints),
            [],
            self.metrics.committed(),
            message=message,
        )

    def finish(self, state: str, error: str | None = None) -> None:
        """The job ended (``finished`` or ``failed``): the last snapshot stays up, with
        the tasks' final figures (from ``Finished``)."""
        if self._last is not None:
            self._tasks = tuple(self._task_rows(self._last))
            self._last = None
        failed = list(self.metrics.failed_checkpoints)
        self._publish(state, failed, [], self.metrics.committed(), error)

    # -- building ------------------------------------------------------------------------
    def _publish(
        self,
        state: str,
        failed: Sequence[FailedCheckpoint],
        pending: list[int],
        counts: RecordCounts,
        error: str | None = None,
        message: str | None = None,
    ) -> None:
        """``counts``: where the job is (running: live counts; ended: committed ones)."""
        self._take_completed()
        m = self.metrics
        last = self._history[-1]["checkpoint_id"] if self._history else None
        job: JobRow = {
            "id": self.board.job_id,
            "name": self.board.name,
            "state": state,
            "error": error,
            "message": message,
            "attempt": self._attempt,
            "started_at": self.started_wall,
            "duration_seconds": round(time.monotonic() - self.started, 3),
            "records_in": counts.records_in,
            "records_out": counts.records_out,
            "tasks": len(self.plan.tasks),
            "checkpoints_completed": m.checkpoints_completed,
            "checkpoints_failed": len(failed),
            "checkpoints_pending": pending,
            "last_checkpoint_id": last,
            "restarts": len(m.restarts),
            "refused_connections": m.refused(),
            "ui_url": self.ui_url,
        }
        self.board.latest = JobSnapshot(
            job=job,
            tasks=self._tasks,
            checkpoints=tuple(self._history),
            failed_checkpoints=tuple(self._failed_row(f) for f in failed[-HISTORY:]),
            restarts=tuple(self._restart_row(r) for r in m.restarts[-HISTORY:]),
            duration_buckets=tuple(self._buckets),
            duration_sum_ms=self._duration_sum,
            iteration=None
            if m.iteration is None
            else iteration_view(
                m.iteration, self._phase if state == "running" else state, self._superstep
            ),
        )

    def _take_completed(self) -> None:
        completed = self.metrics.completed
        for c in completed[self._seen_completed :]:
            self._history.append(self._checkpoint_row(c))
            self._buckets[bisect.bisect_left(DURATION_BUCKETS_MS, c.duration_ms)] += 1
            self._duration_sum += c.duration_ms
        self._seen_completed = len(completed)

    def _checkpoint_row(self, c: CompletedCheckpoint) -> CheckpointRow:
        s = c.metrics
        committed = self.metrics.committed_at.get(c.checkpoint_id)
        return {
            "checkpoint_id": c.checkpoint_id,
            "attempt": self._attempt_of.get(c.checkpoint_id, self._attempt),
            "final": c.final,
            "mode": s.mode,
            "trigger_time": c.trigger_time,
            "duration_ms": round(c.duration_ms, 3),
            "state_bytes": s.state_bytes,  # written for this checkpoint
            "full_state_bytes": s.full_state_bytes or s.state_bytes,  # what it restores from
            "keys": s.keys,
            "channel_state_bytes": s.channel_state_bytes,
            "backedge_bytes": s.backedge_bytes,
            "spilled_bytes": s.spilled_bytes,
            "max_alignment_ms": s.max_alignment_ms,
            "max_start_delay_ms": s.max_start_delay_ms,
            "critical_task": s.critical_task,
            "queueing_ms": s.queueing_ms,
            "alignment_ms": s.alignment_ms,
            "write_ms": s.write_ms,
            "committed_records_in": committed.records_in if committed else None,
            "path": c.path,
            "tasks": {
                task: {
                    "alignment_ms": a.alignment_ms,
                    "start_delay_ms": a.start_delay_ms,
                    "sync_ms": a.sync_ms,
                    "async_ms": a.async_ms,
                    "state_bytes": a.state_bytes,
                    "full_state_bytes": a.full_state_bytes or a.state_bytes,
                    "keys": a.keys,
                    "channel_state_bytes": a.channel_state_bytes,
                    "backedge_bytes": a.backedge_bytes,
                }
                for task, a in c.task_metrics.items()
            },
        }

    @staticmethod
    def _failed_row(f: FailedCheckpoint) -> FailedRow:
        return {
            "checkpoint_id": f.checkpoint_id,
            "attempt": f.attempt,
            "reason": f.reason.name,
            "detail": f.detail,
        }

    @staticmethod
    def _restart_row(r: Restart) -> RestartRow:
        return {
            "attempt": r.attempt,
            "cause": r.cause.name,
            "cause_text": r.cause.value,
            "reason": r.reason,
            "error": r.error,
            "restored_checkpoint": r.restored_checkpoint,
            "failed_at": r.failed_at,
            "resumed_at": r.resumed_at,
            "recovery_seconds": r.recovery_seconds,
        }

    def _task_rows(self, attempt: AttemptView) -> list[TaskRow]:
        sources = self.metrics.source_tasks
        sinks = self.metrics.sink_tasks
        rows: list[TaskRow] = []
        latest = self.metrics.completed[-1].task_metrics if self.metrics.completed else {}
        for index, t in sorted(attempt.tasks.items()):
            m = t.metrics
            rate_in, rate_out = self._rate(index, m)
            acked = latest.get(t.task_id)
            rows.append(
                {
                    "index": index,
                    "task_id": t.task_id,
                    "subtask": t.subtask,
                    "chain": self.plan.tasks[index].chain,
                    "source": index in sources,
                    "sink": index in sinks,
                    "host": t.host,
                    "pid": t.pid,
                    "endpoint": t.endpoint,  # its input gate (TCP), "" for a source
                    "state": "finished" if t.finished else "running" if t.pid else "starting",
                    "records_in": max(t.records_in, m.records_in),
                    "records_out": max(t.records_out, m.records_out),
                    "records_in_per_second": rate_in,
                    "records_out_per_second": rate_out,
                    "bytes_in": m.bytes_in,
                    "bytes_out": m.bytes_out,
                    "backpressure_seconds": m.backpressure_seconds,
                    "backpressure_share": round(m.backpressure_share, 4),
                    "busy_share": round(m.busy_share, 4),
                    "input_queue": m.input_queue,
                    "output_queue": m.output_queue,
                    "rss_bytes": m.rss_bytes,
                    "uptime_seconds": m.uptime_seconds,
                    "watermark": m.watermark,
                    # keyed state at the last completed checkpoint: keys and whole bytes
                    "state_keys": acked.keys if acked is not None else None,
                    "state_bytes": (acked.full_state_bytes or acked.state_bytes)
                    if acked is not None
                    else None,
                    "refused_connections": m.refused_connections,
                    "malformed_frames": m.malformed_frames,
                    "aligned_pause_seconds": m.aligned_pause_seconds,
                }
            )
        return rows

    def _rate(self, index: int, m: TaskMetrics) -> tuple[float, float]:
        """Records/s over the last two heartbeats of this task (kept until a new one)."""
        prev = self._rates.get(index)
        if prev is None or m.uptime_seconds < prev[0]:  # first heartbeat, or a new attempt
            self._rates[index] = (m.uptime_seconds, m.records_in, m.records_out, 0.0, 0.0)
            return 0.0, 0.0
        up, rin, rout, rate_in, rate_out = prev
        dt = m.uptime_seconds - up
        if dt > 0:
            rate_in = round((m.records_in - rin) / dt, 1)
            rate_out = round((m.records_out - rout) / dt, 1)
            self._rates[index] = (m.uptime_seconds, m.records_in, m.records_out, rate_in, rate_out)
        return rate_in, rate_out

"""Figures of one run over all its attempts: committed (exactly-once) record counts,
the work replayed after restores, checkpoints, start-up and recovery times, per-task
figures; and the records collect sinks committed. Driver side, job-manager thread only.

Committed counts come from the checkpoints: with every ack a task reports its
``records_in``/``records_out`` at the snapshot (since its attempt started). A completed
checkpoint n of an attempt that restored checkpoint r has committed
``committed(r) + sum over source tasks of records_in`` records in, and likewise the
sink tasks' ``records_out`` out; the final checkpoint's figures are the job's. (With
``snapshot_mode="at_least_once"`` the counts at a restored checkpoint are not a
consistent cut, and neither is its output: the figures are then approximate.)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from jobmanager.coordinator import CompletedCheckpoint
from jobmanager.result import (
    CheckpointStats,
    FailedCheckpoint,
    IterationProgress,
    JobResult,
    Restart,
)
from runtime.graph import StepKind
from runtime.plan import JobPlan
from runtime.sinks import CollectSink
from statebackend.metrics import AckMetrics, TaskMetrics

log = logging.getLogger("absflow.jobmanager")


@dataclass(frozen=True)
class RecordCounts:
    """Records read by the sources (``records_in``) and given to the sinks (``records_out``)."""

    records_in: int = 0
    records_out: int = 0

    def __add__(self, other: RecordCounts) -> RecordCounts:
        return RecordCounts(
            self.records_in + other.records_in, self.records_out + other.records_out
        )

    def beyond(self, committed: RecordCounts) -> RecordCounts:
        """What this (processed) count holds beyond ``committed``; never negative."""
        return RecordCounts(
            max(0, self.records_in - committed.records_in),
            max(0, self.records_out - committed.records_out),
        )


class TaskFigures(Protocol):
    """What the metrics read of a task of an attempt (``attempt.TaskInfo`` has it)."""

    task_id: str
    records_in: int
    records_out: int
    peak_rss: int
    first_record_at: float
    metrics: TaskMetrics


def sink_task_indexes(plan: JobPlan) -> set[int]:
    """Tasks whose chain ends in a sink (their ``records_out`` are sink records)."""
    return {t.index for t in plan.tasks if plan.chain_steps(t)[-1].kind is StepKind.SINK}


class RunMetrics:
    """Figures of a run. Attempts report in order: ``start_attempt``, then snapshot counts,
    completed checkpoints and the first record, then ``end_attempt``."""

    def __init__(self, plan: JobPlan) -> None:
        self.iteration: IterationProgress | None = (
            IterationProgress() if any(s.kind is StepKind.SUPERSTEP for s in plan.steps) else None
        )
        """An iteration's supersteps over the run (``jobmanager.supersteps``)."""
        self.source_tasks = {t.index for t in plan.source_tasks}
        self.sink_tasks = sink_task_indexes(plan)
        self.completed: list[CompletedCheckpoint] = []  # every attempt's, in order
        self.committed_at: dict[int, RecordCounts] = {}  # checkpoint id -> committed counts
        self.failed_checkpoints: list[FailedCheckpoint] = []
        self.restarts: list[Restart] = []
        self.startup_seconds: float | None = None
        self.task_metrics: dict[str, TaskMetrics] = {}
        self.peak_rss: dict[str, int] = {}
        self.processed = RecordCounts()  # by ended attempts, replays included
        self.base = RecordCounts()  # committed by the checkpoint the running attempt restored
        self._at_snapshot: dict[int, dict[int, RecordCounts]] = {}  # running attempt's acks
        self._last_attempt = RecordCounts()  # the last ended attempt's own counts
        self._counted = self._nonfinal = 0  # of ``completed``: see checkpoints_completed
        # Connections the driver's own sockets refused (secure_channels); the runner sets it.
        self.refused: Callable[[], int] = lambda: 0

    # -- attempts --------------------------------------------------------------------------
    def start_attempt(self, restored: int | None) -> None:
        """An attempt starts from checkpoint ``restored`` (None: from scratch, or from a
        checkpoint of another run: counts are this run's)."""
        self.base = self.committed_at.get(restored, RecordCounts()) if restored else RecordCounts()
        self._at_snapshot.clear()

    def on_snapshot(self, task_index: int, checkpoint_id: int, ack_metrics: AckMetrics) -> None:
        """A task acked ``checkpoint_id`` with its counts at the snapshot."""
        counts = RecordCounts(ack_metrics.records_in, ack_metrics.records_out)
        self._at_snapshot.setdefault(checkpoint_id, {})[task_index] = counts

    def on_checkpoint_completed(self, cp: CompletedCheckpoint) -> None:
        self.completed.append(cp)
        acks = self._at_snapshot.pop(cp.checkpoint_id, {})
        for older in [n for n in self._at_snapshot if n < cp.checkpoint_id]:
            del self._at_snapshot[older]  # subsumed: they never complete
        if not self.source_tasks | self.sink_tasks <= acks.keys():
            log.debug("checkpoint %d: no record counts from every task", cp.checkpoint_id)
            return
        self.committed_at[cp.checkpoint_id] = self.base + RecordCounts(
            sum(acks[i].records_in for i in self.source_tasks),
            sum(acks[i].records_out for i in self.sink_tasks),
        )

    def on_first_record(self, attempt: int, first_wall: float, submit_wall: float) -> None:
        """The attempt processed its first record at wall clock ``first_wall``."""
        if attempt == 0 and self.startup_seconds is None:
            self.startup_seconds = first_wall - submit_wall
        if self.restarts and self.restarts[-1].resumed_at is None:
            self.restarts[-1].resumed_at = first_wall

    def live(self, tasks: Mapping[int, TaskFigures]) -> RecordCounts:
        """Where the running attempt is in the job's records (for the progress line)."""
        return self.base + self._own(tasks)

    def end_attempt(
        self,
        tasks: Mapping[int, TaskFigures],
        finished: bool,
        failed_checkpoints: Iterable[FailedCheckpoint],
    ) -> None:
        """The attempt ended (``finished``: every task finished). Its tasks' last counts
        (from Finished, else the last heartbeat or ack) count as processed work."""
        own = self._own(tasks)
        self._last_attempt = own
        self.processed = self.processed + own
        self.failed_checkpoints.extend(failed_checkpoints)
        if finished:
            for t in tasks.values():
                figures = t.metrics
                if t.first_record_at and not figures.first_record_at:
                    figures = dataclasses.replace(figures, first_record_at=t.first_record_at)
                self.task_metrics[t.task_id] = figures
                self.peak_rss[t.task_id] = max(t.peak_rss, t.metrics.peak_rss)

    def _own(self, tasks: Mapping[int, TaskFigures]) -> RecordCounts:
        return RecordCounts(
            sum(tasks[i].records_in for i in self.source_tasks if i in tasks),
            sum(tasks[i].records_out for i in self.sink_tasks if i in tasks),
        )

    # -- figures ---------------------------------------------------------------------------
    @property
    def checkpoints_completed(self) -> int:
        """Completed non-final checkpoints of the run, over all attempts."""
        # Counted incrementally (``completed`` only grows): the attempt's loop asks on
        # every turn, and a long run completes thousands of checkpoints.
        completed = self.completed
        if self._counted < len(completed):
            self._nonfinal += sum(1 for c in completed[self._counted :] if not c.final)
            self._counted = len(completed)
        return self._nonfinal

    def committed(self) -> RecordCounts:
        """Exactly-once counts of a finished run: the final checkpoint's figures (or, when a
        task did not report counts, the restored checkpoint's plus the last attempt's)."""
        finals = [c for c in self.completed if c.final]
        if finals and finals[-1].checkpoint_id in self.committed_at:
            return self.committed_at[finals[-1].checkpoint_id]
        return self.base + self._last_attempt

    def result(
        self,
        name: str,
        outputs: dict[str, list[Any]],
        duration: float,
        checkpoint_dir: str | None,
        unfired_faults: list[str],
    ) -> JobResult:
        committed = self.committed()
        replayed = self.processed.beyond(committed)
        return JobResult(
            name=name,
            outputs=outputs,
            duration=duration,
            records_in=committed.records_in,
            records_out=committed.records_out,
            replayed_in=replayed.records_in,
            replayed_out=replayed.records_out,
            startup_seconds=self.startup_seconds,
            restarts=self.restarts,
            checkpoints=[self._checkpoint_figures(c) for c in self.completed],
            failed_checkpoints=self.failed_checkpoints,
            peak_rss=self.peak_rss,
            checkpoint_dir=checkpoint_dir,
            task_metrics=self.task_metrics,
            unfired_faults=unfired_faults,
            iteration=self.iteration,
        )

    def _checkpoint_figures(self, c: CompletedCheckpoint) -> CheckpointStats:
        counts = self.committed_at.get(c.checkpoint_id)
        return CheckpointStats(
            c.checkpoint_id,
            c.final,
            c.duration_ms,
            c.metrics,
            dict(c.task_metrics),  # each task's part (its ack): the barriers, hop by hop
            None if counts is None else counts.records_in,
            None if counts is None else counts.records_out,
        )


class CommittedOutputs:
    """Records the collect sinks committed, one batch per (sink step, subtask, checkpoint):
    the first copy wins, so a re-commit after a restore is dropped; batches committed
    after the restored checkpoint are forgotten (the sources replay them). A run restored
    from another run's checkpoint ``committed_up_to`` drops the batches of checkpoints up to
    it: the sinks recommit them on restore, but that run returned them already."""

    def __init__(self, plan: JobPlan, committed_up_to: int = 0) -> None:
        self.collect_sinks = [
            s.name for s in plan.steps if s.kind is StepKind.SINK and isinstance(s.fn, CollectSink)
        ]
        self._batches: dict[tuple[str, int, int], list[Any] | bytes] = {}
        self.committed_up_to = committed_up_to

    def add(
        self, step: str, subtask: int, checkpoint_id: int, records: Iterable[Any] | bytes
    ) -> None:
        """A committed batch: its records, or a msgpack-packed list of them, kept packed
        (the driver's loop does not unpack them while the job runs)."""
        if checkpoint_id <= self.committed_up_to:
            return
        batch = records if isinstance(records, bytes) else list(records)
        self._batches.setdefault((step, subtask, checkpoint_id), batch)

    def drop_after(self, checkpoint_id: int | None) -> None:
        """The run restarts from ``checkpoint_id`` (None: from scratch)."""
        limit = checkpoint_id or 0
        for key in [k for k in self._batches if k[2] > limit]:
            del self._batches[key]

    def outputs(self) -> dict[str, list[Any]]:
        """Every collect sink's records (empty lists included), in checkpoint order, then
        subtask order within a checkpoint."""
        out: dict[str, list[Any]] = {name: [] for name in self.collect_sinks}
        for (step, _subtask, _n), records in sorted(
            self._batches.items(), key=lambda kv: (kv[0][2], kv[0][1])
        ):
            if isinstance(records, bytes):
                records = msgpack.unpackb(records, raw=False, strict_map_key=False, use_list=False)
            out.setdefault(step, []).extend(records)
        return out

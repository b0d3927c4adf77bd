"""What ``Dataflow.run()`` returns: outputs of collect sinks, restarts, checkpoints, figures."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobmanager.failures import FailureCause
from runtime.control import CheckpointFailureReason
from statebackend.metrics import AckMetrics, CheckpointSummary, TaskMetrics


@dataclass
class Restart:
    """One restart: attempt ``attempt`` failed, the next one restored ``restored_checkpoint``."""

    attempt: int  # the attempt that failed
    cause: FailureCause
    reason: str  # the failure in words: cause, operator, subtask, exception
    restored_checkpoint: int | None  # what the next attempt restored (None: from scratch)
    failed_at: float  # wall clock (of the injected kill, when one caused it)
    error: str | None = None  # the exception as "Type: message" (or what was observed)
    resumed_at: float | None = None  # first record processed by the next attempt (wall clock)

    @property
    def recovery_seconds(self) -> float | None:
        return None if self.resumed_at is None else self.resumed_at - self.failed_at


class RecoveryKind(enum.Enum):
    """How the next attempt of an iteration recovered; the value is the human message."""

    START = "from the start"
    CHECKPOINT = "from a superstep checkpoint"
    OPTIMISTIC = "optimistically: the survivors' rescued state, the lost keys compensated"


@dataclass(frozen=True)
class SuperstepRecovery:
    """An iteration's attempt failed during superstep ``failed_during`` (``loading``: before
    it started any superstep, so ``failed_during`` is the one it was restored at); the next
    one went on after superstep ``resumed_from`` (0: from the start), ``kind`` says from
    what. ``note`` says why a fallback happened (the rescue failed); optimistic recovery
    lists the ``lost`` loop-head subtasks, the ``lost_keys`` it compensated and, when the
    values are numbers, their sum after the compensation (``mass_after``)."""

    failed_during: int
    resumed_from: int
    kind: RecoveryKind = RecoveryKind.CHECKPOINT
    note: str = ""
    lost: tuple[int, ...] = ()
    loading: bool = False
    lost_keys: int = 0
    mass_after: float | None = None

    @property
    def rerun(self) -> int:
        """Supersteps that ran again because of the failure."""
        return self.failed_during - self.resumed_from


@dataclass
class IterationProgress:
    """What an iteration did over the whole run (all attempts): ``supersteps`` agreed
    (the last one), whether it ``converged`` (else it stopped at max_supersteps), the
    convergence aggregate and time of each superstep, its superstep checkpoints as
    ``(superstep, checkpoint id)``, and its recoveries."""

    supersteps: int = 0
    converged: bool = False
    supersteps_started: int = 0
    aggregates: list[tuple[int, float]] = field(default_factory=list)
    superstep_seconds: list[tuple[int, float]] = field(default_factory=list)
    checkpoints: list[tuple[int, int]] = field(default_factory=list)
    recoveries: list[SuperstepRecovery] = field(default_factory=list)
    failed_during: int | None = None
    """The superstep a failed attempt was in, until the next attempt records its recovery."""
    failed_loading: bool = False
    """The failed attempt had not started a superstep (it was loading or compensating)."""
    planned: SuperstepRecovery | None = None
    """How the job manager chose to recover (kind, note, lost), for the next attempt to
    record with the superstep it failed during and the one it resumes from."""

    @property
    def rerun(self) -> int:
        return sum(r.rerun for r in self.recoveries)


@dataclass(frozen=True, slots=True)
class FailedCheckpoint:
    """A checkpoint aborted in attempt ``attempt``, for ``reason`` (``detail``: the specifics)."""

    checkpoint_id: int
    reason: CheckpointFailureReason
    detail: str
    attempt: int = 0


@dataclass(frozen=True, slots=True)
class CheckpointStats:
    """One completed checkpoint of a run: ``summary`` over its tasks (durations, sizes,
    what it waited for: `statebackend.metrics.CheckpointSummary`), each task's own part
    in ``tasks`` (its ack: start delay from the trigger to its first barrier, alignment,
    sync and async time, ...), and the job's committed record counts at it (None when a
    task reported none)."""

    checkpoint_id: int
    final: bool
    duration_ms: float
    summary: CheckpointSummary
    tasks: Mapping[str, AckMetrics] = field(default_factory=dict)
    committed_records_in: int | None = None
    committed_records_out: int | None = None

    def encode(self) -> dict[str, Any]:
        """As a JSON map: id, final, duration, the summary's figures, the committed counts
        (when known) and ``tasks`` (each task's ack figures)."""
        out: dict[str, Any] = {
            "checkpoint_id": self.checkpoint_id,
            "final": self.final,
            "duration_ms": self.duration_ms,
            **self.summary.encode(),
        }
        if self.committed_records_in is not None:
            out["committed_records_in"] = self.committed_records_in
        if self.committed_records_out is not None:
            out["committed_records_out"] = self.committed_records_out
        out["tasks"] = {task: m.encode() for task, m in self.tasks.items()}
        return out


@dataclass
class JobResult:
    """What a finished run did.

    ``records_in``/``records_out`` are exactly-once figures: records the sources read and
    the sinks were given up to the final committed checkpoint (for a collect sink, the
    records returned). Work that failed attempts did beyond the checkpoint the next one
    restored, and that was therefore done again, is ``replayed_in``/``replayed_out``
    (from the tasks' last reports before they failed: a lower bound). A run restored from
    another run's checkpoint counts its own records only.
    """

    name: str
    outputs: dict[str, list[Any]]
    duration: float
    records_in: int  # committed: read by the sources, each record once
    records_out: int  # committed: given to the sinks, each record once
    startup_seconds: float | None  # submit -> first record processed
    restarts: list[Restart] = field(default_factory=list)
    checkpoints: list[CheckpointStats] = field(default_factory=list)  # completed, in order
    failed_checkpoints: list[FailedCheckpoint] = field(default_factory=list)
    peak_rss: dict[str, int] = field(default_factory=dict)
    checkpoint_dir: str | None = None
    task_metrics: dict[str, TaskMetrics] = field(default_factory=dict)  # at the end, by task
    unfired_faults: list[str] = field(default_factory=list)  # injected kills the job outran
    replayed_in: int = 0  # read again after restores (beyond the committed records_in)
    replayed_out: int = 0  # given to the sinks again after restores
    ui_url: str | None = None  # the job on the dashboard (up until the driver exits)
    stopped: bool = False  # ended by a stop request (SIGTERM, Ctrl-C, `jobmanager stop`)
    savepoint: str | None = None  # the savepoint the stop left: run(restore_from=savepoint)
    iteration: IterationProgress | None = None  # an iteration's supersteps (runtime.superstep)

    def output(self, name: str | None = None) -> list[Any]:
        """Records of the collect sink ``name`` (may be omitted when there is one)."""
        if name is None:
            if len(self.outputs) != 1:
                raise KeyError(f"the job has collect sinks {sorted(self.outputs)}; name one")
            return next(iter(self.outputs.values()))
        if name not in self.outputs:
            raise KeyError(f"no collect sink named {name!r}; collect sinks: {sorted(self.outputs)}")
        return self.outputs[name]

    @property
    def records_per_second(self) -> float:
        """Committed records in per second of the whole run (restarts included)."""
        return self.records_in / self.duration if self.duration > 0 else 0.0

    @property
    def checkpoints_completed(self) -> int:
        """Completed checkpoints of the run (every attempt's), the final one not counted."""
        return sum(1 for c in self.checkpoints if not c.final)

    def summary(self) -> str:
        lines = [
            f"job '{self.name}': {self.records_in:,} records in, {self.records_out:,} out "
            f"(committed) in {self.duration:.2f} s ({self.records_per_second:,.0f} records/s)"
        ]
        if self.savepoint is not None:
            lines.append(f"  stopped with savepoint {self.savepoint}")
        elif self.stopped:
            lines.append("  stopped (no checkpointing: no savepoint)")
        if self.restarts:
            lines.append(
                f"  replayed after restores: {self.replayed_in:,} records in, "
                f"{self.replayed_out:,} out"
            )
        if self.startup_seconds is not None:
            lines.append(f"  start-up (submit -> first record): {self.startup_seconds:.2f} s")
        if self.checkpoints:
            durations = sorted(c.duration_ms for c in self.checkpoints)
            final = " + final" if any(c.final for c in self.checkpoints) else ""
            lines.append(
                f"  checkpoints: {self.checkpoints_completed} completed{final}, "
                f"{len(self.failed_checkpoints)} failed, median duration "
                f"{durations[len(durations) // 2]:.1f} ms"
            )

            def median(figure: Callable[[CheckpointSummary], float]) -> float:
                values = sorted(float(figure(c.summary)) for c in self.checkpoints)
                return values[len(values) // 2]

            queueing = median(lambda s: s.queueing_ms)
            alignment = median(lambda s: s.alignment_ms)
            write = median(lambda s: s.write_ms)
            lines.append(
                "  waited for (median, at the task written last): "
                f"queueing {queueing:.1f} ms, alignment {alignment:.1f} ms, write {write:.1f} ms"
            )
            written = median(lambda s: s.state_bytes)
            full = median(lambda s: s.full_state_bytes)
            if full > written:  # incremental: each checkpoint wrote less than its state
                lines.append(
                    f"  state per checkpoint (median): {written / 1e6:.2f} MB written, "
                    f"{full / 1e6:.2f} MB in all (incremental)"
                )
        for r in self.restarts:
            restored = (
                f"checkpoint {r.restored_checkpoint}" if r.restored_checkpoint else "the start"
            )
            rec = (
                f", processing again after {r.recovery_seconds:.2f} s" if r.recovery_seconds else ""
            )
            lines.append(
                f"  restart after attempt {r.attempt} failed ({r.reason}): restored {restored}{rec}"
            )
        if not self.restarts:
            lines.append("  restarts: 0")
        for fault in self.unfired_faults:
            lines.append(f"  fault not fired: {fault}")
        if self.peak_rss:
            lines.append(f"  peak task RSS: {max(self.peak_rss.values()) / 2**20:.0f} MiB")
        return "\n".join(lines)

"""The checkpoint coordinator: triggers checkpoints at the sources, collects acks,
completes or aborts them, and writes the checkpoint metadata.

Driver side, job-manager thread only. Checkpoint ids strictly increase over the
whole run, across restarts, so files of a failed attempt never mix with a new one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from jobmanager.result import FailedCheckpoint
from jobmanager.termination import LoopTermination
from runtime import control as P
from runtime.config import JobConfig, SnapshotMode
from runtime.control import CheckpointFailureReason
from runtime.operators import acts_on_completion
from runtime.plan import JobPlan, step_state
from statebackend.metadata import CheckpointMetadata, StepState, TaskStateHandle
from statebackend.metrics import AckMetrics, CheckpointSummary, summarize
from statebackend.shared import SharedStateRegistry
from statebackend.storage import CheckpointStorage

log = logging.getLogger("absflow.coordinator")


@dataclass
class PendingCheckpoint:
    checkpoint_id: int
    trigger_time: float  # wall clock (tasks measure start delay against it)
    trigger_mono: float
    final: bool
    not_yet_acked: set[int]
    acks: dict[int, P.Ack] = field(default_factory=dict)
    drain: LoopTermination | None = None
    """Synchronous snapshots: the waves proving the halted job drained (then triggered)."""
    drained_mono: float | None = None
    savepoint: bool = False  # the final checkpoint of a stop: kept, never retired
    superstep: int | None = None  # an iteration's checkpoint at this superstep's boundary
    whole: bool = False  # triggered as a savepoint: the tasks write it self-contained


@dataclass
class CompletedCheckpoint:
    checkpoint_id: int
    final: bool
    duration_ms: float
    metrics: CheckpointSummary
    path: str | None
    trigger_time: float = 0.0  # wall clock
    task_metrics: Mapping[str, AckMetrics] = field(default_factory=dict)
    savepoint: bool = False
    superstep: int | None = None


_COUNTED = frozenset(
    {
        CheckpointFailureReason.EXPIRED,
        CheckpointFailureReason.DECLINED,
        CheckpointFailureReason.STATE_WRITE_FAILED,
        CheckpointFailureReason.METADATA_WRITE_FAILED,
    }
)
"""Reasons that count towards ``tolerable_checkpoint_failures`` (as in Flink)."""


class CheckpointCoordinator:
    """Triggers checkpoint n every ``checkpoint_interval`` by sending Trigger(n) to the
    source tasks only, completes n when every task acked, aborts it on timeout,
    decline or failure. ``send(task_index, message)`` reaches one task.

    Synchronous snapshots (Naiad's, the paper's baseline) first halt: Halt(n) to every
    source, then four-counter waves over every task until two agree that nothing is in
    flight anywhere (``on_status``), and only then Trigger(n): the barriers cross empty
    channels, every task snapshots, and the sources resume when n completes or aborts.
    The checkpoint's metrics say how long the job was halted (``halt_ms``: halt to
    completion) and how long the drain took (``drain_ms``)."""

    def __init__(
        self,
        plan: JobPlan,
        config: JobConfig,
        storage: CheckpointStorage | None,
        send: Callable[[int, P.Message], None],
        first_id: int,
        attempt: int,
        on_complete: Callable[[CompletedCheckpoint], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan, self.config, self.storage, self.send = plan, config, storage, send
        self.attempt = attempt
        self.fenced = 0  # messages of other attempts' tasks ignored (`stale`)
        # Chain files of incremental checkpoints, counted per completed checkpoint.
        self.shared = SharedStateRegistry(storage) if storage is not None else None
        self._shared_loaded = False
        self.clock = clock
        self.next_id = first_id
        self.pending: dict[int, PendingCheckpoint] = {}
        self.completed: list[CompletedCheckpoint] = []
        self.failed: list[FailedCheckpoint] = []
        self.consecutive_failures = 0
        self.on_complete = on_complete
        self.last_completion = clock()
        self.started = clock()
        self.final_triggered = False
        self.final_completed = False
        self.final_failed: FailedCheckpoint | None = None
        self.last_trigger: float | None = None
        self.all_tasks = {t.index for t in plan.tasks}
        self.sources = [t.index for t in plan.source_tasks]
        # Told of a completed checkpoint (besides final and synchronous ones: every task).
        self.notified = sorted(
            t.index for t in plan.tasks if any(map(acts_on_completion, plan.chain_steps(t)))
        )

    # -- triggering ----------------------------------------------------------------------
    def on_tick(self) -> None:
        self._advance_drains()
        now = self.clock()
        for cp in list(self.pending.values()):
            if now - cp.trigger_mono > self.config.checkpoint_timeout:
                self.abort(
                    cp.checkpoint_id,
                    CheckpointFailureReason.EXPIRED,
                    f"{self.config.checkpoint_timeout:.1f} s passed, "
                    f"{len(cp.not_yet_acked)} task(s) did not ack",
                )
        interval = self.config.checkpoint_interval
        if interval is None or self.final_triggered:
            return
        if len(self.pending) >= self.config.max_concurrent_checkpoints:
            return
        # The interval runs from trigger to trigger (as in Flink); the minimum pause from
        # the last completion.
        if now - (self.last_trigger if self.last_trigger is not None else self.started) < interval:
            return
        if now - self.last_completion < self.config.min_pause_between_checkpoints:
            return
        self.trigger(final=False)

    def trigger(
        self,
        final: bool,
        savepoint: bool = False,
        drain: bool = False,
        superstep: int | None = None,
    ) -> int:
        """Trigger checkpoint ``next_id`` at the sources; ``superstep``: an iteration's
        checkpoint at the boundary after that superstep (recorded in its metadata)."""
        n = self.next_id
        self.next_id += 1
        now = time.time()
        self.last_trigger = self.clock()
        cp = PendingCheckpoint(
            n,
            now,
            self.last_trigger,
            final,
            set(self.all_tasks),
            savepoint=savepoint,
            superstep=superstep,
            whole=savepoint,
        )
        self.pending[n] = cp
        if final:
            self.final_triggered = True
        elif self.config.snapshot_mode is SnapshotMode.SYNCHRONOUS:
            self._halt(cp)
            return n
        for index in self.sources:
            self.send(index, P.Trigger(n, now, final, drain, savepoint))
        return n

    def _halt(self, cp: PendingCheckpoint) -> None:
        """Synchronous snapshots: halt every task, then drain (see ``_drained``). Sources
        stop reading; every task stops firing processing-time timers (their output would
        change the state under the snapshot) until the checkpoint completes or aborts."""
        tasks = sorted(self.all_tasks)
        cp.drain = LoopTermination(tasks, self.send, clock=self.clock, tag=cp.checkpoint_id)
        for index in tasks:
            self.send(index, P.Halt(cp.checkpoint_id))
        cp.drain.start()
        if self.config.debug_skip_drain:  # tests only: trigger at once (waves only measure)
            self._trigger_drained(cp)

    def _trigger_drained(self, cp: PendingCheckpoint) -> None:
        cp.drained_mono = self.clock()
        log.debug(
            "checkpoint %d: drained %.1f ms after the halt",
            cp.checkpoint_id,
            (cp.drained_mono - cp.trigger_mono) * 1000,
        )
        for index in self.sources:
            self.send(index, P.Trigger(cp.checkpoint_id, time.time(), False))

    def stale(self, msg: P.Ack | P.Decline | P.LoopStatus) -> bool:
        """True (counted in ``fenced``, logged) when ``msg`` comes from a task of another
        attempt: it must not complete, abort or drain a checkpoint of this one."""
        if P.of_attempt(msg, self.attempt):
            return False
        self.fenced += 1
        log.warning(
            "attempt %d: ignored %s of checkpoint %s from task %s of attempt %d (a task of "
            "a failed attempt, still running); %d such message(s) so far",
            self.attempt,
            type(msg).__name__,
            getattr(msg, "checkpoint_id", getattr(msg, "tag", "?")),
            self.plan.tasks[msg.task_index].task_id,
            msg.attempt,
            self.fenced,
        )
        return True

    def on_status(self, status: P.LoopStatus) -> None:
        """An answer to a drain wave of a synchronous checkpoint."""
        if self.stale(status):
            return
        cp = self.pending.get(status.tag)
        if cp is not None and cp.drain is not None:
            cp.drain.on_status(status)

    def _advance_drains(self) -> None:
        for cp in list(self.pending.values()):
            drain = cp.drain
            drained = drain is not None and not drain.terminated and drain.on_tick()
            if drained and cp.drained_mono is None:
                self._trigger_drained(cp)

    def on_sources_ended(self) -> None:
        """All sources read their input: the final checkpoint commits all remaining output."""
        if not self.final_triggered:
            self._abort_undrained("the sources ended: the final checkpoint follows")
            self.trigger(final=True)

    def _abort_undrained(self, why: str) -> None:
        """Synchronous checkpoints still draining (their sources halted, not triggered)."""
        for cp in list(self.pending.values()):
            if cp.drain is not None and cp.drained_mono is None:
                self.abort(cp.checkpoint_id, CheckpointFailureReason.SUBSUMED, why)

    def stop_with_savepoint(self, drain: bool = False, superstep: int | None = None) -> int | None:
        """A graceful stop: the sources end at one consistent point (the final barrier,
        exactly as at the end of their input), the sinks commit on its completion, and the
        checkpoint is kept as a savepoint. Its id, or None when the final checkpoint was
        triggered already (the input ended first: that one becomes the savepoint).

        Event time does not end (windows stay open in the savepoint and fire after a
        resume), unless ``drain``: the sources send the end-of-time watermark before the
        final barrier, so every window and timer fires and commits with it (Flink's
        ``stop --drain``, for a job that will not resume)."""
        if self.final_triggered:  # a savepoint if it is self-contained (`_complete` checks)
            for cp in self.pending.values():
                cp.savepoint = cp.savepoint or cp.final
            return None
        self._abort_undrained("a stop with savepoint: the final checkpoint follows")
        return self.trigger(final=True, savepoint=True, drain=drain, superstep=superstep)

    # -- acks ------------------------------------------------------------------------------
    def on_ack(self, ack: P.Ack) -> CompletedCheckpoint | None:
        """An ack of another attempt's task is fenced off (`stale`)."""
        if self.stale(ack):
            return None
        cp = self.pending.get(ack.checkpoint_id)
        if cp is None:
            return None  # late ack of an aborted / subsumed checkpoint
        cp.acks[ack.task_index] = ack
        cp.not_yet_acked.discard(ack.task_index)
        if cp.not_yet_acked:
            return None
        return self._complete(cp)

    def on_decline(self, decline: P.Decline) -> None:
        if self.stale(decline):
            return
        if decline.checkpoint_id in self.pending:
            task = self.plan.tasks[decline.task_index].task_id
            # A decline always counts towards tolerable_checkpoint_failures, whatever its reason.
            self.abort(
                decline.checkpoint_id,
                decline.reason,
                f"declined by task {task}: {decline.detail}",
                counted=True,
            )

    def _complete(self, cp: PendingCheckpoint) -> CompletedCheckpoint | None:
        del self.pending[cp.checkpoint_id]
        done = self.clock()
        duration_ms = (done - cp.trigger_mono) * 1000
        tasks: dict[str, TaskStateHandle] = {}
        per_task: dict[str, AckMetrics] = {}
        for index, ack in sorted(cp.acks.items()):
            task_id = self.plan.tasks[index].task_id
            per_task[task_id] = ack.metrics
            if ack.state is not None:
                tasks[task_id] = ack.state
        if cp.savepoint and not cp.whole and any(t.chains or t.stores for t in tasks.values()):
            log.warning(
                "checkpoint %d: the input ended before the stop, and this final checkpoint "
                "was taken incrementally (it refers to files of earlier checkpoints): it is "
                "kept as a checkpoint, not as a savepoint; resume from it with restore_from",
                cp.checkpoint_id,
            )
            cp.savepoint = False
        metrics = summarize(per_task, mode_label(self.config), duration_ms)
        if cp.drain is not None:  # synchronous: the sources stayed halted until now
            drained = cp.drained_mono if cp.drained_mono is not None else done
            metrics = dataclasses.replace(
                metrics,
                halt_ms=round(duration_ms, 3),
                drain_ms=round((drained - cp.trigger_mono) * 1000, 3),
            )
            for index, status in cp.drain.last_answers.items():  # each task's, drained
                task_id = self.plan.tasks[index].task_id
                if task_id in per_task:
                    per_task[task_id] = dataclasses.replace(
                        per_task[task_id],
                        drained_sent=status.sent,
                        drained_received=status.received,
                    )
        path = None
        if self.storage is not None:
            metadata = CheckpointMetadata(
                checkpoint_id=cp.checkpoint_id,
                job=self.plan.name,
                attempt=self.attempt,
                final=cp.final,
                trigger_time=cp.trigger_time,
                completed_time=time.time(),
                duration_ms=round(duration_ms, 3),
                max_parallelism=self.plan.max_parallelism,
                tasks=tasks,
                task_metrics=per_task,
                metrics=metrics,
                steps=self._steps_with_state(tasks),
                savepoint=cp.savepoint,
                superstep=cp.superstep,
            )
            try:
                path = self.storage.write_metadata(metadata)
                if self.shared is not None:
                    self.shared.register(metadata)
            except (
                OSError
            ) as err:  # e.g. a full disk: a failed checkpoint, tolerable like any other
                self.abort(
                    cp.checkpoint_id,
                    CheckpointFailureReason.METADATA_WRITE_FAILED,
                    f"{type(err).__name__}: {err}",
                    pending=cp,
                )
                return None
        completed = CompletedCheckpoint(
            cp.checkpoint_id,
            cp.final,
            duration_ms,
            metrics,
            path,
            cp.trigger_time,
            per_task,
            savepoint=cp.savepoint,
            superstep=cp.superstep,
        )
        self.completed.append(completed)
        self.last_completion = done
        self.consecutive_failures = 0
        if cp.final:
            self.final_completed = True
        # Older pending checkpoints are subsumed by this one.
        for older in [n for n in self.pending if n < cp.checkpoint_id]:
            self.abort(
                older, CheckpointFailureReason.SUBSUMED, f"checkpoint {cp.checkpoint_id} completed"
            )
        # Every task of a final checkpoint (they end on it) or a synchronous one (they
        # resume on it); otherwise only those whose operators act on it (sinks commit).
        told = sorted(self.all_tasks) if cp.final or cp.drain is not None else self.notified
        for index in told:
            self.send(index, P.Complete(cp.checkpoint_id))
        if self.storage is not None:
            self._clean_up(self._retain, "old ones")
        if self.on_complete is not None:
            self.on_complete(completed)
        return completed

    def _retain(self, storage: CheckpointStorage) -> None:
        """Keep the newest checkpoints, then delete the chain files only deleted ones
        referred to (every completed checkpoint under the root is counted first)."""
        assert self.shared is not None
        if not self._shared_loaded:  # once: those of earlier attempts and runs
            self.shared.load()
            self._shared_loaded = True
        self.shared.release(storage.retain(self.config.retained_checkpoints))

    def _steps_with_state(self, tasks: dict[str, TaskStateHandle]) -> tuple[StepState, ...]:
        """The plan's steps whose state the state files hold, by name."""
        held = {name for handle in tasks.values() for name in handle.operators}
        return tuple(
            sorted((step_state(s) for s in self.plan.steps if s.name in held), key=lambda s: s.name)
        )

    # -- aborting -------------------------------------------------------------------------
    def abort(
        self,
        checkpoint_id: int,
        reason: CheckpointFailureReason,
        detail: str = "",
        pending: PendingCheckpoint | None = None,
        counted: bool = False,
    ) -> None:
        cp = self.pending.pop(checkpoint_id, None) or pending
        if cp is None:
            return
        self.failed.append(FailedCheckpoint(checkpoint_id, reason, detail, self.attempt))
        log.info(
            "checkpoint %d aborted (%s): %s %s", checkpoint_id, reason.name, reason.value, detail
        )
        if counted or reason in _COUNTED:
            self.consecutive_failures += 1
        if reason is not CheckpointFailureReason.TASK_FAILURE:
            for index in sorted(self.all_tasks):
                self.send(index, P.Abort(checkpoint_id, reason))
        if self.storage is not None:
            self._clean_up(lambda st: st.discard(checkpoint_id), f"checkpoint {checkpoint_id}")
        if cp.final and reason is not CheckpointFailureReason.TASK_FAILURE:
            # The sources have sent end-of-input after the final barrier: it cannot be
            # repeated in this attempt. The job manager restarts from the last checkpoint.
            self.final_failed = self.failed[-1]

    def _clean_up(self, delete: Callable[[CheckpointStorage], object], what: str) -> None:
        """Delete checkpoints; a failure (e.g. S3 briefly unreachable) is logged, not fatal:
        a leftover is an incomplete or older checkpoint, which nothing restores."""
        if self.storage is None:
            return
        try:
            delete(self.storage)
        except OSError as err:
            log.warning("could not delete %s in %s: %s", what, self.storage.root, err)

    def abort_all(self, reason: CheckpointFailureReason, detail: str = "") -> None:
        for n in sorted(self.pending):
            self.abort(n, reason, detail)

    @property
    def too_many_failures(self) -> bool:
        return self.consecutive_failures > self.config.tolerable_checkpoint_failures


def mode_label(config: JobConfig) -> str:
    """How checkpoints are taken, as the CLI shows it."""
    if config.aligned_timeout is not None and config.snapshot_mode is SnapshotMode.EXACTLY_ONCE:
        return f"aligned_timeout={config.aligned_timeout:g}s"
    return config.snapshot_mode.value if isinstance(config.snapshot_mode, SnapshotMode) else "?"

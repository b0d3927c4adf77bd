"""One barrier-stage attempt of a job: its task table, registration, the dispatch of
control messages, and the loop that drives the attempt until every task finished or
it failed (then its survivors are ended before it returns).

Driver side, job-manager thread only. Everything outside the attempt comes in through
``RunServices`` (the ROUTER link, liveness, the fault schedule, metrics, outputs), so an
attempt runs against fakes in a unit test.
"""

from __future__ import annotations

import logging
import math
import signal

from jobmanager.coordinator import CheckpointCoordinator, CompletedCheckpoint
from jobmanager.failures import (
    Failure,
    FailureCause,
    classify_stage_error,
    first_lines,
    reported_failure,
    stage_reason,
)
from jobmanager.faults import DriverKill
from jobmanager.liveness import ctrl_c_deferred
from jobmanager.optimistic import (
    Compensator,
    RescueFailure,
    RescueOutcome,
    lost_heads,
    rescue_survivors,
)
from jobmanager.services import RunServices, Stage, TaskInfo
from jobmanager.stop import begin_stop
from jobmanager.supersteps import SuperstepDriver, superstep_step
from jobmanager.termination import LoopTermination
from runtime import control as P
from runtime.config import JobConfig, SuperstepCheckpointStyle
from runtime.control import CheckpointFailureReason
from runtime.plan import JobPlan
from statebackend.storage import CheckpointStorage

log = logging.getLogger("absflow.jobmanager")

REGISTRATION_TIMEOUT = 120.0
STAGE_END_GRACE = 5.0  # the stage ended: the last Finished messages may still be on the way
# A task that raised reports its error (Failed) and then its process exits: on a loaded
# machine the exit or the stage failure can be seen before that report is read.
REPORT_GRACE = 1.0
CHECKS_EVERY = 0.005
"""Seconds between two rounds of the attempt's checks beyond the checkpoints' own (a task
gone or silent, the stage, the timeout, a stop request, injected faults, progress)."""


class Attempt:
    """Attempt ``number`` of the job: tasks register, heartbeat, ack checkpoints, finish.

    ``run(stage)`` returns None when every task finished, or the Failure that ended the
    attempt; either way the attempt is over when it returns (on failure its tasks were
    cancelled, survivors killed, the stage ended and the ports freed). Ctrl-C ends the
    attempt the same way, then re-raises KeyboardInterrupt.
    """

    def __init__(
        self,
        number: int,
        plan: JobPlan,
        config: JobConfig,
        storage: CheckpointStorage | None,
        first_checkpoint_id: int,
        run: RunServices,
        job_started: float,
        submit_wall: float,
        restored_superstep: int = 0,
        compensator: Compensator | None = None,
    ) -> None:
        """``restored_superstep``: an iteration restored from the checkpoint at that
        superstep's boundary goes on with the next one; ``compensator``: it restored a
        rescue snapshot, whose lost keys it compensates (``jobmanager.optimistic``)."""
        self.storage = storage
        self.restored_superstep = restored_superstep
        self.rescue: RescueOutcome | None = None
        """Optimistic recovery: the rescue snapshot of this failed attempt's survivors."""
        self.number, self.plan, self.config, self.run_services = number, plan, config, run
        self.clock = run.clock
        self.job_started = job_started
        self.submit_wall = submit_wall
        self.submitted = run.clock()
        self.tasks = {t.index: TaskInfo(t.task_id, t.subtask) for t in plan.tasks}
        self.registered: set[int] = set()
        self.all_registered_at: float | None = None
        self.sources = {t.index for t in plan.source_tasks}
        self.aligned = plan.aligned_sources  # watermark alignment (max_drift)
        self.sources_ended: set[int] = set()
        self.first_record_seen = False
        self.failure: Failure | None = None  # set by run()
        self.killed_at: float | None = None  # wall clock of an injected kill
        self.stage_done_at: float | None = None
        self.stopping_with: int | None = None  # the savepoint's checkpoint id while stopping
        self.stale_messages = 0  # of other attempts' tasks, dropped (`on_message`)
        self.coordinator = CheckpointCoordinator(
            plan,
            config,
            storage,
            self.send,
            first_checkpoint_id,
            number,
            self._on_checkpoint_completed,
            clock=run.clock,
        )
        # Jobs with loops end by termination detection, not when the sources end.
        self.termination = (
            LoopTermination(sorted(self.tasks), self.send, clock=run.clock)
            if plan.has_loops
            else None
        )
        # An iteration: supersteps start once the loop termination proved its input loaded.
        step = superstep_step(plan)
        progress = run.metrics.iteration
        self.supersteps = (
            SuperstepDriver(
                plan,
                step,
                self.send,
                self.coordinator,
                progress,
                config.superstep_checkpoint_interval,
                0 if config.debug_restart_supersteps else restored_superstep,
                clock=run.clock,
                starting=self._superstep_starting,
                compensator=compensator,
                style=SuperstepCheckpointStyle(config.superstep_checkpoint_style),
            )
            if step is not None and progress is not None
            else None
        )

    @property
    def all_finished(self) -> bool:
        return all(t.finished for t in self.tasks.values())

    def send(self, task_index: int, msg: P.Message) -> None:
        self.run_services.link.send(task_index, self.number, msg)

    # -- the loop --------------------------------------------------------------------------
    def run(self, stage: Stage) -> Failure | None:
        """Drive the attempt to its end (see the class docstring); also sets ``failure``.
        Called once; ``stage`` is this attempt's, already started."""
        failure: Failure | None = None
        try:
            failure = self._drive(stage)
            return failure
        except KeyboardInterrupt:
            failure = Failure(FailureCause.CANCELLED, permanent="cancelled by the user (Ctrl-C)")
            raise
        finally:
            self.failure = failure
            finished = failure is None and self.all_finished
            if not finished and self.supersteps is not None:
                self.supersteps.on_failed()
            if not finished:
                with ctrl_c_deferred():
                    self.coordinator.abort_all(CheckpointFailureReason.TASK_FAILURE)
                    self.rescue = self._rescue(failure)
                    self.end(stage, failure)
            self.run_services.metrics.end_attempt(self.tasks, finished, self.coordinator.failed)

    def _drive(self, stage: Stage) -> Failure | None:
        checks_due = 0.0
        while True:
            for msg in self.run_services.link.receive(20):
                failure = self.on_message(msg)
                if failure is not None:
                    return failure
            now = self.clock()
            self._observe(now)
            # The loop turns once per message at short checkpoint intervals (a dozen acks
            # each): the checks beyond the checkpoints' own run at most every CHECKS_EVERY.
            checks = now >= checks_due
            if checks:
                checks_due = now + CHECKS_EVERY
                self._check_stop()
            if self.all_finished:
                stage.join(10.0)
                return None
            failure = None
            if checks:
                failure = self._check(now, stage)
            elif self.all_registered_at is not None:
                failure = self._check_checkpoints()  # triggers the next one on time
            if failure is not None:
                return self._own_report_or(failure)
            if checks:
                faults = self.run_services.faults
                self._fire(faults.due(now, self._can_kill, self._periodic_pending))
                self._show_progress()

    def _read_waiting(self) -> Failure | None:
        """Handle the control messages already waiting (without waiting for more)."""
        for msg in self.run_services.link.receive(0):
            failure = self.on_message(msg)
            if failure is not None:
                return failure
        return None

    def _observe(self, now: float) -> None:
        """Registration complete, first record: tell the coordinator, faults and metrics."""
        if self.all_registered_at is None and len(self.registered) == len(self.tasks):
            self.all_registered_at = now
            log.info(
                "attempt %d: all %d tasks registered %.3f s after submit",
                self.number,
                len(self.tasks),
                now - self.submitted,
            )
            self.coordinator.started = now
            self.coordinator.last_completion = now
            self.run_services.faults.on_all_registered(now)
        if not self.first_record_seen:
            firsts = [t.first_record_at for t in self.tasks.values() if t.first_record_at]
            if firsts:
                self.first_record_seen = True
                self.run_services.metrics.on_first_record(
                    self.number, min(firsts), self.submit_wall
                )
                self.run_services.faults.on_first_record(now)

    def _check_stop(self) -> None:
        """A stop with savepoint was requested: act once every task registered."""
        if self.stopping_with is None and self.all_registered_at is not None:
            stop = self.run_services.stop
            if not stop.requested:
                return
            if self.supersteps is None:
                self.stopping_with = begin_stop(self.coordinator, stop, self.number)
            else:  # an iteration stops at a superstep boundary, recorded in the savepoint
                self.supersteps.request_stop(self._stop_at_superstep)

    def _stop_at_superstep(self, superstep: int) -> None:
        stop = self.run_services.stop
        self.stopping_with = begin_stop(self.coordinator, stop, self.number, superstep)

    def _check(self, now: float, stage: Stage) -> Failure | None:
        """Everything that can end the attempt besides a task's own report."""
        liveness = self.run_services.liveness
        dead = liveness.dead_task(self.tasks.values())
        if dead is not None:
            # A task that closed and exited (the local launcher's processes exit; Spark's
            # are pooled) may have its Closed waiting behind the disconnect: read it first.
            failure = self._read_waiting()
            if failure is not None:
                return failure
            dead = liveness.gone_task(self.tasks.values())
        if dead is not None:
            return self._task_failure(
                FailureCause.TASK_DIED,
                dead.task_id,
                f"task {dead.task_id} (pid {dead.pid}) is gone",
            )
        if self.all_registered_at is not None:
            failure = self._check_checkpoints() or self._check_heartbeats(now)
        else:
            failure = self._check_registration(now)
        return failure or self._check_stage(now, stage) or self._check_timeout(now)

    def _own_report_or(self, failure: Failure) -> Failure:
        """``failure`` was seen from outside (a process gone, the stage failed): when a
        task raised, its own report (operator, exception, whether a restart can help) may
        still be on the way; wait up to REPORT_GRACE for it. Not after an injected kill
        (a SIGKILLed task reports nothing, and recovery time counts)."""
        outside = (FailureCause.TASK_DIED, FailureCause.TASK_ERROR, FailureCause.STAGE_FAILED)
        if failure.cause not in outside or self.killed_at is not None:
            return failure
        deadline = self.clock() + REPORT_GRACE
        while self.clock() < deadline:
            for msg in self.run_services.link.receive(20):
                if not P.of_attempt(msg, self.number):
                    continue
                if isinstance(msg, P.Failed):
                    return reported_failure(msg)
                if isinstance(msg, P.Closed):
                    self.tasks[msg.task_index].closed = True
        return failure

    def _check_checkpoints(self) -> Failure | None:
        coordinator = self.coordinator
        supersteps = self.supersteps
        if self.termination is not None and self.termination.on_tick():
            if supersteps is None:
                coordinator.on_sources_ended()  # no record left in any loop: the final checkpoint
            else:
                supersteps.on_loaded()  # an iteration's input is in: its supersteps start
        if supersteps is not None:
            supersteps.on_tick()
            if supersteps.ended:  # its result is on the way to the sinks: commit it
                coordinator.on_sources_ended()
        coordinator.on_tick()
        if coordinator.final_failed is not None:
            f = coordinator.final_failed
            return Failure(
                FailureCause.FINAL_CHECKPOINT_FAILED,
                error=f"checkpoint {f.checkpoint_id}: {f.reason.name}: {f.detail}",
            )
        if coordinator.too_many_failures:
            return Failure(
                FailureCause.TOO_MANY_CHECKPOINT_FAILURES,
                error=f"{coordinator.consecutive_failures} in a row "
                f"(tolerable_checkpoint_failures={self.config.tolerable_checkpoint_failures})",
            )
        return None

    def _check_heartbeats(self, now: float) -> Failure | None:
        silent = self.run_services.liveness.silent_task(self.tasks.values(), now)
        if silent is None:
            return None
        return self._task_failure(
            FailureCause.HEARTBEAT_LOST,
            silent.task_id,
            f"no heartbeat from task {silent.task_id} for {self.config.heartbeat_timeout:.1f} s",
        )

    def _check_registration(self, now: float) -> Failure | None:
        if now - self.submitted <= REGISTRATION_TIMEOUT:
            return None
        missing = [t.task_id for i, t in self.tasks.items() if i not in self.registered]
        # Start-up is part of the fault domain: the restart strategy decides, as for any
        # other failure (a worker lost or hung while starting may well start next time).
        return Failure(
            FailureCause.REGISTRATION_TIMEOUT,
            error=f"tasks {missing} did not register within {REGISTRATION_TIMEOUT:.0f} s "
            "(check the executors' logs)",
        )

    def _check_stage(self, now: float, stage: Stage) -> Failure | None:
        if self.stage_done_at is None and not stage.outcome.empty():
            err = stage.outcome.get()
            self.stage_done_at = now
            if err is not None:
                text = str(err)
                error = first_lines(text)
                if self.all_registered_at is None:  # say it: the tasks were still starting
                    error = (
                        f"while the tasks were starting ({len(self.registered)} of "
                        f"{len(self.tasks)} registered): {stage_reason(text)}\n{error}"
                    )
                return Failure(classify_stage_error(text), error=error)
        if self.stage_done_at is not None and now - self.stage_done_at > STAGE_END_GRACE:
            unfinished = [t.task_id for t in self.tasks.values() if not t.finished]
            return Failure(FailureCause.STAGE_ENDED_EARLY, error=f"unfinished: {unfinished}")
        return None

    def _check_timeout(self, now: float) -> Failure | None:
        timeout = self.config.timeout
        if timeout is None or now - self.job_started <= timeout:
            return None
        return Failure(
            FailureCause.JOB_TIMEOUT,
            error=f"{now - self.job_started:.1f} s > timeout={timeout} s",
            permanent=f"the job ran longer than timeout={timeout} s",
        )

    def _task_failure(self, cause: FailureCause, task_id: str, error: str) -> Failure:
        t = next(t for t in self.tasks.values() if t.task_id == task_id)
        return Failure(cause, operator=t.operator, subtask=t.subtask, error=error)

    def _show_progress(self) -> None:
        m = self.run_services.metrics
        live = m.live(self.tasks)
        self.run_services.progress.update(
            live.records_in,
            live.records_out,
            m.checkpoints_completed,
            len(m.restarts),
            m.completed[-1].duration_ms if m.completed else None,
            self.supersteps.current if self.supersteps is not None else None,
        )
        self.run_services.dashboard.publish(self)

    # -- dispatch --------------------------------------------------------------------------
    def on_message(self, msg: P.Message) -> Failure | None:
        """Handle one control message (a Failure ends the attempt); drop other attempts'."""
        if P.of_attempt(msg, self.number):
            return self._dispatch(msg)
        self.stale_messages += 1
        return None

    def _dispatch(self, msg: P.Message) -> Failure | None:
        now = self.clock()
        match msg:
            case P.Register():
                t = self.tasks[msg.task_index]
                t.pid, t.host, t.endpoint, t.last_seen = msg.pid, msg.host, msg.endpoint, now
                self.registered.add(msg.task_index)
            case P.Heartbeat():
                self._on_heartbeat(msg, now)
            case P.Ack():
                t = self.tasks[msg.task_index]
                t.last_seen = now
                figures = msg.metrics
                t.records_in = max(t.records_in, figures.records_in)
                t.records_out = max(t.records_out, figures.records_out)
                self.run_services.metrics.on_snapshot(msg.task_index, msg.checkpoint_id, figures)
                self.coordinator.on_ack(msg)
            case P.Decline():
                self.coordinator.on_decline(msg)
            case P.SinkOutput():
                self.run_services.outputs.add(msg.step, msg.subtask, msg.checkpoint_id, msg.records)
            case P.SourceEnded():
                self._on_source_ended(msg)
            case P.Finished():
                t = self.tasks[msg.task_index]
                t.finished = True
                t.metrics = msg.metrics
                t.records_in, t.records_out = t.metrics.records_in, t.metrics.records_out
            case P.Closed():
                self.tasks[msg.task_index].closed = True
            case P.LoopStatus():
                if msg.tag:  # a drain wave of a synchronous checkpoint
                    self.coordinator.on_status(msg)
                elif self.termination is not None:
                    self.termination.on_status(msg)
            case P.SuperstepDone() | P.SolutionEmitted():
                return self._on_superstep_message(msg)
            case P.CompensationInput() | P.Compensated():
                return self._on_compensation_message(msg)
            case P.Failed():
                return reported_failure(msg)
            case _:
                log.debug("attempt %d: unexpected control message %r", self.number, msg)
        return None

    def _superstep_starting(self, superstep: int) -> None:
        self._fire(self.run_services.faults.on_superstep(superstep, self._can_kill))

    def _on_source_ended(self, msg: P.SourceEnded) -> None:
        self.sources_ended.add(msg.task_index)
        if self.sources_ended >= self.sources:
            if self.termination is not None:
                self.termination.start()
            else:
                self.coordinator.on_sources_ended()
            faults = self.run_services.faults
            self._fire(faults.on_sources_ended(self._periodic_pending, self._can_kill))

    def _on_superstep_message(self, msg: P.SuperstepDone | P.SolutionEmitted) -> Failure | None:
        """An iteration's loop head reports (``jobmanager.supersteps``)."""
        if self.supersteps is None:
            log.debug("attempt %d: %r, but the job is no iteration", self.number, msg)
        elif isinstance(msg, P.SolutionEmitted):
            self.supersteps.on_emitted(msg)
        else:
            error = self.supersteps.on_done(msg)
            if error is not None:
                return Failure(
                    FailureCause.TASK_ERROR,
                    error=error,
                    permanent="a superstep that does not balance is a bug, not a fault",
                )
        return None

    # -- optimistic recovery (jobmanager.optimistic) ----------------------------------------
    def _on_compensation_message(self, msg: P.CompensationInput | P.Compensated) -> Failure | None:
        if self.supersteps is None:
            return None
        if isinstance(msg, P.Compensated):
            self.supersteps.on_compensated(msg)
            return None
        error = self.supersteps.on_compensation_input(msg)
        if error is None:
            return None
        return Failure(
            FailureCause.USER_FUNCTION_RAISED,
            operator=self.supersteps.step.name,
            error=error,
            permanent="the compensation function returned what it must not",
        )

    def _rescue(self, failure: Failure | None) -> RescueOutcome | None:
        """Optimistic recovery: before the survivors are ended, write their loop heads'
        state as a rescue snapshot (bounded by ``rescue_timeout``); None when the job is
        no iteration with optimistic recovery."""
        settings, driver = self.config.optimistic_recovery, self.supersteps
        if settings is None or driver is None or self.storage is None:
            return None
        if failure is None or failure.permanent is not None:
            return RescueOutcome(failure=RescueFailure.PERMANENT)
        if not driver.superstep_started:
            return RescueOutcome(failure=RescueFailure.NO_SUPERSTEP)
        heads = {i: self.tasks[i] for i in driver.heads}
        liveness = self.run_services.liveness

        def gone(index: int) -> bool:
            return liveness.gone_task([self.tasks[index]]) is not None

        names = {
            heads[driver.heads[0]].operator,
            *(s.name for s in self.plan.chain_steps(self.plan.tasks[driver.heads[0]])),
        }
        lost = lost_heads(heads, names, (failure.operator, failure.subtask), gone)
        n = self.coordinator.next_id
        self.coordinator.next_id += 1
        return rescue_survivors(
            settings=settings,
            plan=self.plan,
            step_name=driver.step.name,
            heads=heads,
            lost=lost,
            attempt=self.number,
            restored=driver.restored,
            failed_during=driver.current,
            checkpoint_id=n,
            storage=self.storage,
            send=self.send,
            receive=self.run_services.link.receive,
            gone=gone,
            clock=self.clock,
        )

    def _on_heartbeat(self, msg: P.Heartbeat, now: float) -> None:
        t, m = self.tasks[msg.task_index], msg.metrics
        t.last_seen = now
        t.records_in = max(t.records_in, m.records_in)
        t.records_out = max(t.records_out, m.records_out)
        t.rss = m.rss_bytes
        t.peak_rss = max(t.peak_rss, m.rss_bytes)
        if m.first_record_at and not t.first_record_at:
            t.first_record_at = m.first_record_at
        t.metrics = m
        aligned = self.aligned_watermark() if msg.task_index in self.aligned else None
        self.send(msg.task_index, P.Alive(aligned))

    def aligned_watermark(self) -> float | None:
        """The lowest watermark of the aligned sources that hold event time back: all but
        the idle and the ended ones. One that has reported no watermark yet counts as
        -inf (the others wait for it, as a window would); None once none holds it back."""
        reports = [self.tasks[i].metrics for i in self.aligned if i not in self.sources_ended]
        marks = [
            -math.inf if m.watermark is None else m.watermark
            for m in reports
            if not m.watermark_idle
        ]
        return min(marks, default=None)

    # -- checkpoints and kills -------------------------------------------------------------
    def _on_checkpoint_completed(self, cp: CompletedCheckpoint) -> None:
        metrics = self.run_services.metrics
        metrics.on_checkpoint_completed(cp)
        due = self.run_services.faults.on_checkpoint_completed(
            self.clock(), metrics.checkpoints_completed, cp.final, self._can_kill
        )
        self._fire(due)

    @property
    def _periodic_pending(self) -> bool:
        return any(not p.final for p in self.coordinator.pending.values())

    def _can_kill(self, task_index: int) -> bool:
        t = self.tasks[task_index]
        return bool(t.pid) and not t.finished and not t.closed

    def _fire(self, kills: list[DriverKill]) -> None:
        """Fault injection: a real SIGKILL (or SIGSTOP) of task processes. A task on the
        driver's host gets the signal from here (at any point of its work, frozen or
        not); a task on another host is asked by a KillSelf message to signal itself."""
        for k in kills:
            t = self.tasks[k.task_index]
            local = self.run_services.liveness.is_local(t)
            log.warning(
                "fault injection: %s task %s (pid %d on %s, %s): %s",
                signal.Signals(k.signal).name,
                t.task_id,
                t.pid,
                t.host,
                "signalled" if local else "asked to signal itself",
                k.label,
            )
            if self.killed_at is None:
                self.killed_at = self.run_services.wall()
            if local:
                self.run_services.signal_process(t.pid, k.signal)
            else:
                self.send(k.task_index, P.KillSelf(k.signal, k.label))

    # -- the end ---------------------------------------------------------------------------
    def end(self, stage: Stage, failure: Failure | None) -> None:
        """Stop every task of this (failed or cancelled) attempt; see Liveness.end_attempt."""
        reason = failure.describe() if failure is not None else "the attempt failed"

        def cancel() -> None:
            for index in self.tasks:
                self.send(index, P.Cancel(reason))

        def drain() -> None:
            for msg in self.run_services.link.receive(10):
                if isinstance(msg, P.Closed) and msg.attempt == self.number:
                    self.tasks[msg.task_index].closed = True

        self.run_services.liveness.end_attempt(
            list(self.tasks.values()),
            cancel,
            drain,
            stage,
        )

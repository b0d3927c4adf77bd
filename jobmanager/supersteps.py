"""The job manager's side of an iteration (``runtime.superstep``): the superstep
agreement of all loop heads, checkpoints at superstep boundaries, and the end.

One attempt of an iteration, as phases of one explicit state::

    LOADING     the input enters the loop heads; over when the loop termination's waves
                (Mattern's counters, ``jobmanager.termination``) prove nothing is left in
                flight after every source ended: the heads hold all their input
    SUPERSTEP k SuperstepGo(k) went to every head; the job manager waits for every
                head's SuperstepDone(k) (never for a time-out), checks the superstep's
                message totals balance, then decides:
                  converged / workset empty / max_supersteps -> EMITTING
                  a checkpoint due at this boundary           -> CHECKPOINT
                  else                                        -> SUPERSTEP k + 1
    COMPENSATING (an attempt restored from a rescue snapshot, ``jobmanager.optimistic``)
                after LOADING: every head reports its restored keys and the lost keys'
                side input, the compensation function rebuilds the lost keys, every head
                takes its share; then a checkpoint of the compensated state at the
                restored superstep (CHECKPOINT), so a later failure restores it
    CHECKPOINT  the boundary after k waits for a superstep checkpoint (the channels are
                empty, so the heads' keyed state is the whole snapshot; its metadata
                records the superstep whose state it holds); once it completed or
                failed -> SUPERSTEP k + 1
    EMITTING    EmitSolution(k) went to every head; once each answered SolutionEmitted
                (its result records are on the result edge) -> ENDED
    ENDED       the attempt's final checkpoint commits the result and the job ends
    STOPPED     a stop with savepoint was requested: the savepoint is taken while loading
                or at the next boundary (never inside a superstep, whose inbox is no
                state) and records the superstep; no superstep starts after it

The checkpoint styles (``superstep_checkpoint_style``, seed 004 formulas 10-12; the
heads' side is in ``runtime.superstep``), for a checkpoint n due after superstep k:

    blocking  all Done(k) -> trigger n -> CHECKPOINT until n completed -> Go(k + 1)
    tail      Go(k, snapshot_after=n); the first Done(k) -> trigger n (each head snapshots
              as its own update of k ends); all Done(k) -> CHECKPOINT until n completed
    head      all Done(k) -> trigger n and Go(k + 1, snapshot_before=n) at once: the write
              overlaps superstep k + 1; the next boundary that is due (or would start a
              second one) waits in CHECKPOINT for n first

At most one superstep checkpoint is outstanding: a head checkpoint's capture serialized
the state (the update of k + 1 may change the live state meanwhile), but a second one
would only be subsumed, and the wait is the cost formula 12 counts.

A restored attempt starts at the superstep after the one its checkpoint was taken at.
Driver side, job-manager thread only.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from jobmanager.optimistic import Compensator
from jobmanager.result import IterationProgress, RecoveryKind, SuperstepRecovery
from jobmanager.termination import Wave
from runtime import control as P
from runtime.config import SuperstepCheckpointStyle
from runtime.errors import IterationError
from runtime.graph import Step, StepKind
from runtime.plan import JobPlan

log = logging.getLogger("absflow.jobmanager")

__all__ = ["IterationPhase", "SuperstepDriver", "superstep_step"]


class _Completed(Protocol):
    @property
    def checkpoint_id(self) -> int: ...


class Checkpoints(Protocol):
    """What the driver needs of the ``CheckpointCoordinator``."""

    @property
    def next_id(self) -> int: ...
    @property
    def pending(self) -> Mapping[int, Any]: ...
    @property
    def completed(self) -> Sequence[_Completed]: ...
    def trigger(self, final: bool, *, superstep: int | None = None) -> int: ...


class IterationPhase(enum.Enum):
    LOADING = "loading"
    COMPENSATING = "compensating"
    SUPERSTEP = "superstep"
    CHECKPOINT = "checkpoint"
    EMITTING = "emitting"
    ENDED = "ended"
    STOPPED = "stopped"


def superstep_step(plan: JobPlan) -> Step | None:
    """The plan's superstep step (an iteration's loop head logic), if it has one."""
    return next((s for s in plan.steps if s.kind is StepKind.SUPERSTEP), None)


class SuperstepDriver:
    """Drives one attempt of an iteration through the phases above. ``send(task, msg)``
    reaches one task; ``progress`` is the run's record (kept across attempts)."""

    def __init__(
        self,
        plan: JobPlan,
        step: Step,
        send: Callable[[int, P.Message], None],
        coordinator: Checkpoints,
        progress: IterationProgress,
        checkpoint_every: int | None,
        restored: int = 0,
        clock: Callable[[], float] = time.perf_counter,
        starting: Callable[[int], None] = lambda _k: None,
        compensator: Compensator | None = None,
        style: SuperstepCheckpointStyle = SuperstepCheckpointStyle.BLOCKING,
    ) -> None:
        """``starting(k)``: called as superstep k starts, before any head hears of it
        (fault injection: ``Kill(after_superstep=k)``); ``compensator``: this attempt
        restored a rescue snapshot, the lost keys are compensated after LOADING."""
        self.starting = starting
        self.compensator = compensator
        self._inputs: dict[int, P.CompensationInput] = {}
        self._compensated: set[int] = set()
        self._stop: Callable[[int], None] | None = None
        chain = next(c.id for c in plan.chains if step.id in c.step_ids)
        self.heads = sorted(t.index for t in plan.tasks if t.chain == chain)
        self.step, self.send, self.coordinator = step, send, coordinator
        self.progress, self.checkpoint_every, self.clock = progress, checkpoint_every, clock
        args: dict[str, Any] = step.args
        self.delta: bool = bool(args["delta"])
        self.max_supersteps: int | None = args.get("max_supersteps")
        self.converged: Callable[[float], bool] | None = args.get("converged")
        self.phase = IterationPhase.LOADING
        self.current = restored  # the newest superstep started (or restored)
        self.restored = restored
        self.done: dict[int, P.SuperstepDone] = {}
        self.emitted: set[int] = set()
        self.style = style
        self.outstanding: tuple[int, int] | None = None
        """The superstep checkpoint not completed yet: (superstep, checkpoint id)."""
        self.tail_due: int | None = None  # tail: the checkpoint announced for this superstep
        self.started_at = 0.0
        self.first_started_at: float | None = None  # this attempt's first superstep
        if progress.failed_during is not None:  # this attempt recovers a failed one
            self._record_recovery(progress, restored)

    @property
    def where(self) -> str:
        return f"iteration step '{self.step.name}'"

    @property
    def ended(self) -> bool:
        return self.phase is IterationPhase.ENDED

    # -- events ----------------------------------------------------------------------------
    def on_loaded(self) -> None:
        """The loop is proven empty after every source ended: the heads hold their input."""
        if self.phase is not IterationPhase.LOADING:
            return
        if self.compensator is not None:
            self._collect_compensation_input()
            return
        log.info("%s: input loaded, superstep %d starts", self.where, self.current + 1)
        self._go(self.current + 1)

    def on_done(self, msg: P.SuperstepDone) -> str | None:
        """A head finished a superstep; returns why the run must fail, if it must."""
        if self.phase is not IterationPhase.SUPERSTEP or msg.superstep != self.current:
            return None
        if self.tail_due is not None:  # every head read the Go that announced it
            n, self.tail_due = self.tail_due, None
            if self._trigger(self.current) != n:
                raise AssertionError(f"{self.where}: checkpoint {n} announced, another triggered")
        self.done[msg.task_index] = msg
        if len(self.done) < len(self.heads):
            return None
        return self._decide()

    def on_emitted(self, msg: P.SolutionEmitted) -> None:
        if self.phase is IterationPhase.EMITTING:
            self.emitted.add(msg.task_index)
            if len(self.emitted) == len(self.heads):
                self.phase = IterationPhase.ENDED

    def on_tick(self) -> None:
        """Checks the outstanding superstep checkpoint: completed or failed, a boundary
        waiting for it (CHECKPOINT) goes on."""
        if self.outstanding is None:
            return
        k, n = self.outstanding
        if n in self.coordinator.pending:
            return
        if any(c.checkpoint_id == n for c in self.coordinator.completed):
            self.progress.checkpoints.append((k, n))
        elif self.phase in (IterationPhase.EMITTING, IterationPhase.ENDED):
            log.info(
                "%s: the checkpoint at superstep %d is subsumed by the final one", self.where, k
            )
        else:
            log.warning(
                "%s: the checkpoint at superstep %d failed; the iteration goes on", self.where, k
            )
        self.outstanding = None
        if self.phase is IterationPhase.CHECKPOINT:
            self._after_boundary()

    def request_stop(self, savepoint: Callable[[int], None]) -> None:
        """A stop with savepoint: ``savepoint(k)`` takes it (the final checkpoint, recording
        superstep k) now while the input loads, or at the next superstep boundary; never
        once the result is on its way (the job ends anyway)."""
        if self._stop is not None or self.phase in (IterationPhase.EMITTING, IterationPhase.ENDED):
            return
        self._stop = savepoint
        if self.phase is IterationPhase.LOADING:
            self._stop_here()

    def _stop_here(self) -> None:
        assert self._stop is not None
        self.phase = IterationPhase.STOPPED
        log.info("%s: stopping with a savepoint after superstep %d", self.where, self.current)
        self._stop(self.current)

    def on_failed(self) -> None:
        """The attempt failed: the next one records how it recovered (also when this one
        failed before its first superstep: every restart is a recovery)."""
        self.progress.failed_during = self.current
        self.progress.failed_loading = self.phase in (
            IterationPhase.LOADING,
            IterationPhase.COMPENSATING,
        )

    @property
    def superstep_started(self) -> bool:
        """Whether this attempt started a superstep (its heads hold a newer state than
        the one it restored)."""
        return self.current > self.restored

    # -- decisions -------------------------------------------------------------------------
    def _due(self, k: int) -> bool:
        every = self.checkpoint_every
        return every is not None and k % every == 0 and self._stop is None

    def _trigger(self, k: int) -> int:
        n = self.coordinator.trigger(final=False, superstep=k)
        self.outstanding = (k, n)
        return n

    def _go(self, k: int, snapshot_before: int | None = None) -> None:
        self.phase = IterationPhase.SUPERSTEP
        self.current, self.done = k, {}
        self.started_at = self.clock()
        if self.first_started_at is None:
            self.first_started_at = self.started_at
        self.progress.supersteps_started += 1
        self.starting(k)
        after = None
        last = self.max_supersteps is not None and k >= self.max_supersteps
        if self.style is SuperstepCheckpointStyle.TAIL and self._due(k) and not last:
            after = self.tail_due = self.coordinator.next_id  # triggered at the first Done(k)
        for index in self.heads:
            self.send(index, P.SuperstepGo(k, snapshot_before, after))

    def _decide(self) -> str | None:
        k, dones = self.current, list(self.done.values())
        progress = self.progress
        progress.superstep_seconds.append((k, self.clock() - self.started_at))
        wave = Wave(k, sum(d.sent for d in dones), sum(d.received for d in dones))
        if not wave.balanced:
            return (
                f"{self.where}: superstep {k} is not balanced: {wave.sent} messages sent, "
                f"{wave.received} received (a message lost or counted twice); not deciding "
                "on a partial superstep"
            )
        aggregate = sum(d.aggregate for d in dones)
        progress.aggregates.append((k, aggregate))
        progress.supersteps = k
        if self.delta:
            converged = sum(d.active for d in dones) == 0  # balanced: nothing of k in flight
        else:
            converged = self.converged is not None and bool(self.converged(aggregate))
        if converged or (self.max_supersteps is not None and k >= self.max_supersteps):
            progress.converged = converged
            log.info(
                "%s: %s after superstep %d",
                self.where,
                "converged" if converged else "max_supersteps reached",
                k,
            )
            self.phase = IterationPhase.EMITTING
            if self.first_started_at is not None:
                progress.iterating_seconds += self.clock() - self.first_started_at
            for index in self.heads:
                self.send(index, P.EmitSolution(k))
            return None
        if self.style is SuperstepCheckpointStyle.BLOCKING and self._due(k):
            self._trigger(k)
        self._after_boundary()
        return None

    def _after_boundary(self) -> None:
        """At the boundary after ``current``: wait for an outstanding checkpoint when this
        style waits here, else go on."""
        k = self.current
        if self.outstanding is not None and (
            self.style is not SuperstepCheckpointStyle.HEAD or self._due(k)
        ):
            self.phase = IterationPhase.CHECKPOINT
            return
        if self.style is SuperstepCheckpointStyle.HEAD and self._due(k):
            n = self._trigger(k)  # the write overlaps the next superstep
            self._go(k + 1, snapshot_before=n)
            return
        self._next()

    def _next(self) -> None:
        """At the boundary after ``current``: the next superstep, or the stop's savepoint."""
        if self._stop is not None:
            self._stop_here()
        else:
            self._go(self.current + 1)

    # -- recovery ------------------------------------------------------------------------
    def _record_recovery(self, progress: IterationProgress, restored: int) -> None:
        failed = progress.failed_during
        assert failed is not None
        planned = progress.planned or SuperstepRecovery(
            0, 0, RecoveryKind.CHECKPOINT if restored else RecoveryKind.START
        )
        progress.recoveries.append(
            dataclasses.replace(
                planned,
                failed_during=failed,
                resumed_from=restored,
                loading=progress.failed_loading,
            )
        )
        progress.failed_during, progress.failed_loading, progress.planned = None, False, None

    def _collect_compensation_input(self) -> None:
        """Restored from a rescue snapshot: ask every head for its survivors and lost keys."""
        self.phase = IterationPhase.COMPENSATING
        self._inputs, self._compensated = {}, set()
        log.info("%s: input loaded, compensating the lost keys", self.where)
        for index in self.heads:
            self.send(index, P.CompensationRequest())

    def on_compensation_input(self, msg: P.CompensationInput) -> str | None:
        """A head's survivors and lost keys; once all are in, the compensation runs and
        its result goes to every head. Returns why the run must fail, if it must."""
        if self.phase is not IterationPhase.COMPENSATING or self.compensator is None:
            return None
        self._inputs[msg.task_index] = msg
        if len(self._inputs) < len(self.heads):
            return None
        try:
            values, workset, figures = self.compensator.compensate(
                (m.surviving, m.lost) for m in self._inputs.values()
            )
        except IterationError as err:
            return f"{self.where}: {err}"
        if self.progress.recoveries:
            last = self.progress.recoveries[-1]
            self.progress.recoveries[-1] = dataclasses.replace(
                last, lost_keys=figures.lost_keys, mass_after=figures.mass_after
            )
        for index in self.heads:
            self.send(index, P.Compensate(values, workset))
        return None

    def on_compensated(self, msg: P.Compensated) -> None:
        """A head took its compensated keys; once all did, the compensated state is
        checkpointed at the restored superstep (then the next superstep starts)."""
        if self.phase is not IterationPhase.COMPENSATING:
            return
        self._compensated.add(msg.task_index)
        if len(self._compensated) < len(self.heads):
            return
        log.info(
            "%s: lost keys compensated; checkpointing the compensated state at superstep %d",
            self.where,
            self.current,
        )
        self.compensator = None
        self.phase = IterationPhase.CHECKPOINT
        self._trigger(self.current)

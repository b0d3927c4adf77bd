"""Optimistic recovery of superstep iterations (seed 004 §4): a recovery strategy of the
runner, on the attempt loop, the control plane and the checkpoint storage.

When a task of an iteration fails during superstep k, the failed attempt is not simply
ended:

1. **rescue** (`rescue_survivors`, before the attempt's survivors are cancelled): every
   surviving loop head is asked (``Rescue``) to write its keyed state as its part of a
   *rescue snapshot*, a partial checkpoint in the run's checkpoint storage whose
   ``_metadata`` holds a `RescueRecord` (the subtasks and key groups it holds, the
   superstep each head's state is after, the subtasks lost). A head's keyed state changes
   only at its update, atomically in its task loop, so whatever it writes is its state
   after some superstep; the heads must agree on which (else there is no consistent cut).
   The wait is bounded by ``rescue_timeout``;
2. **restore and compensate** (`Compensator`, run by ``jobmanager.supersteps`` in the next
   attempt): the survivors' key groups come back from the rescue snapshot, the input
   (solution set, side input) re-enters through its source while LOADING and every head
   takes only the keys it lacks; the user's compensation function then rebuilds the
   lost keys from the survivors' values and the lost keys' side input, the compensated
   state is checkpointed at the rescued superstep, and the iteration goes on with the
   superstep after it (the one that failed: one superstep re-run);
3. **fall back** (`OptimisticRun.next_restore`): when the rescue fails (a survivor dies
   or does not answer in time, too many heads are lost, the heads' states are of
   different supersteps) the run restores its newest restore point (a superstep
   checkpoint, the compensated state of an earlier recovery, or an earlier rescue
   snapshot, by checkpoint id: the newest), else starts over, and says why in the
   recovery's ``note``. A failure before the failed attempt started a superstep (e.g. a
   second kill while it loads) takes no rescue: its heads hold nothing newer than what
   it restored, which stays the restore point.

Driver side, job-manager thread only.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from channels.messages import decode_records, encode_data
from jobmanager.result import RecoveryKind, SuperstepRecovery
from runtime import control as P
from runtime.config import OptimisticRecovery
from runtime.errors import IterationError
from runtime.plan import JobPlan, step_state
from statebackend.metadata import CheckpointMetadata, RescueRecord, TaskStateHandle
from statebackend.metrics import AckMetrics, summarize
from statebackend.storage import CheckpointStorage

log = logging.getLogger("absflow.jobmanager")

__all__ = [
    "CompensationFigures",
    "Compensator",
    "OptimisticRun",
    "RescueFailure",
    "RescueOutcome",
    "lost_heads",
    "rescue_survivors",
]

RESCUE_POLL_MS = 20


class RescueFailure(enum.Enum):
    """Why a failed attempt left no rescue snapshot; the value is the human message."""

    PERMANENT = "the failure is one a restart cannot fix"
    NO_SUPERSTEP = (
        "the failed attempt had started no superstep: its loop heads hold nothing newer "
        "than what it restored"
    )
    NO_SURVIVOR = "no loop head survived"
    TOO_MANY_LOST = "more loop heads were lost than max_lost_fraction allows"
    SURVIVOR_LOST = "a surviving loop head failed too during the rescue"
    TIMEOUT = "a surviving loop head did not answer the rescue within rescue_timeout"
    MIXED_SUPERSTEPS = "the survivors' states are after different supersteps"
    WRITE_FAILED = "writing the rescue snapshot failed"


@dataclass(frozen=True)
class RescueOutcome:
    """A rescue snapshot (``checkpoint_id`` with its ``metadata``), or why there is none
    (``failure``, ``detail``: the specifics)."""

    metadata: CheckpointMetadata | None = None
    failure: RescueFailure | None = None
    detail: str = ""

    @property
    def checkpoint_id(self) -> int | None:
        return None if self.metadata is None else self.metadata.checkpoint_id

    def describe(self) -> str:
        if self.failure is None:
            return "rescued"
        return f"{self.failure.value}" + (f" ({self.detail})" if self.detail else "")


class Head(Protocol):
    """What the rescue needs to know of a loop head's task (``services.TaskInfo``)."""

    @property
    def task_id(self) -> str: ...
    @property
    def subtask(self) -> int: ...


def rescue_survivors(
    *,
    settings: OptimisticRecovery,
    plan: JobPlan,
    step_name: str,
    heads: Mapping[int, Head],
    lost: Iterable[int],
    attempt: int,
    restored: int,
    failed_during: int,
    checkpoint_id: int,
    storage: CheckpointStorage,
    send: Callable[[int, P.Message], None],
    receive: Callable[[int], Iterator[P.Message]],
    gone: Callable[[int], bool],
    clock: Callable[[], float] = time.monotonic,
) -> RescueOutcome:
    """Write the surviving loop heads' state as rescue snapshot ``checkpoint_id``.

    ``heads``: the loop heads' tasks by task index; ``lost``: the indexes known lost (the
    failed one, those whose process is gone); ``restored``: the superstep the attempt
    restored (a head that updated nothing in it holds that one); ``gone(index)``: whether
    a task's process is gone now. Waits up to ``settings.rescue_timeout`` for the answers;
    never raises for a survivor that fails (a `RescueOutcome` says so)."""
    lost_set = {i for i in lost if i in heads}
    survivors = sorted(set(heads) - lost_set)
    p = len(heads)
    if not survivors:
        return RescueOutcome(failure=RescueFailure.NO_SURVIVOR)
    if len(lost_set) > settings.max_lost_fraction * p:
        return RescueOutcome(
            failure=RescueFailure.TOO_MANY_LOST,
            detail=f"{len(lost_set)} of {p} lost, max_lost_fraction={settings.max_lost_fraction}",
        )
    started = clock()
    for index in survivors:
        send(index, P.Rescue(checkpoint_id))
    answers: dict[int, P.Rescued] = {}
    deadline = started + settings.rescue_timeout
    while len(answers) < len(survivors):
        if clock() >= deadline:
            missing = [heads[i].task_id for i in survivors if i not in answers]
            return RescueOutcome(
                failure=RescueFailure.TIMEOUT,
                detail=f"{missing} after {settings.rescue_timeout:g} s",
            )
        for msg in receive(RESCUE_POLL_MS):
            if not P.of_attempt(msg, attempt) or getattr(msg, "task_index", -1) not in survivors:
                continue
            if isinstance(msg, P.Rescued) and msg.checkpoint_id == checkpoint_id:
                answers[msg.task_index] = msg
            elif isinstance(msg, P.Failed | P.Closed):
                return RescueOutcome(
                    failure=RescueFailure.SURVIVOR_LOST,
                    detail=f"task {heads[msg.task_index].task_id}: {type(msg).__name__}",
                )
        dead = [i for i in survivors if i not in answers and gone(i)]
        if dead:
            return RescueOutcome(
                failure=RescueFailure.SURVIVOR_LOST,
                detail=f"task {heads[dead[0]].task_id} is gone",
            )
    after = {heads[i].subtask: (a.after if a.after >= 0 else restored) for i, a in answers.items()}
    if len(set(after.values())) != 1:
        return RescueOutcome(failure=RescueFailure.MIXED_SUPERSTEPS, detail=f"{after}")
    (superstep,) = set(after.values())
    tasks: dict[str, TaskStateHandle] = {}
    for index, answer in answers.items():
        if answer.state is None:
            return RescueOutcome(
                failure=RescueFailure.WRITE_FAILED,
                detail=f"task {heads[index].task_id} wrote no state (no checkpoint storage)",
            )
        tasks[heads[index].task_id] = answer.state
    groups = sorted(
        layout.key_groups
        for handle in tasks.values()
        for name, layout in handle.operators.items()
        if name == step_name and layout.key_groups is not None
    )
    record = RescueRecord(
        step=step_name,
        subtasks=tuple(sorted(after)),
        key_groups=tuple(groups),
        supersteps=after,
        lost=tuple(sorted(heads[i].subtask for i in lost_set)),
        failed_during=failed_during,
    )
    held = {name for handle in tasks.values() for name in handle.operators}
    duration_ms = round((clock() - started) * 1000, 3)
    per_task = {task: AckMetrics() for task in tasks}
    metadata = CheckpointMetadata(
        checkpoint_id=checkpoint_id,
        job=plan.name,
        attempt=attempt,
        final=False,
        trigger_time=time.time() - duration_ms / 1000,
        completed_time=time.time(),
        duration_ms=duration_ms,
        max_parallelism=plan.max_parallelism,
        tasks=tasks,
        task_metrics=per_task,
        metrics=summarize(per_task, "rescue", duration_ms),
        steps=tuple(
            sorted((step_state(s) for s in plan.steps if s.name in held), key=lambda s: s.name)
        ),
        superstep=superstep,
        rescue=record,
    )
    try:
        storage.write_metadata(metadata)
    except OSError as err:
        return RescueOutcome(failure=RescueFailure.WRITE_FAILED, detail=f"{err}")
    log.warning(
        "rescue snapshot %d: the state of %d surviving loop head(s) after superstep %d, "
        "written in %.0f ms (lost subtasks %s)",
        checkpoint_id,
        len(tasks),
        superstep,
        duration_ms,
        list(record.lost),
    )
    return RescueOutcome(metadata)


@dataclass(frozen=True)
class CompensationFigures:
    lost_keys: int
    mass_after: float | None
    """The sum of every key's value after the compensation, when they are numbers (the
    PageRank mass: 1 when the compensation restored it)."""


class Compensator:
    """Runs the user's compensation function on the loop heads' `CompensationInput`
    (``(surviving, lost)`` record frames) and checks what it returns."""

    def __init__(self, compensation: Any, delta: bool, where: str) -> None:
        self.compensation, self.delta, self.where = compensation, delta, where

    def compensate(
        self, inputs: Iterable[tuple[bytes, bytes]]
    ) -> tuple[bytes, bytes, CompensationFigures]:
        """``(values frame, workset frame, figures)``; raises IterationError naming the
        function when it returns other keys than the lost ones or unknown workset keys."""
        surviving: dict[Any, Any] = {}
        side: dict[Any, Any] = {}
        for kept, lost in inputs:
            surviving.update(decode_records(kept))
            side.update(decode_records(lost))
        lost_keys = frozenset(side)
        name = getattr(self.compensation, "__name__", repr(self.compensation))
        if not lost_keys:  # every key survived: nothing to rebuild
            return encode_data(0, []), encode_data(0, []), CompensationFigures(0, _mass(surviving))
        out = self.compensation(surviving, lost_keys, side)
        if self.delta:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise IterationError(
                    f"compensation '{name}' must return (values, workset additions) for a "
                    "delta iteration"
                )
            values, additions = out
        else:
            values, additions = out, ()
        if not isinstance(values, Mapping) or set(values) != lost_keys:
            got = set(values) if isinstance(values, Mapping) else set()
            missing, extra = lost_keys - got, got - lost_keys
            raise IterationError(
                f"compensation '{name}' must return exactly the lost keys ({len(lost_keys)}) "
                f"as a mapping; missing {sorted(map(repr, missing))[:5]}, unexpected "
                f"{sorted(map(repr, extra))[:5]}"
            )
        unknown = set(additions) - surviving.keys() - lost_keys
        if unknown:
            raise IterationError(
                f"compensation '{name}' added keys to the workset that the solution set does "
                f"not have: {sorted(map(repr, unknown))[:5]}"
            )
        figures = CompensationFigures(len(lost_keys), _mass({**surviving, **values}))
        return encode_data(0, list(values.items())), encode_data(0, list(additions)), figures


def _mass(values: Mapping[Any, Any]) -> float | None:
    if values and all(isinstance(v, float) for v in values.values()):
        return float(sum(values.values()))
    return None


@dataclass
class OptimisticRun:
    """The run's side of optimistic recovery: the newest rescue snapshot, and what the next
    attempt restores after a failure."""

    settings: OptimisticRecovery
    latest: CheckpointMetadata | None = None

    def next_restore(
        self, outcome: RescueOutcome, newest_checkpoint: CheckpointMetadata | None
    ) -> tuple[CheckpointMetadata | None, SuperstepRecovery]:
        """The metadata the next attempt restores (None: the start) and how it recovers
        (``SuperstepRecovery`` with kind, note and lost subtasks; the superstep numbers
        are filled in by the next attempt)."""
        if outcome.metadata is not None:
            self.latest = outcome.metadata
            record = outcome.metadata.rescue
            assert record is not None
            return outcome.metadata, SuperstepRecovery(
                0, 0, RecoveryKind.OPTIMISTIC, lost=record.lost
            )
        why = f"no rescue: {outcome.describe()}"
        newest_id = newest_checkpoint.checkpoint_id if newest_checkpoint is not None else 0
        if self.latest is not None and self.latest.checkpoint_id > newest_id:
            rescue = self.latest.rescue
            assert rescue is not None
            note = (
                f"{why}; restoring rescue snapshot {self.latest.checkpoint_id} (after superstep "
                f"{self.latest.superstep}) again and compensating its lost keys again"
            )
            log.warning("optimistic recovery: %s", note)
            return self.latest, SuperstepRecovery(
                0, 0, RecoveryKind.OPTIMISTIC, note=note, lost=rescue.lost
            )
        if newest_checkpoint is not None:
            where = (
                f"checkpoint {newest_checkpoint.checkpoint_id} at superstep "
                f"{newest_checkpoint.superstep}"
            )
            note = f"{why}; falling back to {where}"
            kind = RecoveryKind.CHECKPOINT
        else:
            note, kind = f"{why}; falling back to the start", RecoveryKind.START
        log.warning("optimistic recovery: %s", note)
        return newest_checkpoint, SuperstepRecovery(0, 0, kind, note=note)


def lost_heads(
    heads: Mapping[int, Head],
    names: Iterable[str],
    failed: tuple[str | None, int | None],
    gone: Callable[[int], bool],
) -> list[int]:
    """The loop heads lost in a failure: the failed one (``(operator, subtask)`` of the
    failure names one of ``names``, the heads' chain and its steps: it raised, was frozen
    or died) and any whose process is gone."""
    operator, subtask = failed
    named = operator is not None and operator in set(names)
    return [i for i, h in heads.items() if (named and h.subtask == subtask) or gone(i)]

"""Restoring a checkpoint into a job: whether it fits, and which files each subtask reads.

Both are pure functions of a checkpoint's `CheckpointMetadata` and the new job's
steps (tested without Spark):

* `check_compatible` runs on the driver before the first attempt. State is matched
  to a step by **name and kind**, and, when absflow made the name up (``aggregate_2``),
  by the step's position in the graph too (its signature, see ``runtime.step_ids``); a checkpoint whose state has no matching step is
  refused unless ``allow_non_restored_state`` (then that state is dropped, as with
  Flink's allowNonRestoredState). Non-keyed state cannot be redistributed, so its
  step must keep its parallelism, unless it is union state (a rescalable source or
  sink: ``StepState.redistribute``); keyed state needs the same number of key groups.
* `plan_restore` runs in each task: for each of its operators, the state file with
  its own operator state (same subtask) and the state files whose key-group ranges
  overlap its own; for union state at another parallelism, every old subtask's state
  file (the operator gets a `RescaledState` and redistributes it).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from statebackend.errors import IncompatibleCheckpointError
from statebackend.metadata import CheckpointMetadata, StepState, TaskStateHandle

log = logging.getLogger("absflow.statebackend")

_ALLOW_HINT = "pass allow_non_restored_state=True to drop it"


def _unmatched(recorded: StepState, new: StepState | None, job: str) -> str | None:
    """Why ``recorded``'s state has no step in the new job, or None if ``new`` matches."""
    if new is None:
        return f"state of step '{recorded.name}' has no step of that name in job '{job}'"
    if recorded.kind and new.kind != recorded.kind:
        return (
            f"state of {recorded.kind} step '{recorded.name}' has no {recorded.kind} step of "
            f"that name in job '{job}' ('{new.name}' is a {new.kind} step there)"
        )
    if recorded.signature and new.signature and new.signature != recorded.signature:
        return (
            f"state of {recorded.kind or 'the'} step '{recorded.name}': that name was made up "
            f"by absflow (build order), and in job '{job}' it belongs to a step in another "
            f"position of the graph (a stateful step was inserted, removed or moved before "
            f"it), so the state would load into the wrong step; pass name='{recorded.name}' "
            f"to the step that should get this state, and name your other stateful "
            "steps (an explicit name is a step's id across versions)"
        )
    return None


def _match(recorded: StepState, new: StepState | None) -> StepState | None:
    """``new`` if ``recorded``'s state restores into it (same name and kind), else None."""
    return new if _unmatched(recorded, new, "") is None else None


def _unfit(recorded: StepState, new: StepState, checkpoint_groups: int, groups: int) -> str | None:
    """Why matched state cannot be restored into ``new``, or None if it can."""
    if not recorded.keyed and not new.redistribute and new.parallelism != recorded.parallelism:
        return (
            f"step '{new.name}' has parallelism {new.parallelism}, the checkpoint has it at "
            f"parallelism {recorded.parallelism} and its state is not keyed (it cannot be "
            f"redistributed); run '{new.name}' with parallelism {recorded.parallelism}"
        )
    if recorded.keyed and groups != checkpoint_groups:
        return (
            f"keyed step '{new.name}': the checkpoint has {checkpoint_groups} key groups "
            f"(max_parallelism), the job {groups}; keyed state restores only with the same "
            f"max_parallelism: use Dataflow(max_parallelism={checkpoint_groups})"
        )
    return None


def check_compatible(
    metadata: CheckpointMetadata,
    steps: Sequence[StepState],
    job: str,
    max_parallelism: int,
    allow_non_restored_state: bool = False,
    redistributable_logs: Collection[str] = (),
) -> list[StepState]:
    """Check that checkpoint ``metadata`` can be restored into job ``job`` with ``steps``.
    ``redistributable_logs`` names the in-flight logs (``<step>#<what>``) the job can
    redistribute at another parallelism (a loop head's back-edge log routed by key).

    Returns the recorded steps whose state will be dropped (only with
    ``allow_non_restored_state``; a WARNING names each). Raises
    IncompatibleCheckpointError naming every step that does not fit.
    """
    by_name = {s.name: s for s in steps}
    dropped: list[StepState] = []
    unmatched: list[str] = []
    unfit: list[str] = []
    for recorded in metadata.steps:
        new = _match(recorded, by_name.get(recorded.name))
        if new is None:
            unmatched.append(str(_unmatched(recorded, by_name.get(recorded.name), job)))
            dropped.append(recorded)
            continue
        problem = _unfit(recorded, new, metadata.max_parallelism, max_parallelism)
        if problem is not None:
            unfit.append(problem)
    unfit += _logged_records_unfit(metadata, by_name, redistributable_logs)
    where = f"{_what(metadata)} {metadata.checkpoint_id} of job '{metadata.job}'"
    other_job = _other_job(metadata, job)
    if other_job or unfit or (unmatched and not allow_non_restored_state):
        problems = [other_job] if other_job else []
        problems += unfit
        if not allow_non_restored_state:
            problems += [f"{why}; {_ALLOW_HINT}" for why in unmatched]
        raise IncompatibleCheckpointError(
            f"cannot restore {where} into job '{job}': " + "; ".join(problems)
        )
    for why in unmatched:
        log.warning("restoring %s: %s; dropped (allow_non_restored_state=True)", where, why)
    return dropped


def _what(metadata: CheckpointMetadata) -> str:
    return "savepoint" if metadata.savepoint else "checkpoint"


def _other_job(metadata: CheckpointMetadata, job: str) -> str | None:
    """Why a checkpoint of another job is refused (even when its steps would fit: two
    jobs share step names like 'source' or 'collect' easily), or None."""
    if metadata.job == job:
        return None
    return (
        f"it was written by job '{metadata.job}', not '{job}': restore a checkpoint or "
        f"savepoint of '{job}' (list them with `python -m jobmanager checkpoints DIR`), or, "
        f"if this job is '{metadata.job}' changed or renamed, keep its name: "
        f"Dataflow('{metadata.job}', ...)"
    )


def _logged_records_unfit(
    metadata: CheckpointMetadata, steps: Mapping[str, StepState], redistributable: Collection[str]
) -> list[str]:
    """Records logged in flight (an unaligned checkpoint's channel state, a loop's
    back-edge log) were partitioned for their task: they restore only at the parallelism
    they were logged at, unless the job can route them again (``redistributable``)."""
    problems: dict[str, str] = {}
    for handle in metadata.tasks.values():
        for name, layout in handle.operators.items():
            step, sep, what = name.partition("#")
            new = steps.get(step)
            if not sep or new is None or new.parallelism == layout.parallelism:
                continue
            if name in redistributable:
                continue
            problems[step] = (
                f"step '{step}' has parallelism {new.parallelism}, the checkpoint logged its "
                f"in-flight records ({what}) at parallelism {layout.parallelism}; they cannot "
                f"be redistributed: run '{step}' with parallelism {layout.parallelism}, or "
                "rescale from a checkpoint taken with snapshot_mode='exactly_once'"
            )
    return list(problems.values())


@dataclass(frozen=True, slots=True)
class RestoreTarget:
    """One operator of a subtask of the new job: its step, and the key groups it owns
    (None unless keyed)."""

    step: StepState
    key_groups: range | None = None


@dataclass(frozen=True, slots=True)
class OperatorRestore:
    """Where one operator's state comes from: ``operator_state`` is the state file with
    this subtask's own operator state (None: start empty); ``keyed_state`` the state
    files whose key-group ranges overlap this subtask's."""

    operator: str
    operator_state: TaskStateHandle | None
    keyed_state: tuple[TaskStateHandle, ...]
    # Union state at another parallelism: (old subtask, its state file), every old one.
    rescaled: tuple[tuple[int, TaskStateHandle], ...] = ()
    old_parallelism: int = 0


@dataclass(frozen=True, slots=True)
class RescaledState:
    """What a rescalable source or sink restores from when its parallelism changed:
    ``parts`` is every old subtask's state as ``(old subtask, state)``, written at
    ``old_parallelism``. The operator redistributes it (Flink's union list state): a
    source re-assigns its splits by the rule it uses for new ones; a sink's subtask
    ``i`` recovers the old subtasks ``j`` with ``j % parallelism == i``."""

    parts: tuple[tuple[int, Any], ...]
    old_parallelism: int

    def mine(self, subtask: int, parallelism: int) -> list[tuple[int, Any]]:
        """The old subtasks' states that new subtask ``subtask`` of ``parallelism`` owns
        (each old one is owned by exactly one new one: its index modulo the new
        parallelism)."""
        return [(j, state) for j, state in self.parts if j % parallelism == subtask]


@dataclass(frozen=True, slots=True)
class RestorePlan:
    checkpoint_id: int
    operators: Mapping[str, OperatorRestore]


def plan_restore(
    metadata: CheckpointMetadata, subtask: int, targets: Sequence[RestoreTarget]
) -> RestorePlan:
    """Which state files subtask ``subtask`` reads for each of its operators.

    State recorded for a step of another kind, or for no step of the new job, is not
    planned (`check_compatible` decided it may be dropped). Raises
    IncompatibleCheckpointError if a non-keyed operator changed its parallelism.
    """
    planned: dict[str, OperatorRestore] = {}
    for target in targets:
        name = target.step.name
        recorded = metadata.step(name)
        if recorded is not None and _match(recorded, target.step) is None:
            continue
        own: TaskStateHandle | None = None
        keyed: list[TaskStateHandle] = []
        rescaled: list[tuple[int, TaskStateHandle]] = []
        old_parallelism = 0
        for handle in metadata.tasks.values():
            layout = handle.operators.get(name)
            if layout is None:
                continue
            rescaling = layout.parallelism != target.step.parallelism
            if layout.key_groups is None and rescaling and target.step.redistribute:
                rescaled.append((layout.subtask, handle))
                old_parallelism = layout.parallelism
                continue
            if layout.key_groups is None and rescaling:
                raise IncompatibleCheckpointError(
                    f"cannot restore '{name}' at parallelism {target.step.parallelism}: the "
                    f"checkpoint has it at parallelism {layout.parallelism} and its state is "
                    f"not keyed; run '{name}' with parallelism {layout.parallelism}"
                )
            if layout.subtask == subtask and layout.parallelism == target.step.parallelism:
                own = handle
            if target.key_groups is not None and layout.overlaps(target.key_groups):
                keyed.append(handle)
        rescaled.sort(key=lambda part: part[0])
        planned[name] = OperatorRestore(name, own, tuple(keyed), tuple(rescaled), old_parallelism)
    return RestorePlan(metadata.checkpoint_id, planned)

"""Fault injection as data: real SIGKILLs of task processes and raising UDFs.

    flow.run(faults=[Kill("count[1]", after_seconds=2.0)])
    flow.run(faults=[Kill("count[0]", after_checkpoint=3)])
    flow.run(faults=[Kill("count[0]", during="alignment")])
    flow.run(faults=[Kill("pagerank[1]", after_superstep=5)])  # an iteration
    flow.run(faults=[RaiseAt("split", record=5000)])
    flow.run(faults=[RandomKills(3, seed=7)])

A task reference is ``step[subtask]`` where step is any step of the task's chain.
``attempt`` says in which attempt (0 = first run, 1 = after the first restart, ...)
the fault fires, so several faults can kill a run several times. Which driver kills
are due when is ``jobmanager.fault_schedule``'s business.
"""

from __future__ import annotations

import dataclasses
import random
import signal
from dataclasses import dataclass

from runtime.errors import GraphError
from runtime.graph import StepKind
from runtime.plan import JobPlan
from runtime.task_environment import FaultKind, TaskFault


@dataclass(frozen=True)
class Kill:
    """SIGKILL the process of ``task`` in attempt ``attempt``: ``after_seconds`` after
    the attempt's tasks all registered, or right after a checkpoint completed once
    ``after_checkpoint`` checkpoints completed in this run (counted over all attempts;
    ids keep increasing across restores), or ``during`` "alignment" (when it starts
    aligning the ``after_checkpoint``-th checkpoint of the run or a later one, default the
    first) or "snapshot" (half way through writing its state file) or "compaction" (half
    way through writing the merged file of a compaction of its incremental keyed state,
    started at that checkpoint or a later one); in an iteration
    (``runtime.superstep``) also ``after_superstep``: as superstep K (or the first one
    after it) starts, before any loop head is told to start it."""

    task: str
    after_seconds: float | None = None
    after_checkpoint: int | None = None
    during: str | None = None
    attempt: int = 0
    signal: int = signal.SIGKILL  # SIGSTOP freezes the task instead: it stops heart-beating
    after_superstep: int | None = None


@dataclass(frozen=True)
class RaiseAt:
    """Make step ``operator`` (subtask ``subtask``) raise when it reaches record ``record``."""

    operator: str
    record: int
    subtask: int = 0
    attempt: int = 0


@dataclass(frozen=True)
class RandomKills:
    """``count`` SIGKILLs of random tasks, one after the other over the whole run.

    Kill i is armed in whichever attempt is running once that attempt processed its
    first record and completed a checkpoint since its restore (so every kill is restored
    from a real checkpoint and the job makes progress between kills); it fires between
    ``min_seconds`` and ``max_seconds`` after it was armed. An attempt whose sources
    ended before its kill fired gets it at once (a short job outruns its checkpoints;
    it restores the run's latest checkpoint, or starts over when there is none yet).
    ``seed`` fixes which tasks are
    picked and the delays. Kills the job outran are reported in ``result.unfired_faults``.
    """

    count: int
    seed: int | None = None
    min_seconds: float = 0.0
    max_seconds: float = 0.5


@dataclass(frozen=True)
class DriverKill:
    """A kill the job manager performs itself (resolved from Kill / RandomKills).

    ``attempt`` None: a random kill, armed in whichever attempt runs (see RandomKills;
    ``after_seconds`` then counts from the moment it is armed). ``label`` is how the
    user wrote the fault, for log lines and the unfired-fault note.
    """

    task_index: int
    attempt: int | None
    after_seconds: float | None
    after_checkpoint: int | None
    signal: int = signal.SIGKILL
    label: str = ""
    after_superstep: int | None = None


def resolve_faults(plan: JobPlan, faults: list[object]) -> tuple[list[DriverKill], list[TaskFault]]:
    """Check every fault against the plan; split them into driver- and task-side ones."""
    driver: list[DriverKill] = []
    task: list[TaskFault] = []
    for fault in faults:
        if isinstance(fault, Kill):
            t = _task(plan, fault.task)
            if fault.during is None:
                _check_kill_moment(fault, plan)
                driver.append(
                    DriverKill(
                        t,
                        fault.attempt,
                        fault.after_seconds,
                        fault.after_checkpoint,
                        fault.signal,
                        label=_kill_label(fault),
                        after_superstep=fault.after_superstep,
                    )
                )
            else:
                kind = _kill_during(fault, plan, t)
                task.append(TaskFault(kind, t, fault.attempt, fault.after_checkpoint or 1))
        elif isinstance(fault, RaiseAt):
            matches = [
                x
                for x in plan.tasks
                if x.subtask == fault.subtask
                and any(s.name == fault.operator for s in plan.chain_steps(x))
            ]
            if not matches:
                raise GraphError(
                    f"RaiseAt: no step '{fault.operator}' with subtask {fault.subtask}."
                )
            task.append(
                TaskFault(
                    FaultKind.RAISE_AT_RECORD,
                    matches[0].index,
                    fault.attempt,
                    operator=fault.operator,
                    record=fault.record,
                )
            )
        elif isinstance(fault, RandomKills):
            if not 0 <= fault.min_seconds <= fault.max_seconds:
                raise GraphError(
                    f"RandomKills: need 0 <= min_seconds <= max_seconds, got "
                    f"{fault.min_seconds!r} and {fault.max_seconds!r}."
                )
            # Same draws, in the same order, as before: a seed picks the same tasks.
            rng = random.Random(fault.seed)
            for i in range(fault.count):
                victim = rng.randrange(len(plan.tasks))
                at = rng.uniform(fault.min_seconds, fault.max_seconds)
                label = f"random kill {i + 1} of {fault.count} ({plan.tasks[victim].task_id})"
                driver.append(DriverKill(victim, None, at, None, label=label))
        else:
            raise GraphError(f"unknown fault {fault!r}: use Kill, RaiseAt or RandomKills.")
    return driver, task


def relative_to_run(faults: list[TaskFault], first_checkpoint_id: int) -> list[TaskFault]:
    """Task faults with ``checkpoint_id`` counted from the run's first checkpoint id (a run
    restored from another run's checkpoint starts at that id + 1, not at 1)."""
    return [
        dataclasses.replace(f, checkpoint_id=f.checkpoint_id + first_checkpoint_id - 1)
        if f.checkpoint_id is not None
        else f
        for f in faults
    ]


def _check_kill_moment(fault: Kill, plan: JobPlan) -> None:
    """A driver kill names when it fires; ``after_superstep`` only in an iteration."""
    if (fault.after_seconds, fault.after_checkpoint, fault.after_superstep) == (None, None, None):
        raise GraphError(
            f"Kill({fault.task!r}) needs after_seconds, after_checkpoint, "
            "after_superstep (iterations) or during."
        )
    if fault.after_superstep is not None and not any(
        s.kind is StepKind.SUPERSTEP for s in plan.steps
    ):
        raise GraphError(
            f"Kill({fault.task!r}, after_superstep=...): job '{plan.name}' is no "
            "iteration (it has no supersteps); use after_seconds or after_checkpoint."
        )


def _kill_during(fault: Kill, plan: JobPlan, t: int) -> FaultKind:
    """The task-side kill ``fault`` asks for (``during`` set), checked against task ``t``."""
    kind = FaultKind.kill_during(str(fault.during))
    if kind is None:
        moments = ", ".join(repr(m) for m in FaultKind.moments())
        raise GraphError(f"Kill(during={fault.during!r}): use one of {moments}.")
    if fault.signal != signal.SIGKILL:
        raise GraphError(f"Kill({fault.task!r}, during=...) always sends SIGKILL; drop signal=.")
    task = plan.tasks[t]
    if kind is FaultKind.KILL_DURING_BACKEDGE_LOG and not task.back_edge_inputs:
        raise GraphError(
            f"Kill({fault.task!r}, during='backedge_log'): the task has no back-edge "
            f"input (it is no loop head); loop heads: "
            f"{[x.task_id for x in plan.tasks if x.back_edge_inputs]}."
        )
    if kind is FaultKind.KILL_DURING_COMPACTION and not any(
        s.kind.keyed for s in plan.chain_steps(task)
    ):
        raise GraphError(
            f"Kill({fault.task!r}, during='compaction'): the task holds no keyed state, so "
            "it never compacts a chain; kill a task of a keyed step."
        )
    if kind is FaultKind.KILL_DURING_ALIGNMENT and len(task.inputs) < 2:
        raise GraphError(
            f"Kill({fault.task!r}, during='alignment'): the task has "
            f"{len(task.inputs)} input channel(s); alignment needs at least 2."
        )
    return kind


def _kill_label(fault: Kill) -> str:
    if fault.after_seconds is not None:
        when = f"after_seconds={fault.after_seconds}"
    elif fault.after_superstep is not None:
        when = f"after_superstep={fault.after_superstep}"
    else:
        when = f"after_checkpoint={fault.after_checkpoint}"
    sig = "" if fault.signal == signal.SIGKILL else f", {signal.Signals(fault.signal).name}"
    return f"Kill({fault.task!r}, {when}{sig}, attempt={fault.attempt})"


def _task(plan: JobPlan, ref: str) -> int:
    try:
        return plan.resolve_task(ref).index
    except ValueError as err:
        raise GraphError(str(err)) from None

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
from runtime.task_environment import TaskFault


@dataclass(frozen=True)
class Kill:
    """SIGKILL the process of ``task`` in attempt ``attempt``: ``after_seconds`` after
    the attempt's tasks all registered, or right after a checkpoint completed once
    ``after_checkpoint`` checkpoints completed in this run (counted over all attempts;
    ids keep increasing across restores), or ``during`` "alignment" (when it starts
    aligning the ``after_checkpoint``-th checkpoint of the run or a later one, default the
    first) or "snapshot" (half way through writing its state file); in an iteration
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
            _resolve_kill(plan, fault, driver, task)
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
                    "raise_at_record",
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


def _resolve_kill(
    plan: JobPlan, fault: Kill, driver: list[DriverKill], task: list[TaskFault]
) -> None:
    """``fault`` checked against ``plan``, as a driver kill or a task-side one."""
    t = _task(plan, fault.task)
    if fault.after_superstep is not None and not any(
        s.kind is StepKind.SUPERSTEP for s in plan.steps
    ):
        raise GraphError(
            f"Kill({fault.task!r}, after_superstep=...): job '{plan.name}' is no "
            "iteration (it has no supersteps); use after_seconds or after_checkpoint."
        )
    if fault.during is None:
        if (fault.after_seconds, fault.after_checkpoint, fault.after_superstep) == (
            None,
            None,
            None,
        ):
            raise GraphError(
                f"Kill({fault.task!r}) needs after_seconds, after_checkpoint, "
                "after_superstep (iterations) or during."
            )
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
    elif fault.signal != signal.SIGKILL:
        raise GraphError(f"Kill({fault.task!r}, during=...) always sends SIGKILL; drop signal=.")
    elif fault.during == "backedge_log":
        if not plan.tasks[t].back_edge_inputs:
            raise GraphError(
                f"Kill({fault.task!r}, during='backedge_log'): the task has no back-edge "
                f"input (it is no loop head); loop heads: "
                f"{[x.task_id for x in plan.tasks if x.back_edge_inputs]}."
            )
        task.append(
            TaskFault("kill_during_backedge_log", t, fault.attempt, fault.after_checkpoint or 1)
        )
    elif fault.during in ("alignment", "snapshot"):
        if fault.during == "alignment" and len(plan.tasks[t].inputs) < 2:
            raise GraphError(
                f"Kill({fault.task!r}, during='alignment'): the task has "
                f"{len(plan.tasks[t].inputs)} input channel(s); alignment needs at least 2."
            )
        kind = "kill_during_alignment" if fault.during == "alignment" else "kill_during_snapshot"
        task.append(TaskFault(kind, t, fault.attempt, fault.after_checkpoint or 1))
    else:
        raise GraphError(
            f"Kill(during={fault.during!r}): use 'alignment', 'snapshot' or 'backedge_log'."
        )


def relative_to_run(faults: list[TaskFault], first_checkpoint_id: int) -> list[TaskFault]:
    """Task faults with ``checkpoint_id`` counted from the run's first checkpoint id (a run
    restored from another run's checkpoint starts at that id + 1, not at 1)."""
    return [
        dataclasses.replace(f, checkpoint_id=f.checkpoint_id + first_checkpoint_id - 1)
        if f.checkpoint_id is not None
        else f
        for f in faults
    ]


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


def parse_kill_args(
    kill_task: str | None, after: str | None, chaos: int | None, seed: int | None = None
) -> list[object]:
    """Faults from the examples' command line: ``--kill-task count[1] --after 3s``
    (or ``--after chk2``, ``--after alignment``, ``--after snapshot``, ``--after
    superstep:5`` in an iteration) and ``--chaos K``."""
    faults: list[object] = []
    if kill_task:
        spec = (after or "1s").strip()
        if spec.startswith("superstep:"):
            faults.append(Kill(kill_task, after_superstep=int(spec[len("superstep:") :])))
        elif spec in ("alignment", "snapshot"):
            faults.append(Kill(kill_task, during=spec))
        elif spec.startswith("chk"):
            faults.append(Kill(kill_task, after_checkpoint=int(spec[3:])))
        else:
            faults.append(Kill(kill_task, after_seconds=float(spec.rstrip("s"))))
    if chaos:
        faults.append(RandomKills(chaos, seed=seed))
    return faults

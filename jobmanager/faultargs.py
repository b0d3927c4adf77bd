"""The examples' shared command line: checkpoint flags, fault injection checked the way
argparse checks, and a clean Ctrl-C.


    --kill-task count[1] --after 3s     (or 500ms, chk2, alignment, snapshot)
    --kill-task pagerank[1] --after superstep:5   (iterations: as superstep 5 starts)
    --chaos K [--seed S]                K random kills; the example compares with a clean run

A malformed value or a task the job does not have ends the program with a usage
error naming the value and what is accepted, not a traceback.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jobmanager.faults import Kill, RandomKills
from runtime.errors import JobCancelledError
from runtime.graph import StepKind
from runtime.plan import JobPlan

_SECONDS = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)?")
_CHECKPOINT = re.compile(r"chk(\d+)")
_SUPERSTEP = re.compile(r"superstep:(\d+)")
_DURING = ("alignment", "snapshot", "backedge_log")


@dataclass(frozen=True)
class When:
    """When a ``--kill-task`` kill fires."""

    seconds: float | None = None
    checkpoint: int | None = None
    during: str | None = None
    superstep: int | None = None  # iterations only (runtime.superstep)


def parse_when(text: str) -> When:
    """``2s``, ``1.5``, ``500ms``, ``chk3``, ``alignment`` or ``snapshot`` (an argparse type)."""
    spec = text.strip().lower()
    if spec in _DURING:
        return When(during=spec)
    if m := _CHECKPOINT.fullmatch(spec):
        if int(m.group(1)) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: checkpoints are numbered from 1 (chk1)")
        return When(checkpoint=int(m.group(1)))
    if m := _SUPERSTEP.fullmatch(spec):
        if int(m.group(1)) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: supersteps are numbered from 1")
        return When(superstep=int(m.group(1)))
    if m := _SECONDS.fullmatch(spec):
        value = float(m.group(1))
        return When(seconds=value / 1000 if m.group(2) == "ms" else value)
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a moment: use seconds (2s, 0.5s, 500ms), a checkpoint (chk3), "
        f"'alignment', 'snapshot', 'backedge_log' or (iterations) superstep:K"
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 1 kill")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("fault injection")
    group.add_argument(
        "--kill-task",
        metavar="STEP[i]",
        default=None,
        help="SIGKILL this task, e.g. count[1] (any step of its chain)",
    )
    group.add_argument(
        "--after",
        metavar="WHEN",
        type=parse_when,
        default=None,
        help="when: 2s, 500ms, chk3 (right after checkpoint 3), alignment, snapshot, "
        "backedge_log (a loop head, while it logs its back-edges) or, in iterations, "
        "superstep:K (as superstep K starts)",
    )
    group.add_argument(
        "--chaos",
        metavar="K",
        type=_positive,
        default=None,
        help="K random kills spread over the run; compares with a failure-free run",
    )
    group.add_argument("--seed", type=int, default=None, help="seed of --chaos")


def faults_from(parser: argparse.ArgumentParser, args: Any, plan: JobPlan) -> list[object]:
    """The faults the parsed ``args`` ask for, checked against ``plan``; a bad task
    reference or a kill that cannot fire there exits through ``parser.error``."""
    faults: list[object] = []
    if args.after is not None and not args.kill_task:
        parser.error("--after needs --kill-task")
    if args.kill_task:
        try:
            task = plan.resolve_task(args.kill_task)
        except (ValueError, KeyError) as err:
            known = ", ".join(t.task_id for t in plan.tasks)
            parser.error(f"--kill-task {args.kill_task}: {err}; the job's tasks are: {known}")
        when: When = args.after or When(seconds=1.0)
        iteration = any(s.kind is StepKind.SUPERSTEP for s in plan.steps)
        if when.superstep is not None and not iteration:
            parser.error("--after superstep:K applies to iterations (examples/pagerank.py)")
        if when.during == "backedge_log" and not task.back_edge_inputs:
            heads = ", ".join(t.task_id for t in plan.tasks if t.back_edge_inputs) or "none"
            parser.error(
                f"--kill-task {args.kill_task} --after backedge_log: not a loop head "
                f"(loop heads: {heads})"
            )
        if when.during == "alignment" and len(task.inputs) < 2:
            parser.error(
                f"--kill-task {args.kill_task} --after alignment: the task has "
                f"{len(task.inputs)} input channel(s); alignment needs at least 2"
            )
        faults.append(
            Kill(
                args.kill_task,
                after_seconds=when.seconds,
                after_checkpoint=when.checkpoint,
                during=when.during,
                after_superstep=when.superstep,
            )
        )
    if args.chaos:
        faults.append(RandomKills(args.chaos, seed=args.seed))
    return faults


def add_checkpoint_arguments(parser: argparse.ArgumentParser, interval: float = 0.5) -> None:
    parser.add_argument(
        "--checkpoint-interval", type=float, default=interval, help="seconds; 0 turns them off"
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="keep checkpoints and savepoints here (default: a temp dir)",
    )
    parser.add_argument(
        "--restore-from",
        default=None,
        metavar="PATH",
        help="resume from a savepoint or checkpoint (chk-<n>, or a root: its latest)",
    )


def report_stop(result: Any) -> bool:
    """Print how a job stopped with a savepoint (SIGTERM, Ctrl-C, `python -m jobmanager
    stop`) can resume; True when it stopped (its output is then only a part)."""
    if not result.stopped:
        return False
    print(result.summary())
    if result.savepoint:
        print(
            f"\nstopped with savepoint {result.savepoint}; resume with --restore-from {result.savepoint}"
        )
    return True


def checkpoint_config(args: Any) -> dict[str, object]:
    """``Dataflow`` settings from ``add_checkpoint_arguments``' flags."""
    if args.checkpoint_interval <= 0:
        return {}
    return {"checkpoint_interval": args.checkpoint_interval, "checkpoint_dir": args.checkpoint_dir}


def run_example(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.ArgumentParser, argparse.Namespace], int],
    argv: Sequence[str] | None,
) -> int:
    """Parse ``argv`` (fault flags added) and call ``run``; Ctrl-C stops the job and exits
    130 with one line instead of a traceback."""
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(parser, args)
    except (KeyboardInterrupt, JobCancelledError):
        print("\ncancelled (Ctrl-C): the tasks were stopped", file=sys.stderr)
        return 130

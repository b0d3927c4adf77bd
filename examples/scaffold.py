"""What every example shares besides its pipeline and its reference computation: the
command line (checkpoint flags, fault injection checked the way argparse checks, the
iteration examples' recovery flags), the run (the fault flags checked against the
job's plan, a failure-free reference run first under ``--chaos``) and the verdict
(the check against the reference computation, the chaos comparison, the exit code),
and a clean Ctrl-C.


    --kill-task count[1] --after 3s     (or 500ms, chk2, alignment, snapshot)
    --kill-task pagerank[1] --after superstep:5   (iterations: as superstep 5 starts)
    --chaos K [--seed S]                K random kills; the example compares with a clean run

A malformed value or a task the job does not have ends the program with a usage
error naming the value and what is accepted, not a traceback. Examples import this
module as ``examples.scaffold`` (they put the repository's root on ``sys.path``).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jobmanager.faults import Kill, RandomKills
from jobmanager.result import JobResult
from runtime import Dataflow
from runtime.api.iterations import RECOVERY_MODES, Compensation, Recovery
from runtime.errors import JobCancelledError
from runtime.graph import StepKind
from runtime.plan import JobPlan
from runtime.task_environment import FaultKind

_SECONDS = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)?")
_CHECKPOINT = re.compile(r"chk(\d+)")
_SUPERSTEP = re.compile(r"superstep:(\d+)")


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
    if FaultKind.kill_during(spec) is not None:
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
        f"{', '.join(repr(m) for m in FaultKind.moments())} or (iterations) superstep:K"
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
        "backedge_log (a loop head, while it logs its back-edges), compaction (a keyed "
        "task, compacting its incremental state) or, in iterations, superstep:K (as "
        "superstep K starts)",
    )
    group.add_argument(
        "--chaos",
        metavar="K",
        type=_positive,
        default=None,
        help="K random kills spread over the run; compares with a failure-free run",
    )
    group.add_argument("--seed", type=int, default=None, help="seed of --chaos")


def faults_from(
    parser: argparse.ArgumentParser, args: argparse.Namespace, plan: JobPlan
) -> list[object]:
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
        during = None if when.during is None else FaultKind.kill_during(when.during)
        if during is FaultKind.KILL_DURING_BACKEDGE_LOG and not task.back_edge_inputs:
            heads = ", ".join(t.task_id for t in plan.tasks if t.back_edge_inputs) or "none"
            parser.error(
                f"--kill-task {args.kill_task} --after backedge_log: not a loop head "
                f"(loop heads: {heads})"
            )
        if during is FaultKind.KILL_DURING_ALIGNMENT and len(task.inputs) < 2:
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


def report_stop(result: JobResult) -> bool:
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


def checkpoint_config(args: argparse.Namespace) -> dict[str, object]:
    """``Dataflow`` settings from ``add_checkpoint_arguments``' flags."""
    if args.checkpoint_interval <= 0:
        return {}
    return {"checkpoint_interval": args.checkpoint_interval, "checkpoint_dir": args.checkpoint_dir}


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An example's parser, its module docstring (the commands to try) as description."""
    return argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


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


# -- a streaming example's run and verdict ---------------------------------------------------
@dataclass(frozen=True)
class ExampleRun:
    """A run with the flags' faults; ``reference`` is the failure-free run of ``--chaos``."""

    result: JobResult
    elapsed: float  # seconds, with Spark start-up
    reference: JobResult | None


def run_job(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    build: Callable[..., Dataflow],
    *,
    reference_run: bool = True,
    restore_from: str | None = None,
) -> ExampleRun:
    """Build the job (``build(**settings)``, the checkpoint flags' settings), check the
    fault flags against its plan, print its plan, run it with the faults.

    Under ``--chaos`` a failure-free run of the same job comes first (``reference_run``;
    an example whose reference computation gives the exact output record for record
    compares with that instead, ``reference_run=False``)."""
    config = checkpoint_config(args)
    flow = build(**config)
    faults = faults_from(parser, args, flow.plan())
    flow.explain()
    reference = None
    if args.chaos and reference_run:
        print("failure-free reference run ...")
        reference = build(**config).run(progress=False)
    started = time.perf_counter()
    result = flow.run(faults=faults, restore_from=restore_from)
    return ExampleRun(result, time.perf_counter() - started, reference)


def verdict(
    run: ExampleRun,
    args: argparse.Namespace,
    ok: bool,
    output: Callable[[JobResult], object] | None = None,
) -> int:
    """The exit code (0: ``ok`` and, under ``--chaos``, the same output as the
    failure-free run, compared as ``output(result)``), printing what decided it."""
    if run.result.unfired_faults:
        print("note: the job finished before a fault fired; try an earlier --after")
    if run.reference is not None:
        assert output is not None, "a reference run needs the output to compare"
        same = output(run.result) == output(run.reference)
        print(
            f"chaos: {len(run.result.restarts)} restart(s); output equals the failure-free run "
            f"record for record: {'YES' if same else 'NO'}"
        )
        ok = ok and same
    elif args.chaos:  # the reference computation is the failure-free output
        print(
            f"chaos: {len(run.result.restarts)} restart(s); output equals the failure-free "
            f"result record for record: {'YES' if ok else 'NO'}"
        )
    return 0 if ok else 1


# -- the iteration examples' recovery flags and kills ----------------------------------------
_TASK = re.compile(r"(?:([A-Za-z_][\w.-]*)\[)?(\d+)\]?")


def add_recovery_arguments(parser: argparse.ArgumentParser) -> None:
    """``--local`` / ``--recovery`` / ``--interval`` / ``--checkpoint-dir`` /
    ``--storage-options`` of an iteration; the kill flags are ``add_arguments``'
    (``--after superstep:K``)."""
    parser.add_argument(
        "--local",
        action="store_true",
        help="no Spark: the tasks as local processes (the test harness's launcher)",
    )
    parser.add_argument(
        "--recovery",
        choices=RECOVERY_MODES,
        default="optimistic",
        help="optimistic: rescue + compensation (no checkpoints); blocking/tail/head: "
        "superstep checkpoints every --interval supersteps; none: restart from the start",
    )
    parser.add_argument(
        "--interval",
        type=int,
        default=None,
        help="checkpoint every K supersteps (default: sqrt of the expected count)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=None,
        help="superstep checkpoints here: a path or a storage URL such as s3://bucket/prefix "
        "(default: a temp dir)",
    )
    parser.add_argument(
        "--storage-options",
        type=_json_object,
        default=None,
        metavar="JSON",
        help='fsspec options of --checkpoint-dir, e.g. \'{"endpoint_url": "http://..."}\'',
    )


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--storage-options is not JSON: {err}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--storage-options must be a JSON object")
    return value


def recovery_from(args: Any, compensation: Compensation, expected_supersteps: int) -> Recovery:
    interval = args.interval or max(1, round(expected_supersteps**0.5))  # seed 004: k ~ sqrt(n)
    return Recovery(
        args.recovery,
        interval=interval,
        compensation=compensation if args.recovery == "optimistic" else None,
        checkpoint_dir=args.checkpoint_dir,
        storage_options=args.storage_options,
        max_restarts=max(3, (args.chaos or 0) + 1),
    )


def iteration_kills(
    parser: argparse.ArgumentParser,
    args: Any,
    step: str,
    parallelism: int,
    expected_supersteps: int,
) -> list[tuple[int, int]]:
    """(task index, superstep) pairs; bad flags end through ``parser.error``."""
    kills: list[tuple[int, int]] = []
    if args.after is not None and not args.kill_task:
        parser.error("--after needs --kill-task")
    if args.kill_task:
        m = _TASK.fullmatch(args.kill_task.strip())
        if m is None or (m.group(1) not in (None, step)) or int(m.group(2)) >= parallelism:
            parser.error(
                f"--kill-task {args.kill_task}: the iteration's tasks are {step}[0] .. {step}[{parallelism - 1}]"
            )
        if args.after is None or args.after.superstep is None:
            parser.error("--kill-task in an iteration needs --after superstep:K")
        kills.append((int(m.group(2)), args.after.superstep))
    if args.chaos:
        rng = random.Random(args.seed)
        last = max(2, expected_supersteps - 1)  # the superstep before the last one
        steps = sorted(rng.sample(range(2, last + 1), min(args.chaos, last - 1)))
        kills.extend((rng.randrange(parallelism), k) for k in steps)
    return kills


def run_iteration(
    parser: argparse.ArgumentParser,
    args: Any,
    it: Any,
    compensation: Compensation,
    expected_supersteps: int = 40,
) -> Any:
    """Run iteration ``it`` with the flags' recovery and kills (``--chaos``: a clean run
    first, so that the kills land inside the supersteps it takes); its ``IterationRun``."""
    launcher = "local" if args.local else None
    name = it.spec.name
    if args.chaos:
        clean = it.run(launcher=launcher)
        expected_supersteps = clean.supersteps
        print(f"clean run: {clean.supersteps} supersteps, {clean.seconds:.2f} s")
    kills = iteration_kills(parser, args, name, it.spec.parallelism, expected_supersteps)
    return it.run(
        recovery=recovery_from(args, compensation, expected_supersteps),
        kills=kills,
        launcher=launcher,
    )

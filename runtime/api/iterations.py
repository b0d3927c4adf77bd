"""Superstep iterations as Dataflows: what ``BulkIteration`` / ``DeltaIteration`` build
and run on the streaming runtime (``runtime.superstep``, ``jobmanager.supersteps``).

    <name>:input --hash by key--> <name> (iterate) -> <step>:superstep --> <name>:result
                                      ^                       |
                                      +-- feedback, hash -----+

The input is an ordinary source (``CollectionSource`` of ``(key, tag, payload)``
records: the solution set, the side input, the workset), the result an ordinary sink
(``collect``: exactly once, committed by the final checkpoint). Everything a streaming
job has, the iteration has by construction: the launchers (Spark, the local harness),
heartbeats, restart strategies, the dashboard, ``JobResult``, ``faults=``. Superstep
checkpoints (``superstep_checkpoint_interval``) go through the checkpoint storage and are
listed by ``python -m jobmanager checkpoints``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.api.dataflow import Dataflow, Stream
from runtime.errors import GraphError
from runtime.graph import EdgeKind, Partitioning, StepKind, check_picklable
from runtime.sources import CollectionSource
from runtime.superstep import SIDE, SOLUTION, WORKSET, entry_key

if TYPE_CHECKING:
    from jobmanager.result import IterationProgress, JobResult, SuperstepRecovery

__all__ = ["IterationRun", "iteration_dataflow", "kills_at_supersteps", "run_on_streaming"]


def kills_at_supersteps(name: str, kills: Iterable[tuple[int, int]]) -> list[Any]:
    """``(task index, superstep)`` kills as ``Kill(f"{name}[i]", after_superstep=k)``,
    one per attempt in superstep order (each kill fails the attempt it fires in)."""
    from jobmanager.faults import Kill

    ordered = sorted(kills, key=lambda kill: kill[1])
    return [
        Kill(f"{name}[{task}]", after_superstep=k, attempt=n) for n, (task, k) in enumerate(ordered)
    ]


def run_on_streaming(
    it: Any,
    recovery: Any = None,
    faults: Iterable[Any] = (),
    launcher: str | None = None,
    **config: Any,
) -> IterationRun:
    """Run a ``BulkIteration`` / ``DeltaIteration`` (``runtime.iterations``) as a Dataflow
    on the streaming runtime. ``recovery``: ``Recovery("none")`` restarts from the start,
    ``"blocking"`` / ``"tail"`` / ``"head"`` from the superstep checkpoint taken every
    ``interval`` supersteps in that style (``superstep_checkpoint_style``: blocking waits
    for the write at the boundary, tail snapshots as each head's update ends, head writes
    while the next superstep runs). ``faults``: ``jobmanager.faults`` kills;
    ``launcher``: ``"local"`` (the harness) or ``"spark"`` (None: the default)."""
    from jobmanager.restart import FixedDelay
    from runtime.iterations.api import Recovery

    rec = recovery if recovery is not None else Recovery()
    spec = it.spec
    where = f"iteration '{spec.name}' (step '{spec.step.name}')"
    if rec.mode == "optimistic":
        raise GraphError(
            f"{where}: optimistic recovery does not run on the streaming runtime yet; "
            "use it.run(recovery=...) for it"
        )
    settings: dict[str, Any] = {
        "restart_strategy": FixedDelay(rec.max_restarts, 0.05),
        "superstep_checkpoint_interval": rec.interval if rec.mode != "none" else None,
        "superstep_checkpoint_style": rec.mode if rec.mode != "none" else "blocking",
        "checkpoint_dir": rec.checkpoint_dir,
        "storage_options": dict(rec.storage_options or {}),
    }
    if launcher is not None:
        settings["launcher"] = launcher
    settings.update(config)
    flow = iteration_dataflow(
        spec.name,
        spec.step,
        it.solution,
        it.side,
        it.workset if spec.delta else None,
        spec.parallelism,
        spec.max_supersteps,
        spec.converged,
    )
    return IterationRun.of(spec.name, flow.run(faults=list(faults), **settings))


def iteration_dataflow(
    name: str,
    step: Any,
    solution: Mapping[Any, Any],
    side: Mapping[Any, Any],
    workset: Iterable[Any] | None,
    parallelism: int,
    max_supersteps: int | None,
    converged: Callable[[float], bool] | None,
    **config: Any,
) -> Dataflow:
    """The Dataflow of an iteration; ``workset`` None: a bulk iteration. ``config``:
    JobConfig settings (e.g. ``superstep_checkpoint_interval``, ``restart_strategy``)."""
    flow = Dataflow(name, parallelism=parallelism, **config)
    records: list[tuple[Any, int, Any]] = [(k, SOLUTION, v) for k, v in solution.items()]
    records.extend((k, SIDE, s) for k, s in side.items())
    if workset is not None:
        records.extend((k, WORKSET, None) for k in workset)
    entry = flow.source(CollectionSource(records), name=f"{name}:input").key_by(entry_key)
    loop = entry.iterate(name=name)
    graph = flow.graph
    head_name = graph.unique_name(f"{step.name}:superstep", "superstep")
    check_picklable(step, head_name, "step")
    args = {
        "delta": workset is not None,
        "max_supersteps": max_supersteps,
        "converged": converged,
    }
    head = graph.add_step(
        head_name, StepKind.SUPERSTEP, parallelism, fn=step, args=args, key_fn=entry_key
    )
    graph.connect(loop.head, head, Partitioning.FORWARD)
    graph.connect(head, loop.head, Partitioning.HASH, entry_key, EdgeKind.FEEDBACK)
    Stream(flow, head).collect(f"{name}:result")
    try:
        flow.validate()
    except GraphError as err:
        raise GraphError(f"iteration '{name}': {err}") from err
    return flow


@dataclass
class IterationRun:
    """What an iteration run on the streaming runtime returns: the final ``solution``,
    the run's account (``job``: the ``JobResult``) and its supersteps."""

    name: str
    solution: dict[Any, Any]
    job: JobResult

    @property
    def progress(self) -> IterationProgress:
        assert self.job.iteration is not None
        return self.job.iteration

    @property
    def supersteps(self) -> int:
        return self.progress.supersteps

    @property
    def converged(self) -> bool:
        return self.progress.converged

    @property
    def supersteps_started(self) -> int:
        return self.progress.supersteps_started

    @property
    def recoveries(self) -> list[SuperstepRecovery]:
        return self.progress.recoveries

    @property
    def checkpoints(self) -> list[int]:
        """The supersteps a checkpoint was completed at."""
        return [k for k, _ in self.progress.checkpoints]

    @property
    def rerun(self) -> int:
        return self.progress.rerun

    @property
    def seconds(self) -> float:
        return self.job.duration

    @property
    def superstep_seconds(self) -> list[tuple[int, float]]:
        return self.progress.superstep_seconds

    @classmethod
    def of(cls, name: str, job: JobResult) -> IterationRun:
        return cls(name, dict(job.output(f"{name}:result")), job)

    def summary(self) -> str:
        p, job = self.progress, self.job
        lines = [
            f"iteration '{self.name}': {p.supersteps} supersteps "
            f"({'converged' if p.converged else 'stopped at max_supersteps'}), "
            f"{job.duration:.2f} s, {len(job.restarts) + 1} attempt(s), "
            f"{p.supersteps_started} supersteps started in all"
        ]
        if p.checkpoints:
            where = f" under {job.checkpoint_dir}" if job.checkpoint_dir else ""
            lines.append(
                f"  superstep checkpoints completed{where}: {[k for k, _ in p.checkpoints]}"
            )
        for restart, rec in zip(job.restarts, p.recoveries, strict=False):
            lines.append(
                f"  failure during superstep {rec.failed_during} ({restart.reason}): "
                f"resumed after superstep {rec.resumed_from}, {rec.rerun} superstep(s) re-run"
            )
        return "\n".join(lines)

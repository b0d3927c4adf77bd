"""Superstep iterations as Dataflows: what ``BulkIteration`` / ``DeltaIteration`` build
and run on the streaming runtime (``runtime.superstep``, ``jobmanager.supersteps``).

A thin front over ``Dataflow.bulk_iteration`` / ``delta_iteration``, whose inputs and
result are ordinary streams: here the dicts become ``CollectionSource`` inputs and the
result is collected (``<name>:result``: exactly once, committed by the final
checkpoint)::

    <name>:solution-input --tag--+--hash--> <name> (iterate) -> <step>:superstep --> result
    <name>:side-input ----tag----+              ^                        |
                                                +---- feedback, hash ----+
 Everything a streaming
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
from runtime.sources import CollectionSource

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
    ``interval`` supersteps (all three blocking here: the job manager starts the next
    superstep once the checkpoint completed). ``faults``: ``jobmanager.faults`` kills;
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
    """The Dataflow of a ``BulkIteration`` / ``DeltaIteration`` held in dicts: each of
    them a ``CollectionSource`` into ``Dataflow.bulk_iteration`` / ``delta_iteration``,
    the result collected as ``<name>:result``. ``workset`` None: a bulk iteration.
    ``config``: JobConfig settings (e.g. ``superstep_checkpoint_interval``)."""
    flow = Dataflow(name, parallelism=parallelism, **config)

    def source(what: str, items: Iterable[Any]) -> Stream:
        return flow.source(CollectionSource(list(items)), name=f"{name}:{what}-input")

    solution_in = source("solution", solution.items())
    side_in = source("side", side.items()) if side else None
    if workset is None:
        result = flow.bulk_iteration(
            name,
            solution=solution_in,
            side=side_in,
            step=step,
            max_supersteps=max_supersteps,
            converged=converged,
        )
    else:
        result = flow.delta_iteration(
            name,
            solution=solution_in,
            side=side_in,
            workset=source("workset", workset),
            step=step,
            max_supersteps=max_supersteps,
        )
    result.collect(f"{name}:result")
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

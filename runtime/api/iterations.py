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
from typing import TYPE_CHECKING, Any, Literal

from runtime.api.dataflow import Dataflow, Stream
from runtime.errors import GraphError, IterationError
from runtime.sources import CollectionSource

if TYPE_CHECKING:
    from jobmanager.result import IterationProgress, JobResult, SuperstepRecovery

__all__ = [
    "RECOVERY_MODES",
    "BulkIteration",
    "Compensation",
    "DeltaIteration",
    "IterationError",
    "IterationRun",
    "Recovery",
    "RecoveryMode",
    "Step",
    "iteration_dataflow",
    "kills_at_supersteps",
    "l1_below",
    "run_on_streaming",
]

RecoveryMode = Literal["none", "optimistic", "blocking", "tail", "head"]
RECOVERY_MODES: tuple[str, ...] = ("none", "optimistic", "blocking", "tail", "head")


# -- the front: what a user of seed 004's iterations writes ---------------------------------
class Step:
    """One superstep's logic; subclass it. ``name`` appears in every error.

    * ``messages(key, value, side)``: (target key, message) pairs this key sends;
    * ``combine(a, b)``: merges two messages for one target (None: keep a list);
    * ``contribution(key, value, side)``: this key's share of a global sum that travels
      with the superstep's report and reaches ``update`` as ``total`` (PageRank: the rank
      of dangling vertices);
    * ``update(key, value, inbox, side, total)``: the key's new value (``inbox`` is
      None when no message came). In a delta iteration return None for "unchanged":
      only changed keys form the next workset;
    * ``aggregate(key, old, new)``: this key's share of the convergence aggregate (bulk).
    """

    name = "step"
    combine: Callable[[Any, Any], Any] | None = None

    def messages(self, key: Any, value: Any, side: Any) -> Iterable[tuple[Any, Any]]:
        raise NotImplementedError(f"step '{self.name}' does not define messages()")

    def contribution(self, key: Any, value: Any, side: Any) -> float:
        return 0.0

    def update(self, key: Any, value: Any, inbox: Any, side: Any, total: float) -> Any:
        raise NotImplementedError(f"step '{self.name}' does not define update()")

    def aggregate(self, key: Any, old: Any, new: Any) -> float:
        return 0.0


Compensation = Callable[[dict[Any, Any], frozenset[Any], Mapping[Any, Any]], Any]
"""``(surviving solution, lost keys, side input) -> {lost key: value}`` (bulk) or
``-> ({lost key: value}, workset additions)`` (delta)."""


@dataclass(frozen=True)
class Recovery:
    """How an iteration survives a failed task (seed 004).

    ``optimistic``: no checkpoints; the survivors' key groups are rescued and the lost
    ones rebuilt by ``compensation``. ``blocking`` / ``tail`` / ``head``: the state is
    checkpointed at superstep boundaries every ``interval`` supersteps (write then go
    on / written while the new state is produced / written while the next superstep
    runs). ``none``: a failure restarts from the start. ``max_restarts`` bounds the
    attempts; ``rescue_timeout`` bounds the rescue (seconds).

    ``checkpoint_dir``: where the superstep checkpoints go (the job's checkpoint storage:
    a local or shared path, or an fsspec URL such as ``s3://bucket/prefix`` reached with
    ``storage_options``); None: a temp dir of the run. On a cluster every task must
    reach it."""

    mode: RecoveryMode = "none"
    interval: int = 1
    compensation: Compensation | None = None
    checkpoint_dir: str | None = None
    storage_options: Mapping[str, Any] | None = None
    max_restarts: int = 3
    rescue_timeout: float = 2.0
    # optimistic: with more than this share of key groups lost, fall back
    max_lost_fraction: float = 0.5
    # optimistic: also write superstep checkpoints (this variant), to fall back on when
    # the survivors cannot be read; None: fall back to the start
    fallback: Literal["blocking", "tail", "head"] | None = None

    @property
    def checkpoint_mode(self) -> str | None:
        """The superstep checkpoint variant the tasks write, if any."""
        if self.mode in ("blocking", "tail", "head"):
            return self.mode
        return self.fallback if self.mode == "optimistic" else None

    def check(self, where: str) -> None:
        """IterationError naming the problem and the fix."""
        if self.mode not in RECOVERY_MODES:
            raise IterationError(
                f"{where}: recovery mode {self.mode!r} is not one of {RECOVERY_MODES}"
            )
        if self.mode == "optimistic" and self.compensation is None:
            raise IterationError(
                f"{where}: optimistic recovery needs a compensation function (e.g. "
                f"runtime.iterations.library.pagerank_compensation)"
            )
        if self.interval < 1:
            raise IterationError(f"{where}: the checkpoint interval must be at least 1 superstep")


def l1_below(eps: float) -> Callable[[float], bool]:
    """Convergence criterion: the summed aggregate (e.g. L1 of the change) below ``eps``."""
    return _Below(eps)


@dataclass(frozen=True)
class _Below:
    eps: float

    def __call__(self, total: float) -> bool:
        return total < self.eps


@dataclass(frozen=True)
class IterationSpec:
    """What an iteration is, apart from its data."""

    name: str
    delta: bool
    step: Step
    parallelism: int
    max_supersteps: int | None
    converged: Callable[[float], bool] | None


class _Iteration:
    def __init__(
        self,
        name: str,
        delta: bool,
        solution: Mapping[Any, Any],
        workset: Iterable[Any] | None,
        step: Step,
        side: Mapping[Any, Any] | None,
        parallelism: int,
        max_supersteps: int | None,
        converged: Callable[[float], bool] | None,
    ) -> None:
        where = f"iteration '{name}' (step '{step.name}')"
        if parallelism < 1:
            raise IterationError(f"{where}: parallelism must be at least 1, not {parallelism}")
        if max_supersteps is not None and max_supersteps < 1:
            raise IterationError(f"{where}: max_supersteps must be at least 1")
        if not delta and max_supersteps is None and converged is None:
            raise IterationError(
                f"{where} can never end: a bulk iteration needs max_supersteps=, a "
                f"converged= criterion (e.g. l1_below(eps)), or both"
            )
        if delta and converged is not None:
            raise IterationError(
                f"{where}: a delta iteration ends when its workset is empty; drop converged="
            )
        if side is not None and not isinstance(side, Mapping):
            raise IterationError(
                f"{where}: the side input must be a mapping of key to value, not "
                f"{type(side).__name__}; it is partitioned like the iteration state"
            )
        self.spec = IterationSpec(name, delta, step, parallelism, max_supersteps, converged)
        self.solution = dict(solution)
        self.workset = set(self.solution) if workset is None else set(workset)
        unknown = self.workset - self.solution.keys()
        if unknown:
            raise IterationError(
                f"{where}: the workset holds keys the solution set does not have, e.g. "
                f"{sorted(map(repr, unknown))[:3]}; a workset names solution keys"
            )
        self.side = dict(side or {})
        self._flow = self.dataflow()  # the graph checks of a streaming loop, at build time

    def dataflow(self, **config: Any) -> Dataflow:
        """The iteration as a Dataflow with a loop (``config``: JobConfig settings)."""
        s = self.spec
        return iteration_dataflow(
            s.name,
            s.step,
            self.solution,
            self.side,
            self.workset if s.delta else None,
            s.parallelism,
            s.max_supersteps,
            s.converged,
            **config,
        )

    def explain(self) -> str:
        """The iteration's plan (loop head, superstep step, feedback edge), as text."""
        return self._flow.explain()

    def run(
        self,
        recovery: Recovery | None = None,
        kills: Iterable[tuple[int, int]] = (),
        launcher: str | None = None,
        **config: Any,
    ) -> IterationRun:
        """Run to the end on the streaming runtime; ``kills``: ``(task index, superstep)``
        faults to inject (one per attempt, in superstep order); ``launcher``: ``"spark"``
        (a barrier stage), ``"local"`` (task processes without Spark, the test harness)
        or None (the default launcher); ``config``: other JobConfig settings."""
        faults = kills_at_supersteps(self.spec.name, kills)
        return run_on_streaming(self, recovery, faults, launcher, **config)


class BulkIteration(_Iteration):
    """Every key takes part in every superstep; ends after ``max_supersteps`` or when
    ``converged(sum of the step's aggregates)`` holds, whichever comes first."""

    def __init__(
        self,
        name: str,
        initial: Mapping[Any, Any],
        step: Step,
        side: Mapping[Any, Any] | None = None,
        parallelism: int = 2,
        max_supersteps: int | None = None,
        converged: Callable[[float], bool] | None = None,
    ) -> None:
        super().__init__(
            name, False, initial, None, step, side, parallelism, max_supersteps, converged
        )


class DeltaIteration(_Iteration):
    """Only workset keys send; keys whose value changed form the next workset; ends
    when the workset is empty everywhere (or after ``max_supersteps``)."""

    def __init__(
        self,
        name: str,
        solution: Mapping[Any, Any],
        step: Step,
        workset: Iterable[Any] | None = None,
        side: Mapping[Any, Any] | None = None,
        parallelism: int = 2,
        max_supersteps: int | None = None,
    ) -> None:
        super().__init__(
            name, True, solution, workset, step, side, parallelism, max_supersteps, None
        )


# -- the iteration as a Dataflow ------------------------------------------------------------


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
    superstep once the checkpoint completed); ``"optimistic"`` rescues the survivors'
    state and compensates the lost keys (``runtime.config.OptimisticRecovery``), with
    superstep checkpoints to fall back on only when ``fallback`` names a variant.
    ``faults``: ``jobmanager.faults`` kills; ``launcher``: ``"local"`` (the harness) or
    ``"spark"`` (None: the default)."""
    from jobmanager.restart import FixedDelay
    from runtime.config import OptimisticRecovery

    rec = recovery if recovery is not None else Recovery()
    spec = it.spec
    where = f"iteration '{spec.name}' (step '{spec.step.name}')"
    rec.check(where)  # a compensation for optimistic recovery among others
    optimistic = None
    if rec.mode == "optimistic" and rec.compensation is not None:
        optimistic = OptimisticRecovery(rec.compensation, rec.max_lost_fraction, rec.rescue_timeout)
    checkpoints = rec.mode in ("blocking", "tail", "head") or (
        rec.mode == "optimistic" and rec.fallback is not None
    )
    settings: dict[str, Any] = {
        "restart_strategy": FixedDelay(rec.max_restarts, 0.05),
        "superstep_checkpoint_interval": rec.interval if checkpoints else None,
        "optimistic_recovery": optimistic,
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
            when = (
                f"while loading (restored at superstep {rec.failed_during})"
                if rec.loading
                else f"during superstep {rec.failed_during}"
            )
            lost = f", lost subtasks {list(rec.lost)}" if rec.lost else ""
            compensated = f", {rec.lost_keys} key(s) compensated" if rec.lost_keys else ""
            lines.append(
                f"  failure {when} ({restart.reason}): recovered {rec.kind.value}{lost}"
                f"{compensated}; resumed after superstep {rec.resumed_from}, "
                f"{rec.rerun} superstep(s) re-run"
            )
            if rec.note:
                lines.append(f"    note: {rec.note}")
        return "\n".join(lines)

"""The user's view of superstep iterations (seed 004): a bulk iteration over a keyed
data set and a delta iteration (solution set + workset), both with a static side input
partitioned like the iteration state.

    it = BulkIteration("pagerank", initial=ranks, step=PageRankStep(n), side=out_edges,
                       parallelism=4, max_supersteps=100, converged=l1_below(n * 1e-6))
    result = it.run(recovery=Recovery("optimistic", compensation=pagerank_compensation))

A step is an object (``Step``): per superstep every key of the data set (bulk) or of
the workset (delta) sends ``messages`` to other keys; the messages are routed to the
keys' partitions and combined; an in-band marker closes the superstep on every channel;
then every key ``update``s from its inbox. Everything is checked here, at build time,
where it can be: a bulk iteration that cannot end, a side input partitioned another
way, a recovery mode that needs a compensation function it lacks. What only the run can
see (a message to a key the solution set does not have, a compensation that returns
other keys) fails the run with an error naming the step.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgpack

from runtime.errors import GraphError

__all__ = [
    "BulkIteration",
    "Compensation",
    "DeltaIteration",
    "IterationError",
    "IterationSpec",
    "KeyPartitioner",
    "Partitioned",
    "Recovery",
    "Step",
    "l1_below",
]

Key = Hashable
RecoveryMode = Literal["none", "optimistic", "blocking", "tail", "head"]
RECOVERY_MODES: tuple[str, ...] = ("none", "optimistic", "blocking", "tail", "head")


class IterationError(GraphError):
    """An iteration is built or used wrongly (the message names the step and the fix)."""


class Step:
    """One superstep's logic; subclass it. ``name`` appears in every error.

    * ``messages(key, value, side)``: (target key, message) pairs this key sends;
    * ``combine(a, b)``: merges two messages for one target (None: keep a list);
    * ``contribution(key, value, side)``: this key's share of a global sum that travels
      in band with the superstep markers and reaches ``update`` as ``total`` (PageRank:
      the rank of dangling vertices);
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
class KeyPartitioner:
    """Stable hash partitioning (the same in the driver and in every task process)."""

    parallelism: int

    def owner(self, key: Any) -> int:
        if isinstance(key, int):
            return key % self.parallelism
        raw = key.encode() if isinstance(key, str) else msgpack.packb(key)
        return zlib.crc32(raw) % self.parallelism

    def split(self, data: Mapping[Any, Any]) -> list[dict[Any, Any]]:
        parts: list[dict[Any, Any]] = [{} for _ in range(self.parallelism)]
        for k, v in data.items():
            parts[self.owner(k)][k] = v
        return parts


@dataclass(frozen=True)
class Partitioned:
    """A side input already split into ``parts`` by ``partitioner``."""

    parts: tuple[Mapping[Any, Any], ...]
    partitioner: KeyPartitioner


@dataclass(frozen=True)
class Recovery:
    """How an iteration survives a failed task (seed 004).

    ``optimistic``: no checkpoints; the survivors' partitions are rescued and the lost
    ones rebuilt by ``compensation``. ``blocking`` / ``tail`` / ``head``: the state is
    checkpointed at superstep boundaries every ``interval`` supersteps (write then go
    on / written while the new state is produced / written while the next superstep
    runs). ``none``: a failure restarts from the start. ``max_restarts`` bounds the
    attempts; ``rescue_timeout`` bounds the rescue read (seconds).

    ``checkpoint_dir``: where the run keeps its input partitions and superstep
    checkpoints (in a directory of its own under it, kept after the run); the same
    storage as streaming checkpoints: a local or shared path, or an fsspec URL
    (``s3://bucket/prefix``, ``hdfs://...``) reached with ``storage_options``
    (endpoint, credentials). None: a local temp dir, removed after the run. On a
    cluster every task must reach it."""

    mode: RecoveryMode = "none"
    interval: int = 1
    compensation: Compensation | None = None
    checkpoint_dir: str | None = None
    storage_options: Mapping[str, Any] | None = None
    max_restarts: int = 3
    rescue_timeout: float = 2.0
    # optimistic: with more than this share of partitions lost, restart instead
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
    """Everything a task needs (pickled into every task process)."""

    name: str
    delta: bool
    step: Step
    partitioner: KeyPartitioner
    max_supersteps: int | None
    converged: Callable[[float], bool] | None
    recovery: Recovery = field(default_factory=Recovery)

    @property
    def parallelism(self) -> int:
        return self.partitioner.parallelism


class _Iteration:
    def __init__(
        self,
        name: str,
        delta: bool,
        solution: Mapping[Any, Any],
        workset: Iterable[Any] | None,
        step: Step,
        side: Mapping[Any, Any] | Partitioned | None,
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
        partitioner = KeyPartitioner(parallelism)
        self.spec = IterationSpec(name, delta, step, partitioner, max_supersteps, converged)
        self.solution = dict(solution)
        self.workset = set(self.solution) if workset is None else set(workset)
        unknown = self.workset - self.solution.keys()
        if unknown:
            raise IterationError(
                f"{where}: the workset holds keys the solution set does not have, e.g. "
                f"{sorted(map(repr, unknown))[:3]}; a workset names solution keys"
            )
        self.side_parts = self._side(side, partitioner, where)
        from runtime.iterations.loop_plan import iteration_plan

        try:  # the graph checks of a streaming loop, at build time
            self._plan = iteration_plan(self.spec)
        except GraphError as err:
            raise IterationError(f"{where}: {err}") from err
        try:
            pickle.dumps(step)
        except Exception as err:
            raise IterationError(
                f"{where}: the step object cannot be pickled ({err}); define it at module level"
            ) from err

    @staticmethod
    def _side(
        side: Mapping[Any, Any] | Partitioned | None, partitioner: KeyPartitioner, where: str
    ) -> list[dict[Any, Any]]:
        if side is None:
            return [{} for _ in range(partitioner.parallelism)]
        if not isinstance(side, Partitioned):
            return partitioner.split(side)
        if side.partitioner != partitioner or len(side.parts) != partitioner.parallelism:
            raise IterationError(
                f"{where}: the side input is partitioned by {side.partitioner} into "
                f"{len(side.parts)} parts, the iteration state by {partitioner}; pass the "
                f"side input unsplit (a mapping) or split it with the iteration's partitioner"
            )
        for i, part in enumerate(side.parts):
            for key in part:
                if partitioner.owner(key) != i:
                    raise IterationError(
                        f"{where}: side input part {i} holds key {key!r}, which the "
                        f"iteration's {partitioner} puts in part {partitioner.owner(key)}"
                    )
        return [dict(p) for p in side.parts]

    def explain(self) -> str:
        """The iteration as a loop of the streaming plan (loop head, superstep step,
        feedback edge and its back-edge channels), as text."""
        text = self._plan.explain()
        print(text)
        return text

    @property
    def side(self) -> dict[Any, Any]:
        merged: dict[Any, Any] = {}
        for part in self.side_parts:
            merged.update(part)
        return merged

    def run(
        self,
        recovery: Recovery | None = None,
        kills: Iterable[tuple[int, int]] = (),
        launcher: str = "spark",
        say: Callable[[str], None] | None = None,
    ) -> Any:
        """Run to the end; ``kills``: (task index, superstep) faults to inject;
        ``launcher``: ``spark`` (a barrier stage) or ``threads`` (tests, no Spark)."""
        from jobmanager.iterations import IterationDriver

        rec = recovery or Recovery()
        where = f"iteration '{self.spec.name}' (step '{self.spec.step.name}')"
        if rec.mode not in RECOVERY_MODES:
            raise IterationError(
                f"{where}: recovery mode {rec.mode!r} is not one of {RECOVERY_MODES}"
            )
        if rec.mode == "optimistic" and rec.compensation is None:
            raise IterationError(
                f"{where}: optimistic recovery needs a compensation function (e.g. "
                f"runtime.iterations.library.pagerank_compensation)"
            )
        if rec.interval < 1:
            raise IterationError(f"{where}: the checkpoint interval must be at least 1 superstep")
        spec = IterationSpec(**{**self.spec.__dict__, "recovery": rec})
        driver = IterationDriver(spec, self.solution, self.workset, self.side_parts, launcher, say)
        return driver.run(list(kills))


class BulkIteration(_Iteration):
    """Every key takes part in every superstep; ends after ``max_supersteps`` or when
    ``converged(sum of the step's aggregates)`` holds, whichever comes first."""

    def __init__(
        self,
        name: str,
        initial: Mapping[Any, Any],
        step: Step,
        side: Mapping[Any, Any] | Partitioned | None = None,
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
        side: Mapping[Any, Any] | Partitioned | None = None,
        parallelism: int = 2,
        max_supersteps: int | None = None,
    ) -> None:
        super().__init__(
            name, True, solution, workset, step, side, parallelism, max_supersteps, None
        )

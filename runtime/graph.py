"""The logical graph: steps (operators) and the edges between them.

The graph is plain data, separate from its execution: a ``Dataflow`` builds it,
``validate()`` checks it, ``runtime.plan`` turns it into tasks and channels.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from runtime.errors import GraphError, UnpicklableFunctionError


class Partitioning(enum.Enum):
    """How records of an edge are distributed over the consumer's subtasks."""

    FORWARD = "forward"  # subtask i -> subtask i (equal parallelism)
    HASH = "hash"  # by a stable hash of key_fn(record) into key groups
    REBALANCE = "rebalance"  # round robin
    BROADCAST = "broadcast"  # every record to every subtask


class EdgeKind(enum.Enum):
    """A regular edge, or a feedback edge that closes a loop (``Loop.feedback``)."""

    REGULAR = "regular"
    FEEDBACK = "feedback"


class StepKind(enum.Enum):
    SOURCE = "source"
    MAP = "map"
    FLAT_MAP = "flat_map"
    FILTER = "filter"
    UNION = "union"
    ITERATE = "iterate"  # a loop head: the union of the loop's entry and its feedback
    REDUCE = "reduce"
    AGGREGATE = "aggregate"
    PROCESS = "process"
    SINK = "sink"
    ASSIGN_TIMESTAMPS = "assign_timestamps"  # event timestamps and watermarks, at a source
    WINDOW = "window"  # keyed windows (runtime.windows)
    CO_PROCESS = "co_process"  # two keyed streams, shared state and timers (runtime.joins)
    INTERVAL_JOIN = "interval_join"
    WINDOW_JOIN = "window_join"
    SUPERSTEP = "superstep"  # an iteration's loop head logic, chained after its ITERATE

    @property
    def keyed(self) -> bool:
        return self in _KEYED


_KEYED = frozenset(
    {
        StepKind.REDUCE,
        StepKind.AGGREGATE,
        StepKind.PROCESS,
        StepKind.WINDOW,
        StepKind.CO_PROCESS,
        StepKind.INTERVAL_JOIN,
        StepKind.WINDOW_JOIN,
        StepKind.SUPERSTEP,
    }
)


@dataclass(slots=True)
class Edge:
    """A stream from ``source`` into ``target``; ``key_fn`` is set for HASH edges."""

    source: int
    target: int
    partitioning: Partitioning
    key_fn: Callable[..., object] | None = None
    kind: EdgeKind = EdgeKind.REGULAR


@dataclass(slots=True)
class Step:
    """One logical operator. ``fn``/``args`` depend on ``kind`` (see runtime.operators)."""

    id: int
    name: str
    kind: StepKind
    parallelism: int
    fn: Any = None
    args: dict[str, Any] = field(default_factory=dict)
    inputs: list[Edge] = field(default_factory=list)
    outputs: list[Edge] = field(default_factory=list)
    # Keyed steps: the key function of their (hash) input edges.
    key_fn: Callable[..., object] | None = None
    # The name was made up (``aggregate_2``), not given: see runtime.step_ids.
    auto: bool = False
    signature: str = ""  # an auto-named step's position in the graph (runtime.step_ids)

    def describe(self) -> str:
        return f"{self.kind.value} '{self.name}' (parallelism {self.parallelism})"


def check_picklable(obj: object, step_name: str, what: str) -> None:
    """Raise UnpicklableFunctionError if ``obj`` cannot travel to a task process."""
    try:
        cloudpickle.dumps(obj)
    except Exception as err:  # cloudpickle raises many types (TypeError, PicklingError, ...)
        raise UnpicklableFunctionError(
            f"step '{step_name}': its {what} cannot be pickled ({type(err).__name__}: {err}). "
            "Task processes receive functions by cloudpickle: do not capture locks, sockets, "
            "open files or SparkSessions in it; create such resources inside the function."
        ) from err


def check_callable(fn: object, step_name: str, what: str = "function") -> None:
    if not callable(fn):
        raise GraphError(
            f"step '{step_name}': its {what} must be callable, got {type(fn).__name__} {fn!r}."
        )


def check_parallelism(parallelism: object, step_name: str) -> int:
    if not isinstance(parallelism, int) or isinstance(parallelism, bool) or parallelism < 1:
        raise GraphError(
            f"step '{step_name}': parallelism must be a positive int, got {parallelism!r}."
        )
    return parallelism


class LogicalGraph:
    """Steps in creation order. Without loops that is a topological order; a feedback
    edge points back to an older step, so planning uses :meth:`topological_order`."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self._names: set[str] = set()
        self._auto: set[str] = set()  # names made up by unique_name

    def unique_name(self, requested: str | None, default: str) -> str:
        if requested is not None:
            if not isinstance(requested, str) or not requested or "[" in requested:
                raise GraphError(
                    f"step name {requested!r} is invalid: use a non-empty string without '['."
                )
            if requested in self._names:
                raise GraphError(
                    f"step name '{requested}' is used twice; step names must be unique "
                    "(they name tasks, state in checkpoints, and errors)."
                )
            return requested
        name, k = default, 2
        while name in self._names:
            name = f"{default}_{k}"
            k += 1
        self._auto.add(name)
        return name

    def add_step(
        self,
        name: str,
        kind: StepKind,
        parallelism: int,
        fn: Any = None,
        args: dict[str, Any] | None = None,
        key_fn: Callable[..., object] | None = None,
    ) -> Step:
        step = Step(
            id=len(self.steps),
            name=name,
            kind=kind,
            parallelism=parallelism,
            fn=fn,
            args=args or {},
            key_fn=key_fn,
            auto=name in self._auto,
        )
        self._names.add(name)
        self.steps.append(step)
        return step

    def connect(
        self,
        source: Step,
        target: Step,
        partitioning: Partitioning,
        key_fn: Callable[..., object] | None = None,
        kind: EdgeKind = EdgeKind.REGULAR,
    ) -> Edge:
        edge = Edge(source.id, target.id, partitioning, key_fn, kind)
        source.outputs.append(edge)
        target.inputs.append(edge)
        return edge

    def step(self, step_id: int) -> Step:
        return self.steps[step_id]

    def downstream(self, step: Step) -> set[int]:
        """Ids of the steps reachable from ``step`` over regular edges, ``step`` included."""
        seen, todo = {step.id}, [step]
        while todo:
            for edge in todo.pop().outputs:
                if edge.kind is EdgeKind.REGULAR and edge.target not in seen:
                    seen.add(edge.target)
                    todo.append(self.steps[edge.target])
        return seen

    def topological_order(self) -> list[Step]:
        """Every step after the sources of its regular inputs (feedback edges ignored),
        ties in creation order. Regular edges always point from an older step to a newer
        one, so this is the creation order; it is checked here, not assumed."""
        placed: set[int] = set()
        order: list[Step] = []
        for step in self.steps:
            regular = [e.source for e in step.inputs if e.kind is EdgeKind.REGULAR]
            if any(src not in placed for src in regular):
                raise GraphError(
                    f"{step.describe()} has an input that is not built before it; "
                    "close cycles with iterate()/feedback() only."
                )
            placed.add(step.id)
            order.append(step)
        return order

    def feedback_edge(self, head: Step) -> Edge | None:
        return next((e for e in head.inputs if e.kind is EdgeKind.FEEDBACK), None)

    def validate(self) -> None:
        """Check the whole graph; raise GraphError naming the first bad step."""
        if not any(s.kind is StepKind.SOURCE for s in self.steps):
            raise GraphError(
                "the dataflow has no source: add one with flow.source(...) "
                "(e.g. GeneratorSource, TextFileSource, CollectionSource)."
            )
        if not any(s.kind is StepKind.SINK for s in self.steps):
            raise GraphError(
                "the dataflow has no sink: end a stream with .sink(...), .collect() or .print()."
            )
        for step in self.steps:
            if step.kind is not StepKind.SINK and not step.outputs:
                raise GraphError(
                    f"stream of {step.describe()} is never consumed (a dangling stream): "
                    "end it with .sink(...)/.collect()/.print(), or remove the step."
                )
            if step.kind is StepKind.ITERATE and self.feedback_edge(step) is None:
                raise GraphError(
                    f"loop '{step.name}' is never closed: call loop.feedback(stream) with a "
                    f"stream built from loop.stream (the records to send around again)."
                )
            for edge in step.inputs:
                src = self.steps[edge.source]
                if (
                    edge.kind is EdgeKind.FEEDBACK
                    and edge.partitioning is Partitioning.FORWARD
                    and src.parallelism != step.parallelism
                ):
                    raise GraphError(
                        f"feedback edge of loop '{step.name}' from '{src.name}': a forward "
                        f"feedback edge needs equal parallelism, but '{src.name}' has "
                        f"{src.parallelism} and the loop {step.parallelism}. Call "
                        f".rebalance() or .key_by(...) on the stream passed to feedback(), "
                        f"or give both the same parallelism."
                    )
                if (
                    edge.partitioning is Partitioning.FORWARD
                    and src.parallelism != step.parallelism
                ):
                    raise GraphError(
                        f"forward edge from '{src.name}' (parallelism {src.parallelism}) to "
                        f"'{step.name}' (parallelism {step.parallelism}): a forward edge needs "
                        f"equal parallelism. Call .rebalance() (or .key_by()/.broadcast()) "
                        f"before '{step.name}', or give both the same parallelism."
                    )
                if edge.partitioning is Partitioning.HASH and edge.key_fn is None:
                    raise GraphError(f"hash edge into '{step.name}' has no key function.")
            if step.kind is StepKind.SUPERSTEP:
                self._check_superstep(step)
            elif step.kind.keyed and any(
                e.partitioning is not Partitioning.HASH for e in step.inputs
            ):
                raise GraphError(
                    f"keyed step '{step.name}' must follow .key_by(...) on every input."
                )

    def _check_superstep(self, step: Step) -> None:
        """An iteration's superstep step (``runtime.superstep``) holds its keys' state in
        key groups and routes its output itself: it follows its loop head (an ITERATE
        whose entry and feedback are both hashed by key) on a forward edge, closes that
        loop with a hashed feedback edge, and has one more output, the result."""
        where = f"superstep step '{step.name}'"
        head = self.steps[step.inputs[0].source] if len(step.inputs) == 1 else None
        if (
            head is None
            or head.kind is not StepKind.ITERATE
            or (step.inputs[0].partitioning is not Partitioning.FORWARD)
        ):
            raise GraphError(f"{where} must directly follow its loop's iterate step.")
        if any(e.partitioning is not Partitioning.HASH for e in head.inputs):
            raise GraphError(
                f"{where}: the entry and the feedback of loop '{head.name}' must be hashed "
                "by key (key_by), so that every key's records meet its state."
            )
        feedback = [e for e in step.outputs if e.kind is EdgeKind.FEEDBACK and e.target == head.id]
        if len(feedback) != 1 or len(step.outputs) != 2:
            raise GraphError(
                f"{where} needs exactly two outputs: the feedback into loop '{head.name}' "
                f"and the result stream; it has {len(step.outputs)}."
            )

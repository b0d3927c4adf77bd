"""Event time in the logical graph: where timestamps are assigned, how steps read them.

A stream *has timestamps* when an ``assign_timestamps`` step is upstream of it: that
step (fused into its source's chain) generates the watermarks. A downstream event-time
step (keyed ``process`` with timers, windows, joins) reads a record's timestamp with a
**timestamp function**: the assigner's ``ts_fn`` where records keep their shape (filter,
key_by, rebalance, union of streams with the same function), or the step's own
``timestamp=`` argument after a map changed the records. Records carry no timestamp
field on the wire: jobs without event time pay nothing.

**Loops**: event-time steps inside a loop are refused at build time (a record that goes
around again has no defined event time relative to the watermark, which cannot wait for
records still in the loop); the watermark passes through a loop head as through a
union of its entry (the back-edge does not hold it back).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.errors import GraphError
from runtime.graph import EdgeKind, LogicalGraph, Partitioning, Step, StepKind

TimestampFn = Callable[[Any], Any]


class TimestampError(GraphError):
    """A timestamp function returned something that is not a number (at run time)."""

    @classmethod
    def of(cls, step: str, record: Any, value: Any) -> TimestampError:
        return cls(
            f"step '{step}': the timestamp function returned {value!r} "
            f"({type(value).__name__}) for record {record!r}; it must return an int or a "
            "float (in the job's event-time unit, e.g. epoch milliseconds)."
        )


_SHAPE_KEEPING = (StepKind.FILTER, StepKind.UNION, StepKind.ITERATE)


def check_assigner_args(
    step_name: str, max_delay: Any, idle_timeout: Any, max_drift: Any = None
) -> None:
    if (
        not isinstance(max_delay, int | float)
        or isinstance(max_delay, bool)
        or not max_delay >= 0
        or max_delay == float("inf")
    ):
        raise GraphError(
            f"step '{step_name}': max_delay must be a number >= 0 (how far out of order "
            f"timestamps may arrive, in the timestamps' unit), got {max_delay!r}."
        )
    if idle_timeout is not None and (
        not isinstance(idle_timeout, int | float)
        or isinstance(idle_timeout, bool)
        or not idle_timeout > 0
    ):
        raise GraphError(
            f"step '{step_name}': idle_timeout must be a number of seconds > 0 or None, "
            f"got {idle_timeout!r}."
        )
    if max_drift is not None and (
        not isinstance(max_drift, int | float)
        or isinstance(max_drift, bool)
        or not 0 < max_drift < float("inf")
    ):
        raise GraphError(
            f"step '{step_name}': max_drift must be a number > 0 (how far, in the "
            f"timestamps' unit, a source subtask's watermark may run ahead of the slowest "
            f"aligned one before it pauses) or None (no alignment), got {max_drift!r}."
        )


def check_assigner_position(graph: LogicalGraph, step: Step) -> None:
    """An assigner must be fused right after a source (forward, same parallelism)."""
    edge = step.inputs[0]
    upstream = graph.step(edge.source)
    if upstream.kind is not StepKind.SOURCE or edge.partitioning is not Partitioning.FORWARD:
        raise GraphError(
            f"step '{step.name}': assign_timestamps(...) must follow a source directly "
            f"(it follows {upstream.describe()}); call it on the stream flow.source(...) "
            "returns, so watermarks are generated per source subtask and split."
        )


def timestamp_fn_of(graph: LogicalGraph, step: Step) -> TimestampFn | None:
    """The timestamp function of the records ``step`` emits, or None if unknown."""
    seen: set[int] = set()
    while step.id not in seen:
        seen.add(step.id)
        if step.kind is StepKind.ASSIGN_TIMESTAMPS:
            fn: TimestampFn = step.fn
            return fn
        if step.kind not in _SHAPE_KEEPING:
            return step.args.get("output_timestamp_fn")
        regular = [e for e in step.inputs if e.kind is EdgeKind.REGULAR]
        fns = {id(f): f for f in (timestamp_fn_of(graph, graph.step(e.source)) for e in regular)}
        if len(fns) != 1:
            return None
        return next(iter(fns.values()))
    return None


def has_watermarks(graph: LogicalGraph, step: Step) -> bool:
    """Whether an ``assign_timestamps`` step is upstream of ``step`` on every input."""
    if step.kind is StepKind.ASSIGN_TIMESTAMPS:
        return True
    regular = [e for e in step.inputs if e.kind is EdgeKind.REGULAR]
    return bool(regular) and all(has_watermarks(graph, graph.step(e.source)) for e in regular)


def in_loop(graph: LogicalGraph, step: Step) -> Step | None:
    """The loop head whose body holds ``step``, if any."""
    for head in graph.steps:
        if head.kind is StepKind.ITERATE and graph.feedback_edge(head) is not None:
            feedback = graph.feedback_edge(head)
            assert feedback is not None
            body = graph.downstream(head)
            if step.id in body and step.id != head.id:
                # the body is what reaches the feedback edge's source
                back = {s for s in body if feedback.source in graph.downstream(graph.step(s))}
                if step.id in back:
                    return head
    return None


def check_event_time(graph: LogicalGraph) -> None:
    """Build-time checks of every event-time step (GraphError naming the step)."""
    for step in graph.steps:
        if step.kind is StepKind.ASSIGN_TIMESTAMPS:
            check_assigner_position(graph, step)
        wanted = step.args.get("event_time")
        if not wanted:
            continue
        if "timestamp_fns" in step.args:  # two sides, each with its own timestamps
            _check_sides(graph, step, optional=wanted == "optional")
            continue
        if wanted == "optional":  # e.g. process with ctx: timestamps where there are any
            if has_watermarks(graph, step) and step.args.get("timestamp_fn") is None:
                found = {timestamp_fn_of(graph, graph.step(e.source)) for e in step.inputs}
                if len(found) == 1:
                    step.args["timestamp_fn"] = found.pop()
            continue
        head = in_loop(graph, step)
        if head is not None:
            raise GraphError(
                f"step '{step.name}' uses event time inside loop '{head.name}': records that "
                "go around a loop have no event time the watermark can wait for. Move the "
                "event-time step after the loop (records leaving it), or use processing time."
            )
        if not has_watermarks(graph, step):
            raise GraphError(
                f"step '{step.name}' uses event time, but its input has no timestamps: call "
                ".assign_timestamps(ts_fn, max_delay=...) on the source's stream before it."
            )
        if step.args.get("timestamp_fn") is None:
            upstream = [graph.step(e.source) for e in step.inputs]
            fns = {id(f): f for f in (timestamp_fn_of(graph, u) for u in upstream) if f}
            if len(fns) != 1 or any(timestamp_fn_of(graph, u) is None for u in upstream):
                raise GraphError(
                    f"step '{step.name}' uses event time, but the records reaching it were "
                    "reshaped after assign_timestamps (by a map/flat_map/...): pass "
                    f"timestamp=fn to '{step.name}' to say where their timestamp is."
                )
            step.args["timestamp_fn"] = next(iter(fns.values()))


def _check_sides(graph: LogicalGraph, step: Step, optional: bool) -> None:
    """A join's timestamp function per side: given, or derived from its upstream."""
    head = in_loop(graph, step)
    if head is not None and not optional:
        raise GraphError(
            f"step '{step.name}' uses event time inside loop '{head.name}'; move it after the loop."
        )
    fns: list[Any] = step.args["timestamp_fns"]
    for side, edge in enumerate(step.inputs[:2]):
        upstream = graph.step(edge.source)
        if not has_watermarks(graph, upstream):
            if optional:
                continue
            raise GraphError(
                f"step '{step.name}' uses event time, but its {('left', 'right')[side]} input "
                f"'{upstream.name}' has no timestamps: call .assign_timestamps(ts_fn, "
                "max_delay=...) on its source's stream."
            )
        if fns[side] is None:
            fns[side] = timestamp_fn_of(graph, upstream)
        if fns[side] is None and not optional:
            arg = ("left_timestamp", "right_timestamp")[side]
            raise GraphError(
                f"step '{step.name}': the records of its {('left', 'right')[side]} input "
                f"'{upstream.name}' were reshaped after assign_timestamps; pass {arg}=fn."
            )

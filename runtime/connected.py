"""The user API of two keyed streams in one step: ``left.connect(right)``.

    orders.key_by(oid).connect(payments.key_by(oid)).interval_join(0, 600_000, name="paid")

Both inputs must be keyed (``key_by``) and distinct steps; each keeps its own key
function (equal key values meet in one subtask) and its own timestamp function
(derived from its ``assign_timestamps``, or ``left_timestamp``/``right_timestamp``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from runtime.errors import GraphError
from runtime.graph import Partitioning, StepKind, check_callable, check_parallelism, check_picklable
from runtime.keyed_process import process_args
from runtime.window_kinds import WindowKind

if TYPE_CHECKING:
    from runtime.dataflow import KeyedStream, Stream

TimestampFn = Callable[[Any], Any] | None


class ConnectedStreams:
    """A left and a right keyed stream; finish with process, interval_join or window_join."""

    def __init__(self, left: KeyedStream, right: Any) -> None:
        from runtime.dataflow import KeyedStream

        if not isinstance(right, KeyedStream):
            raise GraphError(
                f"connect after '{left.step.name}': a join of unkeyed streams; call "
                f".key_by(...) on both streams before connect (got {type(right).__name__})."
            )
        if right.flow is not left.flow:
            raise GraphError(f"connect: stream '{right.step.name}' belongs to another Dataflow.")
        if right.step is left.step:
            raise GraphError(
                f"connect: both sides come from step '{left.step.name}'; the step could not "
                "tell its sides apart. Put a map on one side first."
            )
        self.left, self.right = left, right

    def _build(
        self,
        kind: StepKind,
        fn: Any,
        name: str | None,
        parallelism: int | None,
        args: dict[str, Any],
        stamps: tuple[TimestampFn, TimestampFn] = (None, None),
    ) -> Stream:
        from runtime.dataflow import Stream

        left, right, graph = self.left, self.right, self.left.flow.graph
        step_name = graph.unique_name(name, kind.value)
        par = (
            check_parallelism(parallelism, step_name)
            if parallelism is not None
            else left.step.parallelism
        )
        for stamp in stamps:
            if stamp is not None:
                check_callable(stamp, step_name, "timestamp function")
        if fn is not None:
            check_picklable(fn, step_name, "function")
        args = {**args, "key_fns": [left.key_fn, right.key_fn], "timestamp_fns": list(stamps)}
        step = graph.add_step(step_name, kind, par, fn=fn, args=args, key_fn=left.key_fn)
        graph.connect(left.step, step, Partitioning.HASH, left.key_fn)
        graph.connect(right.step, step, Partitioning.HASH, right.key_fn)
        return Stream(left.flow, step)

    def process(
        self,
        fn: Callable[..., Iterable[Any] | None],
        name: str | None = None,
        on_timer: Callable[..., Iterable[Any] | None] | None = None,
        parallelism: int | None = None,
    ) -> Stream:
        """``fn(key, record, side, state, ctx)`` (side 0 = left, 1 = right), timers and
        ``on_timer(key, ts, state, ctx)`` as in keyed ``process``; state is shared."""
        label = name or "co_process"
        check_callable(fn, label)
        args = process_args(lambda k, r, s, c: None, label, on_timer, None)
        args["with_ctx"] = True
        return self._build(StepKind.CO_PROCESS, fn, name, parallelism, args)

    def interval_join(
        self,
        lower: float,
        upper: float,
        name: str | None = None,
        left_timestamp: TimestampFn = None,
        right_timestamp: TimestampFn = None,
        parallelism: int | None = None,
    ) -> Stream:
        """``(key, left, right)`` for each pair with ``left.ts + lower <= right.ts <=
        left.ts + upper``; state is freed as the watermark passes."""
        label = name or "interval_join"
        for what, v in (("lower", lower), ("upper", upper)):
            if not isinstance(v, int | float) or isinstance(v, bool) or math_bad(v):
                raise GraphError(
                    f"step '{label}': {what} bound must be a finite number, got {v!r}."
                )
        if lower > upper:
            raise GraphError(
                f"step '{label}': lower bound {lower} is above upper bound {upper}; no pair "
                "could ever match."
            )
        args = {"lower": lower, "upper": upper, "event_time": True}
        stamps = (left_timestamp, right_timestamp)
        return self._build(StepKind.INTERVAL_JOIN, None, name, parallelism, args, stamps)

    def window_join(
        self,
        kind: WindowKind,
        name: str | None = None,
        left_timestamp: TimestampFn = None,
        right_timestamp: TimestampFn = None,
        parallelism: int | None = None,
    ) -> Stream:
        """``(key, start, end, left, right)`` for each pair in the same event-time window."""
        label = name or "window_join"
        if not isinstance(kind, WindowKind) or kind.merging or not kind.event_time:
            raise GraphError(
                f"step '{label}': window_join needs a Tumbling or Sliding window, got {kind!r}."
            )
        kind.check(label)
        args = {"kind": kind, "event_time": True}
        stamps = (left_timestamp, right_timestamp)
        return self._build(StepKind.WINDOW_JOIN, None, name, parallelism, args, stamps)


def math_bad(v: float) -> bool:
    return v != v or v in (float("inf"), float("-inf"))

"""The user API of windows: ``keyed.window(kind, ...)`` then an aggregation.

    w = clicks.key_by(user).window(Session(gap=30_000), allowed_lateness=10_000,
                                   late_output="late_clicks", name="sessions")
    per_session = w.aggregate(0, lambda n, _c: n + 1, merge=lambda a, b: a + b)
    per_session.sink(...)          # (user, start, end, count)
    w.late.sink(...)               # the records later than the allowed lateness

A window step with a late output emits tagged records; two chained flat-map steps
split them into the main stream and the named late stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from runtime.errors import GraphError
from runtime.graph import StepKind, check_callable
from runtime.window_kinds import WindowKind
from runtime.windows import LATE, MAIN

if TYPE_CHECKING:
    from runtime.dataflow import KeyedStream, Stream


def _main(record: Any) -> Iterable[Any]:
    return (record[1],) if record[0] == MAIN else ()


def _late(record: Any) -> Iterable[Any]:
    return (record[1],) if record[0] == LATE else ()


def _window_end(record: Any) -> Any:
    return record[2]


class WindowedStream:
    """A keyed stream cut into windows; finish it with ``aggregate``, ``reduce``,
    ``count`` or ``process`` (each returns a stream of ``(key, start, end, value)``)."""

    def __init__(
        self,
        keyed: KeyedStream,
        kind: WindowKind,
        name: str | None,
        allowed_lateness: float,
        late_output: str | None,
        timestamp: Callable[[Any], Any] | None,
        parallelism: int | None,
    ) -> None:
        label = name or "window"
        if not isinstance(kind, WindowKind):
            raise GraphError(
                f"step '{label}': window(...) needs a window kind (Tumbling, Sliding, Session, "
                f"TumblingProcessingTime from runtime.window_kinds), got {kind!r}."
            )
        kind.check(label)
        if (
            not isinstance(allowed_lateness, int | float)
            or isinstance(allowed_lateness, bool)
            or not 0 <= allowed_lateness < float("inf")
        ):
            raise GraphError(
                f"step '{label}': allowed_lateness must be a number >= 0, got {allowed_lateness!r}."
            )
        if not kind.event_time and (allowed_lateness or timestamp is not None):
            raise GraphError(
                f"step '{label}': a processing-time window has no allowed lateness and no "
                "timestamps; use an event-time window kind (Tumbling, Sliding, Session)."
            )
        if timestamp is not None:
            check_callable(timestamp, label, "timestamp function")
        self.keyed, self.kind, self.name = keyed, kind, name
        self.lateness, self.late_output, self.timestamp = allowed_lateness, late_output, timestamp
        self.parallelism = parallelism
        self._late: Stream | None = None

    @property
    def late(self) -> Stream:
        """The records later than the allowed lateness (needs ``late_output=`` and an
        aggregation first)."""
        if self._late is None:
            raise GraphError(
                f"window '{self.name or 'window'}': no late stream; pass late_output='name' to "
                "window(...) and call aggregate/reduce/count/process before using .late."
            )
        return self._late

    def _build(self, mode: str, fn: Any, args: dict[str, Any]) -> Stream:
        from runtime.dataflow import Stream

        label = self.name or "window"
        check_callable(fn, label, f"{mode} function")
        if self.kind.merging and mode == "aggregate" and args.get("merge") is None:
            raise GraphError(
                f"step '{label}': session windows merge, so aggregate(...) needs "
                "merge=fn(acc_a, acc_b) combining two accumulators (or use reduce/count)."
            )
        args = {
            **args,
            "kind": self.kind,
            "mode": mode,
            "allowed_lateness": self.lateness,
            "late_output": self.late_output,
            "timestamp_fn": self.timestamp,
            "event_time": self.kind.event_time or None,
            "output_timestamp_fn": _window_end,
        }
        stream = self.keyed._keyed(StepKind.WINDOW, fn, self.name, self.parallelism, args)
        if self.late_output is None:
            return stream
        main = stream.flat_map(_main, name=f"{stream.step.name}.main")
        main.step.args["output_timestamp_fn"] = _window_end
        self._late = stream.flat_map(_late, name=f"{self.late_output}.split")
        return Stream(main.flow, main.step)

    def aggregate(
        self,
        initial: Any,
        add: Callable[[Any, Any], Any],
        merge: Callable[[Any, Any], Any] | None = None,
    ) -> Stream:
        """Incremental: ``acc = add(acc, record)`` from ``initial`` (a value, or a factory
        for mutable accumulators); session windows also need ``merge(acc_a, acc_b)``."""
        return self._build("aggregate", add, {"initial": initial, "merge": merge})

    def reduce(self, fn: Callable[[Any, Any], Any]) -> Stream:
        """Incremental: ``fn(a, b)`` over the window's records (merging sessions too)."""
        return self._build("reduce", fn, {"merge": fn})

    def count(self) -> Stream:
        """The number of records per window."""
        return self._build("aggregate", _add_one, {"initial": 0, "merge": _plus})

    def process(self, fn: Callable[[Any, Any, Any, list[Any]], Any]) -> Stream:
        """Full window: ``fn(key, start, end, records)`` once the window fires (the
        window's records are kept until then)."""
        return self._build("process", fn, {})


def _add_one(n: int, _record: Any) -> int:
    return n + 1


def _plus(a: Any, b: Any) -> Any:
    return a + b

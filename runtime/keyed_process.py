"""Keyed ``process``: a user function per record with the key's state, and timers.

``fn(key, record, state)`` — or, when the function takes a fourth parameter,
``fn(key, record, state, ctx)`` with a `ProcessContext`: the record's event timestamp
(``ctx.timestamp``, None on a stream without timestamps), the current watermark, and
event-time / processing-time timers of the key. A timer calls
``on_timer(key, timestamp, state, ctx)`` once, with the key's state; what it returns
is emitted. Timers are checkpointed keyed state (``statebackend.timers``): they
rescale with their key and fire exactly once across restores.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from runtime.errors import GraphError
from runtime.graph import Step, StepKind
from runtime.operators import KeyedOperator, OperatorContext, register
from runtime.timestamps import TimestampError
from statebackend.keyed import KeyedStateBackend
from statebackend.timers import EVENT_TIME, PROCESSING_TIME, TimerService


class KeyedStateHandle:
    """The ``state`` argument of a keyed ``process`` function, scoped to the current key."""

    __slots__ = ("_backend", "_key", "_values")

    def __init__(self, backend: KeyedStateBackend) -> None:
        self._backend = backend
        self._values = backend.value_state()
        self._key: Any = None

    @property
    def value(self) -> Any:
        return self._values.get(self._key)

    @value.setter
    def value(self, v: Any) -> None:
        if v is None:
            self._values.pop(self._key, None)
        else:
            self._values[self._key] = v

    def list(self, name: str) -> list[Any]:
        states = self._backend.list_state(name)
        lst = states.get(self._key)
        if lst is None:
            lst = states[self._key] = []
        return lst

    def map(self, name: str) -> dict[Any, Any]:
        states = self._backend.map_state(name)
        m = states.get(self._key)
        if m is None:
            m = states[self._key] = {}
        return m

    def clear(self) -> None:
        """Drop every user state of the current key (its timers stay)."""
        for kind in ("value", "list", "map"):
            for name, states in self._backend.named_states(kind):
                if not name.startswith("__"):
                    states.pop(self._key, None)


class ProcessContext:
    """The ``ctx`` of a keyed process function and of ``on_timer``, scoped to a key."""

    __slots__ = ("_op", "key", "time_domain", "timestamp")

    def __init__(self, op: ProcessOperator) -> None:
        self._op = op
        self.key: Any = None
        self.timestamp: float | None = None
        """The record's event timestamp (in ``on_timer``: the timer's time)."""
        self.time_domain: str | None = None
        """In ``on_timer``: "event" or "processing"; None while processing a record."""

    @property
    def watermark(self) -> float:
        return self._op.watermark

    def current_processing_time(self) -> float:
        return time.time()

    def register_event_time_timer(self, timestamp: float) -> None:
        """Call ``on_timer`` once the watermark reaches ``timestamp``."""
        self._op.timers.event.register(self.key, timestamp, None)

    def register_processing_time_timer(self, timestamp: float) -> None:
        """Call ``on_timer`` once the wall clock (``time.time()``) reaches ``timestamp``."""
        self._op.timers.processing.register(self.key, timestamp, None)

    def delete_event_time_timer(self, timestamp: float) -> None:
        self._op.timers.event.delete(self.key, timestamp, None)

    def delete_processing_time_timer(self, timestamp: float) -> None:
        self._op.timers.processing.delete(self.key, timestamp, None)


IGNORE_CHANGES = frozenset().__contains__  # changes not tracked


@register(StepKind.PROCESS)
class ProcessOperator(KeyedOperator):
    uses_event_time = True
    tracks_changes = True  # every key whose state it may touch: each record's, each timer's

    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        assert self.keyed_state is not None
        self.handle = KeyedStateHandle(self.keyed_state)
        self.timers: TimerService[None] = TimerService(self.keyed_state)  # no namespaces
        self.ctx = ProcessContext(self)
        self.on_timer: Callable[..., Iterable[object] | None] | None = step.args.get("on_timer")
        # the user's timestamp: a number, checked per record (TimestampError otherwise)
        self.ts_fn: Callable[[object], float] | None = step.args.get("timestamp_fn")
        self.wants_processing_time = self.on_timer is not None
        self.with_ctx = bool(step.args.get("with_ctx"))
        self.drop_timers = ctx.debug_drop_event_time

    def _touch(self) -> Callable[[object], object]:
        assert self.keyed_state is not None
        changed = self.keyed_state.changed
        return IGNORE_CHANGES if changed is None else changed.add

    def process(self, batch: list[object], side: int = 0) -> list[object]:
        key_fn, fn, handle = self.key_fn, self.step.fn, self.handle
        out: list[object] = []
        extend = out.extend
        touch = self._touch()
        if not self.with_ctx:
            for r in batch:
                k = key_fn(r)
                touch(k)
                handle._key = k
                emitted = fn(k, r, handle)
                if emitted is not None:
                    extend(emitted)
            return out
        ctx, ts_fn = self.ctx, self.ts_fn
        for r in batch:
            k = key_fn(r)
            touch(k)
            handle._key = ctx.key = k
            if ts_fn is not None:
                ts = ts_fn(r)
                if ts.__class__ is not int and ts.__class__ is not float:
                    raise TimestampError.of(self.name, r, ts)
                ctx.timestamp = ts
            emitted = fn(k, r, handle, ctx)
            if emitted is not None:
                extend(emitted)
        return out

    def _fire(self, queue_due: Iterable[tuple[object, float, None]], domain: str) -> list[object]:
        on_timer, handle, ctx = self.on_timer, self.handle, self.ctx
        out: list[object] = []
        if on_timer is None:
            return out
        ctx.time_domain = domain
        touch = self._touch()
        for key, ts, _namespace in queue_due:
            touch(key)
            handle._key = ctx.key = key
            ctx.timestamp = ts
            emitted = on_timer(key, ts, handle, ctx)
            if emitted is not None:
                out.extend(emitted)
        ctx.time_domain = None
        return out

    def on_watermark(self, watermark: float) -> list[object]:
        self.watermark = watermark
        return self._fire(self.timers.event.due(watermark), EVENT_TIME)

    def on_processing_time(self, now: float) -> list[object]:
        queue = self.timers.processing
        nxt = queue.next_time()
        if nxt is None or nxt > now:
            return []
        return self._fire(queue.due(now), PROCESSING_TIME)

    def snapshot_state(self, checkpoint_id: int) -> object:
        if not self.with_ctx:
            return None
        return {"watermark": self.watermark}

    def restore_state(self, state: Any) -> None:
        if state is not None and not self.drop_timers:
            self.watermark = max(self.watermark, float(state["watermark"]))

    def after_keyed_restore(self) -> None:
        """The keyed state (with the timers) was restored: re-index the timers."""
        if self.drop_timers:
            self.timers.clear()
        self.timers.rebuild()


def process_args(
    fn: Callable[..., Any],
    step_name: str,
    on_timer: Callable[..., Any] | None,
    timestamp: Callable[[Any], Any] | None,
) -> dict[str, Any]:
    """The step args of a keyed ``process``, checked (GraphError naming the step)."""
    with_ctx = uses_context(fn, step_name)
    if on_timer is not None:
        if not callable(on_timer):
            raise GraphError(f"step '{step_name}': on_timer must be callable, got {on_timer!r}.")
        if not with_ctx:
            raise GraphError(
                f"step '{step_name}': on_timer needs a process function that takes ctx "
                "(key, record, state, ctx) to register timers with."
            )
    if timestamp is not None and not callable(timestamp):
        raise GraphError(f"step '{step_name}': timestamp must be callable, got {timestamp!r}.")
    # With ctx, the step reads event time where the stream has it (optional: processing-
    # time timers need none).
    return {
        "with_ctx": with_ctx,
        "on_timer": on_timer,
        "timestamp_fn": timestamp,
        "event_time": "optional" if with_ctx else None,
    }


def uses_context(fn: Callable[..., Any], step_name: str) -> bool:
    """Whether a process function takes ``ctx`` (four positional parameters)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return True
    if len(positional) not in (3, 4):
        raise GraphError(
            f"step '{step_name}': a process function takes (key, record, state) or "
            f"(key, record, state, ctx), got {len(positional)} parameters."
        )
    return len(positional) == 4

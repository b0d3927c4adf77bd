"""Two keyed streams in one step: co-process, interval join and window join.

``left.connect(right)`` (both keyed; equal keys meet in one subtask: each side is hash
partitioned by its own key function into the same key groups) gives one step whose
records arrive tagged with their **side** (0 = left, 1 = right: the input side of the
task, ``runtime.input_side``). The keyed state and the timers are shared by both sides.

* `CoProcessOperator` — ``fn(key, record, side, state, ctx)`` and ``on_timer`` as in
  ``runtime.keyed_process``;
* `IntervalJoinOperator` — emits ``(key, left, right)`` for every pair with
  ``left.ts + lower <= right.ts <= left.ts + upper``; each record is buffered until the
  watermark says no partner can come any more (left: ``ts + upper``, right:
  ``ts - lower``), then freed by a timer: a long-running join stays bounded;
* `WindowJoinOperator` — emits ``(key, start, end, left, right)`` for every pair in the
  same window once the watermark passes its end, then frees the window.

Records are joined in arrival order; a record later than the watermark still joins with
what is buffered (it is not buffered itself when its partners' time has passed).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from runtime.graph import Step, StepKind
from runtime.keyed_process import IGNORE_CHANGES, ProcessOperator
from runtime.operators import KeyedOperator, OperatorContext, register
from runtime.timestamps import TimestampError
from runtime.window_kinds import WindowKind
from statebackend.timers import NamespacedState, TimerService

LEFT, RIGHT = 0, 1
N = TypeVar("N")  # a join's timer namespace

KeyFn = Callable[[object], object]
StampFn = Callable[[object], float]  # the user's timestamp: a number, checked per record


def _sided_fns(step: Step) -> tuple[list[KeyFn], list[StampFn | None]]:
    keys: list[KeyFn] = step.args["key_fns"]
    stamps: list[StampFn | None] = step.args.get("timestamp_fns") or [None, None]
    return keys, stamps


def _timestamp(step: str, fn: StampFn, record: object) -> float:
    ts = fn(record)
    if ts.__class__ is not int and ts.__class__ is not float:
        raise TimestampError.of(step, record, ts)
    return ts


@register(StepKind.CO_PROCESS)
class CoProcessOperator(ProcessOperator):
    """``fn(key, record, side, state, ctx)``; timers and state shared by both sides."""

    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        self.key_fns, self.ts_fns = _sided_fns(step)

    def process(self, batch: list[object], side: int = 0) -> list[object]:
        key_fn, ts_fn = self.key_fns[side], self.ts_fns[side]
        fn, handle, ctx, name = self.step.fn, self.handle, self.ctx, self.name
        out: list[object] = []
        touch = self._touch()
        for r in batch:
            k = key_fn(r)
            touch(k)
            handle._key = ctx.key = k
            if ts_fn is not None:
                ctx.timestamp = _timestamp(name, ts_fn, r)
            emitted = fn(k, r, side, handle, ctx)
            if emitted is not None:
                out.extend(emitted)
        return out


class _JoinBase(KeyedOperator, Generic[N]):
    uses_event_time = True
    tracks_changes = True  # buffers and timers mark their keys; in-place appends below

    def _touch(self) -> Callable[[object], object]:
        assert self.keyed_state is not None
        changed = self.keyed_state.changed
        return IGNORE_CHANGES if changed is None else changed.add

    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        assert self.keyed_state is not None
        self.key_fns, stamps = _sided_fns(step)
        self.ts_fns = [fn for fn in stamps if fn is not None]
        if len(self.ts_fns) != 2:  # check_event_time derives them before a plan exists
            raise ValueError(f"join step '{step.name}' lacks the timestamp function of a side")
        self.timers: TimerService[N] = TimerService(self.keyed_state)
        self._drop = ctx.debug_drop_event_time

    def snapshot_state(self, checkpoint_id: int) -> object:
        return {"watermark": self.watermark}

    def restore_state(self, state: Any) -> None:
        if state is not None and not self._drop:
            self.watermark = max(self.watermark, float(state["watermark"]))

    def after_keyed_restore(self) -> None:
        if self._drop:
            self.timers.clear()
        self.timers.rebuild()


@register(StepKind.INTERVAL_JOIN)
class IntervalJoinOperator(_JoinBase[tuple[int, float]]):  # timers: (side, timestamp)
    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        assert self.keyed_state is not None
        self.lower: float = step.args["lower"]
        self.upper: float = step.args["upper"]
        # per key: {timestamp: [records]} of each side
        self.buffers: tuple[NamespacedState[float, list[object]], ...] = (
            NamespacedState(self.keyed_state, "__join/left"),
            NamespacedState(self.keyed_state, "__join/right"),
        )

    def process(self, batch: list[object], side: int = 0) -> list[object]:
        key_fn, ts_fn, name = self.key_fns[side], self.ts_fns[side], self.name
        mine, theirs = self.buffers[side], self.buffers[1 - side]
        lower, upper = self.lower, self.upper
        if side == LEFT:
            lo, hi, keep_until = lower, upper, upper  # partners: [ts + lower, ts + upper]
        else:
            lo, hi, keep_until = -upper, -lower, -lower  # partners: [ts - upper, ts - lower]
        events = self.timers.event
        out: list[object] = []
        touch = self._touch()
        for r in batch:
            k = key_fn(r)
            touch(k)
            ts = _timestamp(name, ts_fn, r)
            for other_ts, records in theirs.namespaces(k).items():
                if ts + lo <= other_ts <= ts + hi:
                    for o in records:
                        out.append((k, r, o) if side == LEFT else (k, o, r))
            expiry = math.nextafter(ts + keep_until, math.inf)  # no partner once W > this
            if expiry <= self.watermark:
                continue  # late: its partners' time has passed, nothing left to meet
            held = mine.get(k, ts)
            if held is None:
                mine.put(k, ts, [r])
                events.register(k, expiry, (side, ts))
            elif held.__class__ is list:
                held.append(r)
            else:  # restored from a checkpoint as a tuple
                mine.put(k, ts, [*held, r])
        return out

    def on_watermark(self, watermark: float) -> list[object]:
        self.watermark = watermark
        buffers = self.buffers
        for key, _t, (side, ts) in self.timers.event.due(watermark):
            buffers[side].pop(key, ts)
        return []


@register(StepKind.WINDOW_JOIN)
class WindowJoinOperator(_JoinBase[tuple[float, float]]):  # timers: the window
    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        assert self.keyed_state is not None
        self.kind: WindowKind = step.args["kind"]
        # per key: {(start, end): [left records, right records]}
        self.windows: NamespacedState[tuple[float, float], list[list[object]]] = NamespacedState(
            self.keyed_state, "__join/windows"
        )

    def process(self, batch: list[object], side: int = 0) -> list[object]:
        key_fn, ts_fn, name = self.key_fns[side], self.ts_fns[side], self.name
        windows, events, kind = self.windows, self.timers.event, self.kind
        touch = self._touch()
        for r in batch:
            k = key_fn(r)
            touch(k)
            for window in kind.windows(_timestamp(name, ts_fn, r)):
                if window[1] <= self.watermark:
                    continue  # the window was joined and freed already: too late
                held = windows.get(k, window)
                if held is None:
                    held = [[], []]
                    windows.put(k, window, held)
                    events.register(k, window[1], window)
                elif held.__class__ is not list or held[side].__class__ is not list:
                    held = [list(held[LEFT]), list(held[RIGHT])]  # restored: tuples
                    windows.put(k, window, held)
                held[side].append(r)
        return []

    def on_watermark(self, watermark: float) -> list[object]:
        self.watermark = watermark
        out: list[object] = []
        windows = self.windows
        for key, _t, window in self.timers.event.due(watermark):
            start, end = window
            held = windows.pop(key, (start, end))
            if held is None:
                continue
            out.extend((key, start, end, a, b) for a in held[LEFT] for b in held[RIGHT])
        return out

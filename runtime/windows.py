"""The window operator: keyed windows by event time (or processing time), with lateness.

Per key and window (``statebackend.timers.NamespacedState``, namespace ``(start,
end)``) it keeps an accumulator — ``aggregate``/``reduce`` are incremental, one value
per window, never the records — or, for a full-window ``process``, the window's list of
records. Each window has a timer at ``end`` (it fires once the watermark reaches its
end: no record with a smaller timestamp is still to come) and, with allowed lateness
``L``, a clean-up timer at ``end + L``:

* fire: emit ``(key, start, end, value)``; without lateness the state is freed too;
* a record for a fired window not yet cleaned up (``end <= watermark < end + L``)
  updates it and re-emits it at once (late within lateness);
* a record whose every window was cleaned up is too late: it goes to the late output
  (``late_output=`` on the step), or is counted and logged (never silently dropped);
* session windows merge: a record bridging sessions merges their accumulators
  (``merge``) and their timers. A session record is too late when its timestamp is
  below ``watermark - L``: every session it could have joined that ended there may be
  cleaned up already, and opening a new one would emit a wrong (split) session. The
  rule depends only on the timestamp and the watermark, never on which sessions happen
  to still be in state, so a restored run decides exactly as an uninterrupted one.

The watermark semantics (``runtime.watermarks``): watermark ``W`` says no record with a
timestamp ``< W`` is still to come, so window ``[start, end)`` is complete once
``W >= end``. Timers and the watermark are checkpointed; see ``runtime.keyed_process``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from runtime.graph import Step, StepKind
from runtime.operators import KeyedOperator, OperatorContext, register
from runtime.timestamps import TimestampError
from runtime.window_kinds import Tumbling, WindowKind
from statebackend.timers import NamespacedState, TimerService

log = logging.getLogger("absflow.task")

_MISSING = object()
_IGNORE = frozenset().__contains__  # changes not tracked
FIRE, CLEANUP = 0, 1
MAIN, LATE = 0, 1
"""Tags of the window step's output when it has a late output (split by the next steps)."""


@register(StepKind.WINDOW)
class WindowOperator(KeyedOperator):
    uses_event_time = True
    tracks_changes = True  # state and timers mark their keys; the fast path below too

    def __init__(self, step: Step, ctx: OperatorContext) -> None:
        super().__init__(step, ctx)
        assert self.keyed_state is not None
        args = step.args
        self.kind: WindowKind = args["kind"]
        self.mode: str = args["mode"]  # "aggregate" | "reduce" | "process"
        self.fn: Callable[..., object] = step.fn
        self.initial: object = args.get("initial")
        self.merge: Callable[[object, object], object] | None = args.get("merge")
        self.lateness: float = args.get("allowed_lateness", 0)
        self.tagged: bool = args.get("late_output") is not None
        # the user's timestamp: a number, checked per record (TimestampError otherwise)
        self.ts_fn: Callable[[object], float] | None = args.get("timestamp_fn")
        # {(start, end): accumulator}: the user's accumulator, in process mode the list
        # of the window's records (a tuple once restored)
        self.state: NamespacedState[tuple[float, float], Any] = NamespacedState(
            self.keyed_state, "__windows"
        )
        self.timers: TimerService[tuple[float, float, int]] = TimerService(self.keyed_state)
        self.wants_processing_time = not self.kind.event_time
        self.clock: Callable[[], float] = time.time
        self.late_records = 0
        self._drop = ctx.debug_drop_event_time

    # -- records -------------------------------------------------------------------------
    def process(self, batch: list[object], side: int = 0) -> list[object]:
        out: list[object] = []
        key_fn, add = self.key_fn, self._add
        ts_fn = self.ts_fn
        if ts_fn is None:  # processing time: the wall clock at arrival
            now = self.clock()
            for r in batch:
                add(key_fn(r), r, now, out)
            return out
        if self.kind.__class__ is Tumbling and self.mode != "process":
            self._process_tumbling(batch, ts_fn, out)
            return out
        for r in batch:
            ts = ts_fn(r)
            if ts.__class__ is not int and ts.__class__ is not float:
                raise TimestampError.of(self.name, r, ts)
            add(key_fn(r), r, ts, out)
        return out

    def _process_tumbling(
        self, batch: list[object], ts_fn: Callable[[object], float], out: list[object]
    ) -> None:
        """`_add` for tumbling windows with an incremental function, inlined: one window
        per record, its accumulator straight from the key's map (the per-batch path the
        profile showed: method calls and window lists per record)."""
        kind = self.kind
        assert isinstance(kind, Tumbling)  # the caller's test
        size, offset = kind.size, kind.offset
        watermark = self.watermark
        horizon = watermark - self.lateness
        states, key_fn, fn = self.state.by_key, self.key_fn, self.fn
        fresh, missing = self._fresh, _MISSING
        assert self.keyed_state is not None
        changed = self.keyed_state.changed
        touch = changed.add if changed is not None else _IGNORE
        for r in batch:
            ts = ts_fn(r)
            if ts.__class__ is not int and ts.__class__ is not float:
                raise TimestampError.of(self.name, r, ts)
            start = ts - (ts - offset) % size
            end = start + size
            if end <= horizon:
                self._late(r, out)
                continue
            key = key_fn(r)
            windows = states.get(key)
            if windows is None:
                windows = states[key] = {}
            window = (start, end)
            acc = windows.get(window, missing)
            if acc is missing:
                acc = fresh(r)
                self._register(key, window)
            else:
                acc = fn(acc, r)
            windows[window] = acc
            touch(key)
            if end <= watermark:  # fired already: late within lateness
                out.append(self._result(key, window, acc))

    def _fresh(self, record: object) -> object:
        mode = self.mode
        if mode == "reduce":
            return record
        if mode == "process":
            return [record]
        initial = self.initial
        return self.fn(initial() if callable(initial) else initial, record)

    def _update(self, acc: Any, record: object) -> object:
        """``acc``: the window's accumulator, in ``process`` mode its list of records."""
        mode = self.mode
        if mode == "process":
            if acc.__class__ is tuple:  # restored from a checkpoint (sequences are tuples)
                acc = list(acc)
            acc.append(record)
            return acc
        return self.fn(acc, record)

    def _add(self, key: object, record: object, ts: float, out: list[object]) -> None:
        horizon = self.watermark - self.lateness  # windows ending at or before: cleaned up
        if self.kind.merging:
            self._add_session(key, record, ts, out, horizon)
            return
        state = self.state
        accepted = False
        for window in self.kind.windows(ts):
            if window[1] <= horizon:
                continue  # too late for this window
            accepted = True
            acc = state.get(key, window, _MISSING)
            if acc is _MISSING:
                acc = self._fresh(record)
                self._register(key, window)
            else:
                acc = self._update(acc, record)
            state.put(key, window, acc)
            if window[1] <= self.watermark:  # fired already: late within lateness
                out.append(self._result(key, window, acc))
        if not accepted:
            self._late(record, out)

    def _add_session(
        self, key: object, record: object, ts: float, out: list[object], horizon: float
    ) -> None:
        state, merge = self.state, self.merge
        if ts < horizon:  # it could belong to a session already cleaned up: too late
            self._late(record, out)
            return
        start, end = self.kind.windows(ts)[0]
        overlapping = [w for w in state.namespaces(key) if w[0] < end and start < w[1]]
        acc = self._fresh(record)
        for window in overlapping:
            old = state.pop(key, window)
            self._unregister(key, window)
            start, end = min(start, window[0]), max(end, window[1])
            acc = [*old, *acc] if self.mode == "process" else merge(old, acc)  # type: ignore[misc]
        window = (start, end)
        state.put(key, window, acc)
        self._register(key, window)
        if end <= self.watermark:
            out.append(self._result(key, window, acc))

    def _late(self, record: object, out: list[object]) -> None:
        self.late_records += 1
        if self.tagged:
            out.append((LATE, record))
        elif self.late_records == 1:
            log.warning(
                "step '%s': record %r is later than the allowed lateness (%s) and has no "
                "late output; it is counted (late_records) but not in any window. Pass "
                "late_output='name' to the window to sink such records.",
                self.name,
                record,
                self.lateness,
            )

    # -- timers --------------------------------------------------------------------------
    def _register(self, key: object, window: tuple[float, float]) -> None:
        queue = self.timers.event if self.kind.event_time else self.timers.processing
        if window[1] > self.watermark:  # else it fired: its late updates are emitted at once
            queue.register(key, window[1], (window[0], window[1], FIRE))
        if self.lateness:
            queue.register(key, window[1] + self.lateness, (window[0], window[1], CLEANUP))

    def _unregister(self, key: object, window: tuple[float, float]) -> None:
        queue = self.timers.event
        queue.delete(key, window[1], (window[0], window[1], FIRE))
        if self.lateness:
            queue.delete(key, window[1] + self.lateness, (window[0], window[1], CLEANUP))

    def _result(self, key: object, window: tuple[float, float], acc: object) -> object:
        start, end = window
        value = self.fn(key, start, end, acc) if self.mode == "process" else acc
        result = (key, start, end, value)
        return (MAIN, result) if self.tagged else result

    def _fire(self, due: Iterable[tuple[object, float, tuple[float, float, int]]]) -> list[object]:
        out: list[object] = []
        state, lateness = self.state, self.lateness
        for key, _ts, (start, end, what) in due:
            window = (start, end)
            if what == CLEANUP:
                state.pop(key, window)
                continue
            acc = state.get(key, window, _MISSING)
            if acc is _MISSING:
                continue
            out.append(self._result(key, window, acc))
            if not lateness:
                state.pop(key, window)
        return out

    def on_watermark(self, watermark: float) -> list[object]:
        self.watermark = watermark
        return self._fire(self.timers.event.due(watermark))

    def on_processing_time(self, now: float) -> list[object]:
        queue = self.timers.processing
        nxt = queue.next_time()
        if nxt is None or nxt > now:
            return []
        return self._fire(queue.due(now))

    def finish(self) -> list[object]:
        """End of input: processing-time windows fire now (event time ends by watermark)."""
        if self.kind.event_time:
            return []
        return self._fire(self.timers.processing.due(float("inf")))

    # -- checkpoints ---------------------------------------------------------------------
    def snapshot_state(self, checkpoint_id: int) -> object:
        return {"watermark": self.watermark, "late_records": self.late_records}

    def restore_state(self, state: Any) -> None:
        if state is not None and not self._drop:
            self.watermark = max(self.watermark, float(state["watermark"]))
            self.late_records = int(state["late_records"])

    def after_keyed_restore(self) -> None:
        if self._drop:
            self.timers.clear()
        self.timers.rebuild()

"""Event time: the input watermark of a task, and watermark generation at a source.

Watermarks travel in band (``channels.messages.Watermark``), in the same FIFO as the
records and barriers of their channel. Two objects hold the rules:

* `WatermarkValve` — a task's input watermark: the minimum over its live input
  channels. A channel that ended (end-of-input) or declared itself idle no longer
  holds it back; an idle channel holds it again from its next non-idle watermark.
  The output never goes backwards.
* `WatermarkGenerator` — bounded out-of-orderness at a source subtask: per split,
  ``max timestamp seen - max_delay``; the subtask's watermark is the minimum over its
  active splits. A split (or the whole subtask) that sent nothing for ``idle_timeout``
  seconds of processing time is idle and stops holding the watermark back; it holds it
  again once it emits records.

Both are per batch / per event, never per record, and task-loop thread only.
"""

from __future__ import annotations

import math
from typing import Any

NO_WATERMARK = -math.inf
"""The watermark before any was seen (and of a job without event time)."""
END_OF_TIME = math.inf
"""The watermark a source sends once its input ended: every timer and window fires."""


def watermark_metric(watermark: float | None) -> float | None:
    """A task's watermark in checkpoint metrics: None before any and after its input
    ended (the metrics are JSON: finite numbers only)."""
    if watermark is None or not math.isfinite(watermark):
        return None
    return watermark


class WatermarkValve:
    """The input watermark of a task over its (non back-edge) input channels.

    ``on_watermark`` / ``on_end_of_input`` return the new watermark when it advanced,
    else None. ``current`` starts at the restored watermark (a floor: never lower).
    """

    __slots__ = ("_ended", "_idle", "_marks", "current")

    def __init__(self, channels: list[int], restored: float = NO_WATERMARK) -> None:
        self._marks: dict[int, float] = dict.fromkeys(channels, NO_WATERMARK)
        self._idle: set[int] = set()
        self._ended: set[int] = set()
        self.current = restored

    def restore(self, watermark: float) -> None:
        """Start from a checkpoint's watermark (before any input)."""
        self.current = max(self.current, watermark)

    def on_watermark(self, channel: int, timestamp: float, idle: bool) -> float | None:
        marks = self._marks
        if channel not in marks or channel in self._ended:
            return None  # a back-edge channel, or a watermark after the end: no say
        if idle:
            self._idle.add(channel)
        else:
            self._idle.discard(channel)
            if timestamp > marks[channel]:
                marks[channel] = timestamp
        return self._advance()

    def on_end_of_input(self, channel: int) -> float | None:
        if channel not in self._marks:
            return None
        self._ended.add(channel)
        return self._advance()

    @property
    def all_idle(self) -> bool:
        """Every live channel is idle (the task should forward idleness)."""
        live = [c for c in self._marks if c not in self._ended]
        return bool(live) and all(c in self._idle for c in live)

    def _advance(self) -> float | None:
        live = [m for c, m in self._marks.items() if c not in self._ended and c not in self._idle]
        if live:
            low = min(live)
        elif len(self._ended) == len(self._marks):
            low = END_OF_TIME  # every input ended: event time is over
        else:
            return None  # only idle channels left: hold
        if low > self.current:
            self.current = low
            return low
        return None

    def channel_marks(self) -> dict[int, float]:
        """Each channel's last watermark (a metric, for tests and the CLI)."""
        return dict(self._marks)


class WatermarkGenerator:
    """Bounded out-of-orderness per split, with idleness. Task-loop thread only.

    ``observe(split, max_ts, now)`` after each batch (its largest timestamp);
    ``watermark(now)`` the subtask's watermark: min over active splits of
    ``max_ts - max_delay``; None when every split is idle (the subtask is idle).
    The emitted value never goes backwards (``current``).
    """

    __slots__ = ("_last_active", "_max_ts", "current", "idle_timeout", "max_delay")

    def __init__(self, max_delay: float, idle_timeout: float | None) -> None:
        self.max_delay = max_delay
        self.idle_timeout = idle_timeout
        self._max_ts: dict[Any, float] = {}
        self._last_active: dict[Any, float] = {}
        self.current = NO_WATERMARK

    def observe(self, split: Any, max_ts: float, now: float) -> None:
        prev = self._max_ts.get(split)
        if prev is None or max_ts > prev:
            self._max_ts[split] = max_ts
        self._last_active[split] = now

    def end_split(self, split: Any) -> None:
        """``split`` has ended: it no longer holds the watermark back."""
        self._max_ts.pop(split, None)
        self._last_active.pop(split, None)

    def watermark(self, now: float) -> float | None:
        """The subtask's watermark now, or None if every split is idle (or none exists)."""
        timeout = self.idle_timeout
        low = math.inf
        for split, ts in self._max_ts.items():
            if timeout is not None and now - self._last_active[split] >= timeout:
                continue
            if ts < low:
                low = ts
        if low == math.inf:
            return None
        wm = low - self.max_delay
        if wm > self.current:
            self.current = wm
        return self.current

    def idle(self, now: float, since_start: float) -> bool:
        """Whether the subtask is idle: every split idle, or none seen for ``idle_timeout``."""
        if self.idle_timeout is None:
            return False
        if not self._max_ts:
            return since_start >= self.idle_timeout
        return self.watermark(now) is None

    def snapshot(self) -> dict[str, Any]:
        return {"current": self.current, "splits": [[s, t] for s, t in self._max_ts.items()]}

    def restore(self, state: dict[str, Any], now: float) -> None:
        self.current = max(self.current, float(state["current"]))
        for split, ts in state["splits"]:
            self._max_ts[split] = float(ts)
            self._last_active[split] = now

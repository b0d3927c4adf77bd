"""Window kinds: which windows a record belongs to, and how they are checked at build time.

A window is ``(start, end)``, end exclusive, in the event-time unit of the stream's
timestamps (processing-time windows: seconds of ``time.time()``). Its result is emitted
once the watermark reaches ``end - 1`` (its largest timestamp), with its start and end.

* `Tumbling(size, offset=0)` — fixed, non-overlapping: ``[k*size+offset, (k+1)*size+offset)``;
* `Sliding(size, slide, offset=0)` — fixed, overlapping: a record is in ``size/slide``
  windows (``size`` a multiple of ``slide``);
* `Session(gap)` — per key, records closer than ``gap`` share a window (two records
  exactly ``gap`` apart do not: ``[t, t + gap)`` ends where the next one starts); windows
  that a record bridges are **merged** (their accumulators too);
* `TumblingProcessingTime(size)` — tumbling by the wall clock when the record arrives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.errors import GraphError


def _positive(step: str, what: str, value: Any) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not 0 < value < float("inf")
    ):
        raise GraphError(f"step '{step}': window {what} must be a number > 0, got {value!r}.")


class WindowKind:
    """Where records fall; see the module docstring."""

    event_time = True
    merging = False

    def check(self, step: str) -> None:
        """GraphError naming ``step`` for bad settings (build time)."""

    def windows(self, ts: float) -> list[tuple[float, float]]:
        raise NotImplementedError

    def describe(self) -> str:
        return repr(self)


@dataclass(frozen=True)
class Tumbling(WindowKind):
    size: float
    offset: float = 0

    def check(self, step: str) -> None:
        _positive(step, "size", self.size)

    def windows(self, ts: float) -> list[tuple[float, float]]:
        start = ts - (ts - self.offset) % self.size
        return [(start, start + self.size)]


@dataclass(frozen=True)
class Sliding(WindowKind):
    size: float
    slide: float
    offset: float = 0

    def check(self, step: str) -> None:
        _positive(step, "size", self.size)
        _positive(step, "slide", self.slide)
        if self.slide > self.size:
            raise GraphError(
                f"step '{step}': sliding window slide {self.slide} is larger than its size "
                f"{self.size} (records between windows would belong to none); use "
                "Tumbling(size) or a slide <= size."
            )

    def windows(self, ts: float) -> list[tuple[float, float]]:
        last = ts - (ts - self.offset) % self.slide
        out = []
        start = last
        while start > ts - self.size:
            out.append((start, start + self.size))
            start -= self.slide
        return out


@dataclass(frozen=True)
class Session(WindowKind):
    gap: float
    merging = True

    def check(self, step: str) -> None:
        _positive(step, "gap", self.gap)

    def windows(self, ts: float) -> list[tuple[float, float]]:
        return [(ts, ts + self.gap)]


@dataclass(frozen=True)
class TumblingProcessingTime(WindowKind):
    size: float
    event_time = False

    def check(self, step: str) -> None:
        _positive(step, "size", self.size)

    def windows(self, ts: float) -> list[tuple[float, float]]:
        start = ts - ts % self.size
        return [(start, start + self.size)]

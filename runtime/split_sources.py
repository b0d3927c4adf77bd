"""A source whose subtasks read several splits each, interleaved (like the partitions of
a log or files still being written): one watermark per split (`runtime.watermarks`
`WatermarkGenerator`), so a split that lags in event time holds its subtask's watermark
back, and a split that sends nothing for ``idle_timeout`` stops holding it until it
sends again.

`SplitsSource(fn, counts)`: split ``j`` is the records ``fn(j, i)`` for ``i`` in
``range(counts[j])``; subtask ``s`` of ``p`` reads splits ``s, s + p, ...``, a batch of
at most ``batch`` records from each readable split in turn. ``pauses``: per split, a
list of ``(i, seconds)``: before record ``i`` the split has nothing to read for that
long (wall clock) — a partition that goes quiet; ``every``: a split gives at most one
batch per ``every`` seconds (a partition written at a limited rate). The position of every split is the
snapshot, so a restore resumes each where it was.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from runtime.errors import GraphError
from runtime.sources import Source, SourceReader


class SplitsSource(Source):
    name = "splits"

    def __init__(
        self,
        fn: Callable[[int, int], Any],
        counts: Sequence[int],
        batch: int = 50,
        pauses: Mapping[int, Sequence[tuple[int, float]]] | None = None,
        every: float = 0.0,
    ) -> None:
        self.fn, self.counts, self.batch, self.every = fn, list(counts), batch, every
        self.pauses = {int(j): list(p) for j, p in (pauses or {}).items()}

    def validate(self, step_name: str) -> None:
        if not callable(self.fn):
            raise GraphError(f"source '{step_name}': SplitsSource needs a callable fn(split, i).")
        if not self.counts or any(not isinstance(c, int) or c < 0 for c in self.counts):
            raise GraphError(
                f"source '{step_name}': counts must be a non-empty list of ints >= 0, got "
                f"{self.counts!r}."
            )
        if not isinstance(self.batch, int) or self.batch < 1:
            raise GraphError(
                f"source '{step_name}': batch must be an int >= 1, got {self.batch!r}."
            )

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return _SplitsReader(self, list(range(subtask, len(self.counts), parallelism)))


class _SplitsReader(SourceReader):
    def __init__(self, source: SplitsSource, splits: list[int]) -> None:
        self.source = source
        self.next = dict.fromkeys(splits, 0)  # split -> index of its next record
        self.turn = 0
        self._last: int | None = None
        self._ended: list[int] = []
        self._quiet_until: dict[int, float] = {}
        self._paused: set[tuple[int, int]] = set()  # pauses taken (each once)
        self._next_batch = dict.fromkeys(splits, 0.0)  # monotonic time (``every``)

    def _readable(self, split: int, now: float) -> bool:
        i = self.next[split]
        if i >= self.source.counts[split] or now < self._next_batch[split]:
            return False
        until = self._quiet_until.get(split)
        if until is not None:
            if now < until:
                return False
            del self._quiet_until[split]
            return True
        for at, seconds in self.source.pauses.get(split, ()):
            if at == i and (split, at) not in self._paused:
                self._paused.add((split, at))
                self._quiet_until[split] = now + seconds
                return False
        return True

    def read_batch(self, max_records: int) -> list[Any] | None:
        live = [s for s in self.next if self.next[s] < self.source.counts[s]]
        if not live:
            return None
        now = time.monotonic()
        for _ in range(len(live)):
            split = live[self.turn % len(live)]
            self.turn += 1
            if not self._readable(split, now):
                continue
            i = self.next[split]
            stop = min(self.source.counts[split], i + min(max_records, self.source.batch))
            for at, _s in self.source.pauses.get(split, ()):
                if i < at < stop:
                    stop = at  # the batch ends where the split goes quiet
            self.next[split] = stop
            self._next_batch[split] = now + self.source.every
            self._last = split
            if stop >= self.source.counts[split]:
                self._ended.append(split)
            fn = self.source.fn
            return [fn(split, k) for k in range(i, stop)]
        return []

    def current_split(self) -> Any:
        return self._last

    def take_ended_splits(self) -> list[Any]:
        ended, self._ended = self._ended, []
        return ended

    def snapshot(self) -> Any:
        return [[s, i] for s, i in self.next.items()]

    def restore(self, state: Any) -> None:
        for split, i in state:
            if split in self.next:
                self.next[split] = int(i)

"""Where a strided source reader is, and how it is redistributed at another parallelism.

`GeneratorSource` and `CollectionSource` number their records 0, 1, 2, ...; subtask s
of p takes the indices i with i % p == s, in order. A reader's position is ``next``,
the next index of its stride (``next % p == s``), and ``gaps``: indices below ``next``
it still owes (only after a rescale). Every index it has not emitted is in its gaps or
at or after ``next`` in its stride.

At another parallelism (`redistribute`), the indices no old subtask emitted are those of
each old subtask's gaps and of its stride from its ``next`` on. Above the highest old
``next`` (``F``) nothing was emitted, so new subtask s of p' owes the unemitted indices
below F that are s modulo p' (its gaps), then its stride from the first i >= F with
i % p' == s: no record is skipped or repeated.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def decode(state: Any) -> tuple[int, list[int]]:
    """``(next, gaps)`` of a snapshot (an int ``next``: checkpoints before gaps existed)."""
    if isinstance(state, int):
        return state, []
    return int(state["next"]), [int(g) for g in state.get("gaps", [])]


def encode(next_index: int, gaps: list[int]) -> Any:
    return {"next": next_index, "gaps": list(gaps)} if gaps else next_index


def redistribute(
    parts: Iterable[tuple[int, Any]], old_parallelism: int, subtask: int, parallelism: int
) -> tuple[int, list[int]]:
    """New subtask ``subtask`` of ``parallelism``'s ``(next, gaps)`` from every old
    subtask's ``(old subtask, state)`` (see the module docstring)."""
    positions = [decode(state) for _, state in parts]
    if not positions:
        return subtask, []
    frontier = max(n for n, _ in positions)
    owed: set[int] = set()
    for n, gaps in positions:
        owed.update(gaps)
        owed.update(range(n, frontier, old_parallelism))
    gaps = sorted(i for i in owed if i % parallelism == subtask)
    return frontier + (subtask - frontier) % parallelism, gaps


class StridedPosition:
    """A reader's ``next``/``gaps`` and the indices of its next batch."""

    def __init__(self, subtask: int, parallelism: int) -> None:
        self.next, self.step = subtask, parallelism
        self.gaps: list[int] = []

    def take(self, n: int, count: int | None) -> Sequence[int]:
        """Up to ``n`` indices below ``count`` (None: no end): gaps first, then the stride.
        Without gaps (the common case) a ``range``: a source's per-record loop then
        iterates it without a list of the indices first (~7 ns a record on the keyed
        count's source, of ~130)."""
        if not self.gaps:
            return self._stride(n, count)
        out: list[int] = []
        while self.gaps and len(out) < n:
            i = self.gaps.pop(0)
            if count is None or i < count:
                out.append(i)
        return out + list(self._stride(n - len(out), count))

    def _stride(self, n: int, count: int | None) -> range:
        """The next ``n`` indices of the stride below ``count``; advances ``next``."""
        stop = self.next + n * self.step
        if count is not None:
            stop = min(stop, max(count, self.next))
        stride = range(self.next, stop, self.step)
        self.next += len(stride) * self.step
        return stride

    def ended(self, count: int | None) -> bool:
        return count is not None and self.next >= count and not self.gaps

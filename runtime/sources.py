"""Replayable, partitioned sources.

A ``Source`` is a picklable description; each subtask creates a ``SourceReader``
from it in its task process. Readers expose their position as a small msgpack
value (``snapshot``) so a restored job seeks back to it (``restore``): that is
what makes replay after a failure exact.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any, Generic

from typing_extensions import TypeVar

from runtime import strided
from runtime.errors import GraphError
from statebackend.restore import RescaledState

# A source's record type. A source that does not say (``class S(Source)``) gives records
# of any type, as a raw ``list`` does; PEP 696 defaults need typing_extensions on 3.11.
T = TypeVar("T", default=Any)


class SourceReader(Generic[T]):
    """One subtask's reader. Task-loop thread only."""

    def read_batch(self, max_records: int) -> list[T] | None:
        """Up to ``max_records`` records, [] if none right now, None once the input has ended."""
        raise NotImplementedError

    def snapshot(self) -> object:
        """The position to resume from (a msgpack value); called between two batches."""
        raise NotImplementedError

    def restore(self, state: Any) -> None:
        """Seek to a position returned by ``snapshot`` (called before the first read)."""
        raise NotImplementedError

    def restore_rescaled(self, state: RescaledState) -> None:
        """Restore at another parallelism from every old subtask's position (only for a
        source whose ``rescalable`` is True): take the splits this subtask owns now."""
        raise NotImplementedError

    def current_split(self) -> object:
        """The split the last batch came from (one watermark per split); None for a
        reader that is one split."""
        return None

    def take_ended_splits(self) -> list[object]:
        """Splits that ended since the last call (they stop holding the watermark)."""
        return []

    def close(self) -> None:
        pass


class Source(Generic[T]):
    """A picklable, partitioned, replayable source of records of type ``T``."""

    name = "source"
    # True if its readers implement ``restore_rescaled``: a restore at another
    # parallelism then redistributes the splits instead of being refused.
    rescalable = False

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader[T]:
        raise NotImplementedError

    def validate(self, step_name: str) -> None:
        """Raise GraphError for bad settings (called at build time)."""


class _RateLimiter:
    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.emitted = 0

    def allowance(self, wanted: int) -> int:
        if self.rate is None:
            return wanted
        due = int((time.monotonic() - self.start) * self.rate) - self.emitted
        if due <= 0:
            time.sleep(min(0.01, 1.0 / self.rate))
            return 0
        return min(wanted, due)

    def emitted_now(self, n: int) -> None:
        self.emitted += n


class _GeneratorReader(SourceReader[T]):
    def __init__(
        self,
        fn: Callable[[int], T],
        count: int | None,
        subtask: int,
        parallelism: int,
        rate: float | None,
    ) -> None:
        self.fn, self.count = fn, count
        self.subtask, self.parallelism = subtask, parallelism
        self.pos = strided.StridedPosition(subtask, parallelism)
        self.limiter = _RateLimiter(rate / parallelism if rate else None)

    def read_batch(self, max_records: int) -> list[T] | None:
        if self.pos.ended(self.count):
            return None
        n = self.limiter.allowance(max_records)
        if n == 0:
            return []
        fn = self.fn
        batch = [fn(i) for i in self.pos.take(n, self.count)]
        self.limiter.emitted_now(len(batch))
        return batch

    def snapshot(self) -> object:
        return strided.encode(self.pos.next, self.pos.gaps)

    def restore(self, state: Any) -> None:
        self.pos.next, self.pos.gaps = strided.decode(state)

    def restore_rescaled(self, state: RescaledState) -> None:
        self.pos.next, self.pos.gaps = strided.redistribute(
            state.parts, state.old_parallelism, self.subtask, self.parallelism
        )


class GeneratorSource(Source[T]):
    """Deterministic records ``fn(i)`` for i in [0, count); subtask s takes i = s, s+p, ...

    ``count=None`` never ends; ``rate`` limits records/s over all subtasks.
    """

    name = "generator"
    rescalable = True  # its positions are redistributed (runtime.strided)

    def __init__(
        self, fn: Callable[[int], T], count: int | None, rate: float | None = None
    ) -> None:
        self.fn, self.count, self.rate = fn, count, rate

    def validate(self, step_name: str) -> None:
        if not callable(self.fn):
            raise GraphError(f"source '{step_name}': GeneratorSource needs a callable fn(i).")
        if self.count is not None and (not isinstance(self.count, int) or self.count < 0):
            raise GraphError(
                f"source '{step_name}': count must be an int >= 0 or None, got {self.count!r}."
            )
        if self.rate is not None and not self.rate > 0:
            raise GraphError(
                f"source '{step_name}': rate must be > 0 records/s, got {self.rate!r}."
            )

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader[T]:
        return _GeneratorReader(self.fn, self.count, subtask, parallelism, self.rate)


class _CollectionReader(SourceReader[T]):
    def __init__(self, items: Sequence[T], subtask: int, parallelism: int) -> None:
        self.items, self.subtask, self.parallelism = items, subtask, parallelism
        self.pos = strided.StridedPosition(subtask, parallelism)

    def read_batch(self, max_records: int) -> list[T] | None:
        count = len(self.items)
        if self.pos.ended(count):
            return None
        return [self.items[i] for i in self.pos.take(max_records, count)]

    def snapshot(self) -> object:
        return {"next": self.pos.next, "gaps": list(self.pos.gaps)}

    def _decode(self, state: Any, subtask: int, parallelism: int) -> tuple[int, list[int]]:
        if isinstance(state, int):  # before gaps: the position inside items[s::p]
            return subtask + state * parallelism, []
        return strided.decode(state)

    def restore(self, state: Any) -> None:
        self.pos.next, self.pos.gaps = self._decode(state, self.subtask, self.parallelism)

    def restore_rescaled(self, state: RescaledState) -> None:
        old = state.old_parallelism
        parts = [(j, strided.encode(*self._decode(s, j, old))) for j, s in state.parts]
        self.pos.next, self.pos.gaps = strided.redistribute(
            parts, old, self.subtask, self.parallelism
        )


class CollectionSource(Source[T]):
    """The items of a list; subtask s takes items[s::p]."""

    name = "collection"
    rescalable = True  # its positions are redistributed (runtime.strided)

    def __init__(self, items: Iterable[T]) -> None:
        self.items = list(items)

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader[T]:
        return _CollectionReader(self.items, subtask, parallelism)


def _file_splits(paths: list[str], parallelism: int) -> list[list[tuple[str, int, int]]]:
    """Byte ranges of the files, split evenly over subtasks (a line belongs to the range
    holding its first byte)."""
    sizes = [(p, os.path.getsize(p)) for p in paths]
    total = sum(s for _, s in sizes)
    per = max(1, -(-total // parallelism))
    splits: list[list[tuple[str, int, int]]] = [[] for _ in range(parallelism)]
    offset = 0
    for path, size in sizes:
        pos = 0
        while pos < size:
            owner = min(offset // per, parallelism - 1)
            room = (owner + 1) * per - offset if owner < parallelism - 1 else size - pos
            take = max(1, min(size - pos, room))
            splits[owner].append((path, pos, pos + take))
            pos += take
            offset += take
    return splits


class _TextFileReader(SourceReader[str]):
    def __init__(self, splits: list[tuple[str, int, int]], encoding: str) -> None:
        self.splits = splits
        self.encoding = encoding
        self.split = 0
        self.pos: int | None = None  # byte position of the next line to read in the split
        self.fh: IO[bytes] | None = None
        self._last_split = 0
        self._ended: list[object] = []

    def _open(self) -> bool:
        while self.split < len(self.splits):
            path, start, end = self.splits[self.split]
            self.fh = open(path, "rb")  # noqa: SIM115 - kept open across batches
            if self.pos is None:
                if start > 0:
                    self.fh.seek(start - 1)
                    self.fh.readline()  # the partial line belongs to the previous range
                    self.pos = self.fh.tell()
                else:
                    self.pos = 0
            self.fh.seek(self.pos)
            if self.pos < end:
                return True
            self._next_split()
        return False

    def _next_split(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        self._ended.append(self.split)
        self.split += 1
        self.pos = None

    def read_batch(self, max_records: int) -> list[str] | None:
        if self.fh is None and not self._open():
            return None
        end = self.splits[self.split][2]
        self._last_split = self.split
        fh, enc = self.fh, self.encoding
        out: list[str] = []
        pos = self.pos
        assert pos is not None and fh is not None
        while len(out) < max_records and pos < end:
            line = fh.readline()
            if not line:
                pos = end
                break
            pos += len(line)
            out.append(line.rstrip(b"\r\n").decode(enc))
        self.pos = pos
        if pos >= end:
            self._next_split()
        return out

    def current_split(self) -> object:
        return self._last_split

    def take_ended_splits(self) -> list[object]:
        ended, self._ended = self._ended, []
        return ended

    def snapshot(self) -> object:
        return [self.split, self.pos]

    def restore(self, state: Any) -> None:
        self.close()
        self.split, self.pos = int(state[0]), (None if state[1] is None else int(state[1]))

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


class TextFileSource(Source[str]):
    """Lines of text files (a path, a glob, or a list of them), split by byte ranges over subtasks.

    The position (file split, byte offset) is checkpointed, so replay is exact.
    """

    name = "text"

    def __init__(self, paths: str | Sequence[str], encoding: str = "utf-8") -> None:
        self.patterns = [paths] if isinstance(paths, str) else list(paths)
        self.encoding = encoding

    def files(self) -> list[str]:
        found: list[str] = []
        for pattern in self.patterns:
            matches = (
                sorted(glob.glob(pattern))
                if glob.has_magic(pattern)
                else ([pattern] if os.path.exists(pattern) else [])
            )
            found.extend(m for m in matches if os.path.isfile(m))
        return found

    def validate(self, step_name: str) -> None:
        if not self.files():
            raise GraphError(
                f"source '{step_name}': no file matches {self.patterns!r} "
                f"(working directory {os.getcwd()}); check the path or glob."
            )

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader[str]:
        return _TextFileReader(_file_splits(self.files(), parallelism)[subtask], self.encoding)

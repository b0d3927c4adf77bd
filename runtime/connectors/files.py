"""A continuous file source on any fsspec URL (Spark's file stream source, Flink's
``FileSource.monitorContinuously``).

Each subtask lists the directory (or glob) itself and takes the files whose path hashes
to it (crc32, stable across processes), in name order. Its position is the files it
finished (with their sizes) and the byte offset (JSON lines, CSV) or row offset
(Parquet) inside the open one, so a restore neither skips nor repeats a record. A
restore at another parallelism unions the old subtasks' positions and each new subtask
keeps the finished and open files it owns by the same hash (`restore_rescaled`).

Bounded mode (``poll_interval_s=None``) reads the files there at the first read and
ends; unbounded mode lists again every ``poll_interval_s``, and ends only once a
``done_marker`` file (e.g. ``_SUCCESS``, written by the producer after its last file)
is there and every file listed with it is read. Files must appear whole
(write elsewhere, then rename into the directory): a finished file whose size changes
later, an unreadable file or a malformed line is never skipped silently - with
``on_error="fail"`` the job fails naming the file and line; with
``on_error="dead_letter"`` the source emits a dead-letter record instead (select them
with `is_dead_letter` and sink them).
"""

from __future__ import annotations

import csv
import io
import json
import time
import zlib
from typing import Any

from runtime.errors import ConnectorError
from runtime.sources import Source, SourceReader
from statebackend.restore import RescaledState

FORMATS = ("jsonl", "csv", "parquet")
DEAD_LETTER = "_dead_letter"


class SourceDataError(ConnectorError):
    """A file the source reads is malformed, unreadable or changed (names file and line)."""


def dead_letter(path: str, line: int, text: str, error: str) -> dict[str, Any]:
    return {DEAD_LETTER: {"file": path, "line": line, "text": text, "error": error}}


def is_dead_letter(record: Any) -> bool:
    return isinstance(record, dict) and DEAD_LETTER in record


def _owner(path: str, parallelism: int) -> int:
    return zlib.crc32(path.encode()) % parallelism


class FileStreamSource(Source):
    """Records from the files at ``url`` (a directory, or a glob such as
    ``s3://bucket/in/*.jsonl``): dicts for JSON lines and Parquet, dicts keyed by the
    header for CSV."""

    name = "files"
    rescalable = True  # restore_rescaled re-assigns the old subtasks' splits

    def __init__(
        self,
        url: str,
        format: str = "jsonl",
        poll_interval_s: float | None = None,
        on_error: str = "fail",
        storage_options: dict[str, Any] | None = None,
        done_marker: str | None = None,
    ) -> None:
        self.url, self.format, self.poll_interval_s = url, format, poll_interval_s
        self.done_marker = done_marker
        self.on_error = on_error
        self.storage_options = storage_options or {}

    def filesystem(self) -> tuple[Any, str]:
        import fsspec

        fs, path = fsspec.core.url_to_fs(self.url, **self.storage_options)
        return fs, path

    def list_files(self, fs: Any, path: str) -> list[str]:
        """The matching files, sorted; raises ConnectorError naming the URL and the fix."""
        try:
            if any(c in path for c in "*?["):
                found = fs.glob(path)
            else:
                if not fs.isdir(path):
                    raise FileNotFoundError(path)
                found = fs.find(path)
            return sorted(p for p in found if not p.rsplit("/", 1)[-1].startswith((".", "_")))
        except FileNotFoundError as err:
            raise ConnectorError(
                f"file source: {self.url} does not exist (no such directory or bucket); "
                f"create it or fix the URL"
            ) from err
        except PermissionError as err:
            raise ConnectorError(
                f"file source: access to {self.url} denied: {err}; check the credentials "
                f"(storage_options key/secret, or the environment)"
            ) from err

    def validate(self, step_name: str) -> None:
        if self.format not in FORMATS:
            raise ConnectorError(
                f"source '{step_name}': format must be one of {FORMATS}, got {self.format!r}"
            )
        if self.on_error not in ("fail", "dead_letter"):
            raise ConnectorError(
                f"source '{step_name}': on_error must be 'fail' or 'dead_letter', "
                f"got {self.on_error!r}"
            )
        if self.poll_interval_s is not None and not self.poll_interval_s > 0:
            raise ConnectorError(
                f"source '{step_name}': poll_interval_s must be > 0 or None (bounded)"
            )
        fs, path = self.filesystem()
        self.list_files(fs, path)

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader:
        return FileStreamReader(self, subtask, parallelism)


class FileStreamReader(SourceReader):
    """One subtask's reader. Task-loop thread only."""

    def __init__(self, source: FileStreamSource, subtask: int, parallelism: int) -> None:
        self.source, self.subtask, self.parallelism = source, subtask, parallelism
        self.fs: Any = None
        self.root = ""
        self.done: dict[str, int] = {}  # finished file -> its size then
        self.queue: list[str] = []
        self.current: str | None = None
        self.offset = 0  # bytes (jsonl, csv) or rows (parquet) of ``current`` emitted
        self.line = 0  # line number of the next line (jsonl, csv), for errors
        self.fh: Any = None
        self.header: list[str] | None = None
        self.batches: Any = None
        self.listed_at: float | None = None
        self.last_listing = False  # the done marker was there: nothing new will come
        self.resume: list[tuple[str, int]] = []  # restored open files and their offsets
        self.out: list[Any] = []

    # -- discovery -------------------------------------------------------------------------
    def _discover(self, now: float) -> None:
        if self.fs is None:
            self.fs, self.root = self.source.filesystem()
        interval = self.source.poll_interval_s
        if self.listed_at is not None and (
            interval is None or self.last_listing or now - self.listed_at < interval
        ):
            return
        self.listed_at = now
        marker = self.source.done_marker
        if marker is not None and self.fs.exists(self.root.rstrip("/") + "/" + marker):
            self.last_listing = True  # listed after the marker: every file is in it
        files = self.source.list_files(self.fs, self.root)
        known = set(self.queue) | {self.current} | {path for path, _ in self.resume}
        for path in files:
            if _owner(path, self.parallelism) != self.subtask:
                continue
            if path in self.done:
                self._check_unchanged(path)
            elif path not in known:
                self.queue.append(path)

    def _check_unchanged(self, path: str) -> None:
        size, read = int(self.fs.size(path)), self.done[path]
        if size != read:
            self.done[path] = size  # reported once
            self._bad(path, 0, "", f"changed after it was read ({read} bytes, now {size})")

    # -- reading ---------------------------------------------------------------------------
    def read_batch(self, max_records: int) -> list[Any] | None:
        self.out = []
        self._discover(time.monotonic())
        while len(self.out) < max_records:
            if self.current is None:
                if self.resume:  # restored open files first, from their offsets
                    path, self.offset = self.resume.pop(0)
                    self._open(path)
                    continue
                if not self.queue:
                    break
                self._open(self.queue.pop(0))
                continue
            if not self._read(max_records - len(self.out)):
                self._close_current(finished=True)
        if not self.out and self.current is None and not self.queue and not self.resume:
            ended = self.source.poll_interval_s is None or self.last_listing
            return None if ended else []
        return self.out

    def _open(self, path: str) -> None:
        self.current = path
        try:
            if self.source.format == "parquet":
                import pyarrow.parquet as pq

                self.fh = self.fs.open(path, "rb")
                self.batches = pq.ParquetFile(self.fh).iter_batches(batch_size=4096)
                self._skip_rows(self.offset)
            else:
                self.fh = self.fs.open(path, "rb")
                self.line = 1
                if self.source.format == "csv":
                    first = self.fh.readline()
                    self.header = next(csv.reader([first.decode("utf-8")]), [])
                    self.line = 2
                    self.offset = max(self.offset, len(first))
                if self.offset:
                    self._seek_line(self.offset)
        except ConnectorError:
            raise
        except Exception as err:
            self._bad(path, 0, "", f"cannot be read: {err}")
            self._close_current(finished=True)

    def _seek_line(self, offset: int) -> None:
        # Count the lines before ``offset`` so errors name the right line.
        self.fh.seek(0)
        self.line = 1 + self.fh.read(offset).count(b"\n")

    def _skip_rows(self, rows: int) -> None:
        self.pending_rows: list[Any] = []
        while rows > 0:
            batch = next(self.batches, None)
            if batch is None:
                return
            if batch.num_rows > rows:
                self.pending_rows = batch.slice(rows).to_pylist()
            rows -= batch.num_rows

    def _read(self, room: int) -> bool:
        """Read up to ``room`` records of the current file; False at its end."""
        if self.source.format == "parquet":
            return self._read_parquet(room)
        path, fh, out = self.current, self.fh, self.out
        assert path is not None
        is_csv = self.source.format == "csv"
        for _ in range(room):
            raw = fh.readline()
            if not raw:
                return False
            self.offset += len(raw)
            number, self.line = self.line, self.line + 1
            text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if not text.strip():
                continue
            try:
                if is_csv:
                    values = next(csv.reader(io.StringIO(text)))
                    if len(values) != len(self.header or ()):
                        raise ValueError(
                            f"{len(values)} fields, header has {len(self.header or ())}"
                        )
                    out.append(dict(zip(self.header or (), values, strict=True)))
                else:
                    out.append(json.loads(text))
            except ValueError as err:
                self._bad(path, number, text, f"malformed: {err}")
        return True

    def _read_parquet(self, room: int) -> bool:
        if not self.pending_rows:
            batch = next(self.batches, None)
            if batch is None:
                return False
            self.pending_rows = batch.to_pylist()
        take, self.pending_rows = self.pending_rows[:room], self.pending_rows[room:]
        self.out.extend(take)
        self.offset += len(take)
        return True

    def _bad(self, path: str, line: int, text: str, error: str) -> None:
        where = f"{path}, line {line}" if line else path
        if self.source.on_error == "dead_letter":
            self.out.append(dead_letter(path, line, text[:1000], error))
            return
        raise SourceDataError(
            f"file source: {where} {error}; fix or remove the file, or pass "
            f"on_error='dead_letter' to route such records to a sink of your own"
        )

    def _close_current(self, finished: bool) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None
        if finished and self.current is not None:
            try:
                self.done[self.current] = int(self.fs.size(self.current))
            except FileNotFoundError:
                self.done[self.current] = -1
        self.current, self.offset, self.batches, self.header = None, 0, None, None

    # -- checkpoints -----------------------------------------------------------------------
    def snapshot(self) -> Any:
        return {"done": dict(self.done), "current": self.current, "offset": self.offset}

    def restore(self, state: Any) -> None:
        self.close()
        self.done = {str(p): int(s) for p, s in dict(state["done"]).items()}
        self.queue, self.listed_at, self.last_listing = [], None, False
        current = state.get("current")
        self.resume = [] if current is None else [(str(current), int(state.get("offset", 0)))]

    def restore_rescaled(self, state: RescaledState) -> None:
        """Another parallelism: union the old subtasks' positions and keep what this
        subtask owns by the rule new files follow (`_owner`): its finished files (so they
        are not read again) and the open files with their offsets (read on from there).
        Files an old subtask had listed but not opened are not in any position: they
        are listed again, and read by their new owner."""
        self.close()
        self.done, self.resume = {}, []
        self.queue, self.listed_at, self.last_listing = [], None, False
        for _, part in state.parts:
            if part is None:
                continue
            for path, size in dict(part["done"]).items():
                if _owner(str(path), self.parallelism) == self.subtask:
                    self.done[str(path)] = int(size)
            current = part.get("current")
            if current is not None and _owner(str(current), self.parallelism) == self.subtask:
                self.resume.append((str(current), int(part.get("offset", 0))))
        self.resume.sort()

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None

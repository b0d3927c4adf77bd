"""ParquetSink: part files visible on completion, rolled by size, restored exactly."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgpack
import pyarrow.parquet as pq
import pytest

from runtime.connectors.parquet import ParquetSink
from runtime.errors import ConnectorError
from runtime.sinks import SinkContext


def ctx(subtask: int = 0, attempt: int = 0) -> SinkContext:
    return SinkContext("files", subtask, 2, attempt, lambda n, r: None, job="clicks")


def opened(directory: Path, attempt: int = 0, state: Any = None, **kw: Any) -> ParquetSink:
    sink = ParquetSink(str(directory), **kw)
    sink.open(ctx(attempt=attempt))
    sink.restore_state(None if state is None else msgpack.unpackb(msgpack.packb(state)))
    return sink


def crash(sink: ParquetSink) -> None:
    if sink.committer is not None:
        sink.committer.stop()
    txn = sink.current
    if txn is not None and txn.writer is not None:
        txn.writer.close()  # the process died: the half file stays
        txn.stream.close()


def visible(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if not n.startswith("."))


def in_progress(directory: Path) -> list[str]:
    """In-progress part files (not the fence's owner marker and lock)."""
    return [n for n in os.listdir(directory / ".inprogress") if not n.startswith(".")]


def rows(directory: Path) -> list[tuple[Any, ...]]:
    if not visible(directory):
        return []
    table = pq.read_table(str(directory)).to_pylist()
    return sorted((r["user"], r["n"]) for r in table)


def test_part_files_become_visible_on_completion(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    sink.write_batch([{"user": "a", "n": 1}])
    sink.snapshot_state(1)
    assert visible(tmp_path) == []
    sink.write_batch([{"user": "b", "n": 2}])
    sink.notify_checkpoint_complete(1)
    sink.committer.drain()  # type: ignore[union-attr]
    assert visible(tmp_path) == ["part-clicks-0-1-0.parquet"]
    assert rows(tmp_path) == [("a", 1)]
    sink.finish()
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)
    sink.close()
    assert rows(tmp_path) == [("a", 1), ("b", 2)]
    assert in_progress(tmp_path) == []


def test_files_roll_by_size(tmp_path: Path) -> None:
    sink = opened(tmp_path, roll_size_bytes=1)
    for i in range(3):
        sink.write_batch([{"user": "u", "n": i}])
    sink.finish()
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.close()
    assert visible(tmp_path) == [f"part-clicks-0-1-{i}.parquet" for i in range(3)]
    assert rows(tmp_path) == [("u", 0), ("u", 1), ("u", 2)]


def test_restore_commits_once_and_drops_what_is_replayed(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    sink.write_batch([{"user": "a", "n": 1}])
    state1 = sink.snapshot_state(1)  # completes; the notice never arrives
    sink.write_batch([{"user": "b", "n": 2}])
    sink.snapshot_state(2)  # never completes
    sink.write_batch([{"user": "c", "n": 3}])  # open
    crash(sink)
    for attempt in (1, 2):  # restoring twice commits once
        fresh = opened(tmp_path, attempt=attempt, state=state1)
        assert rows(tmp_path) == [("a", 1)]
        assert in_progress(tmp_path) == []
        crash(fresh)
    fresh = opened(tmp_path, attempt=3, state=state1)
    fresh.write_batch([{"user": "b", "n": 2}, {"user": "c", "n": 3}])  # the replay
    fresh.finish()
    fresh.snapshot_state(3)
    fresh.notify_checkpoint_complete(3)
    fresh.close()
    assert rows(tmp_path) == [("a", 1), ("b", 2), ("c", 3)]


def test_restore_from_an_older_checkpoint_removes_later_part_files(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    sink.write_batch([{"user": "a", "n": 1}])
    state1 = sink.snapshot_state(1)
    sink.write_batch([{"user": "b", "n": 2}])
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)
    sink.committer.drain()  # type: ignore[union-attr]
    crash(sink)
    assert rows(tmp_path) == [("a", 1), ("b", 2)]
    fresh = opened(tmp_path, attempt=1, state=state1)
    assert rows(tmp_path) == [("a", 1)]
    fresh.close()


def test_a_fresh_run_refuses_part_files_of_an_earlier_run(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    sink.write_batch([{"user": "a", "n": 1}])
    sink.finish()
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.close()
    with pytest.raises(ConnectorError, match="already holds part files of job 'clicks'"):
        opened(tmp_path)


def test_an_unwritable_directory_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConnectorError, match="cannot create the Parquet output directory"):
        ParquetSink(str(blocker / "out")).check_system("files")

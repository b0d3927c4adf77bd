"""DeltaSink against real Delta tables (deltalake): one commit per checkpoint, replays skipped."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from deltalake import DeltaTable

from runtime.connectors.delta import DeltaSink
from runtime.errors import ConnectorError
from runtime.sinks import SinkContext


def ctx(subtask: int = 0, attempt: int = 0, job: str = "clicks") -> SinkContext:
    return SinkContext("delta", subtask, 2, attempt, lambda n, r: None, job=job)


def opened(uri: str, attempt: int = 0, state: Any = None, **kw: Any) -> DeltaSink:
    sink = DeltaSink(uri)
    for name, value in kw.items():
        setattr(sink, name, value)
    sink.open(ctx(attempt=attempt))
    sink.restore_state(None if state is None else msgpack.unpackb(msgpack.packb(state)))
    return sink


def crash(sink: DeltaSink) -> None:
    if sink.committer is not None:
        sink.committer.stop()


def rows(uri: str) -> list[tuple[Any, ...]]:
    table = DeltaTable(uri).to_pyarrow_table().to_pylist()
    return sorted((r["user"], r["n"]) for r in table)


def test_one_commit_per_checkpoint_with_the_application_version(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    sink = opened(uri)
    sink.write_batch([{"user": "a", "n": 1}, {"user": "b", "n": 2}])
    sink.snapshot_state(1)
    assert not DeltaTable.is_deltatable(uri)  # nothing visible before completion
    sink.notify_checkpoint_complete(1)
    sink.write_batch([{"user": "c", "n": 3}])
    sink.finish()
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)
    sink.close()
    table = DeltaTable(uri)
    assert rows(uri) == [("a", 1), ("b", 2), ("c", 3)]
    assert table.version() == 1  # two commits: versions 0 and 1
    assert table.transaction_version("absflow:clicks:delta:0") == 2


def test_a_replayed_commit_is_skipped(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    sink = opened(uri)
    sink.write_batch([{"user": "a", "n": 1}])
    state1 = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.committer.drain()  # type: ignore[union-attr]
    sink.write_batch([{"user": "b", "n": 2}])
    sink.snapshot_state(2)  # never completes
    crash(sink)
    fresh = opened(uri, attempt=1, state=state1)  # commits 1 again: skipped
    fresh.write_batch([{"user": "b", "n": 2}])  # the replay
    fresh.finish()
    fresh.snapshot_state(3)
    fresh.notify_checkpoint_complete(3)
    fresh.close()
    assert rows(uri) == [("a", 1), ("b", 2)]


def test_without_the_application_transaction_check_a_replay_duplicates(tmp_path: Path) -> None:
    """The companion of the test above: the skip is what keeps the rows once."""
    uri = str(tmp_path / "t")
    sink = opened(uri, skip_replayed=False)
    sink.write_batch([{"user": "a", "n": 1}])
    state1 = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.committer.drain()  # type: ignore[union-attr]
    crash(sink)
    fresh = opened(uri, attempt=1, state=state1, skip_replayed=False)
    fresh.close()
    assert rows(uri) == [("a", 1), ("a", 1)]


def test_a_table_written_by_another_job_with_the_same_app_id_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    first = opened(uri)
    first.write_batch([{"user": "a", "n": 1}])
    first.finish()
    first.snapshot_state(7)
    first.notify_checkpoint_complete(7)
    first.close()
    started = time.monotonic()
    second = DeltaSink(uri)
    second.open(ctx())
    with pytest.raises(ConnectorError) as info:
        second.restore_state(None)  # a fresh start of a job with the same name
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert f"table {uri} already holds commits of application 'absflow:clicks:delta:0'" in message
    assert "up to checkpoint 7" in message and "another name" in message
    assert rows(uri) == [("a", 1)]
    other = DeltaSink(uri)  # another job name: its own application id
    other.open(ctx(job="clicks-v2"))
    other.restore_state(None)
    other.close()


def test_records_that_do_not_fit_the_schema_name_the_table(tmp_path: Path) -> None:
    import pyarrow as pa

    uri = str(tmp_path / "t")
    sink = DeltaSink(uri, schema=pa.schema([("user", pa.string()), ("n", pa.int64())]))
    sink.open(ctx())
    sink.restore_state(None)
    sink.write_batch([{"user": "a", "n": "many"}])
    with pytest.raises(ConnectorError, match=f"do not fit the schema of {uri}"):
        sink.snapshot_state(1)
    crash(sink)


def test_a_schema_the_table_lacks_is_refused_before_the_job(tmp_path: Path) -> None:
    import pyarrow as pa

    uri = str(tmp_path / "t")
    sink = opened(uri)
    sink.write_batch([{"user": "a", "n": 1}])
    sink.finish()
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.close()
    wrong = DeltaSink(uri, schema=pa.schema([("user", pa.string()), ("city", pa.string())]))
    with pytest.raises(ConnectorError, match=r"has no column\(s\) \['city'\]"):
        wrong.check_system("delta")

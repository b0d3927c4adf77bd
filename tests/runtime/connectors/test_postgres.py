"""PostgresSink against a real server: two-phase commit, recover, bad input."""

from __future__ import annotations

import time
from typing import Any

import msgpack
import pytest

from runtime.connectors.postgres import PostgresSink
from runtime.errors import ConnectorError
from runtime.sinks import SinkContext
from tests.conftest import Postgres

COLS = ["id", "name", "n"]


def ctx(subtask: int = 0, attempt: int = 0) -> SinkContext:
    return SinkContext("pg", subtask, 2, attempt, lambda n, r: None, job="clicks")


def opened(
    pg: Postgres, table: str, attempt: int = 0, state: Any = None, **kw: Any
) -> PostgresSink:
    sink = PostgresSink(pg.dsn, table, COLS, **kw)
    sink.open(ctx(attempt=attempt))
    sink.restore_state(None if state is None else msgpack.unpackb(msgpack.packb(state)))
    return sink


def crash(sink: PostgresSink) -> None:
    """What a killed task leaves: open work rolled back by the server, prepared kept."""
    if sink.committer is not None:
        sink.committer.stop()
    for conn in (sink._conn, sink._commit_conn):
        if conn is not None:
            conn.close()


def rows(pg: Postgres, table: str) -> list[tuple[Any, ...]]:
    return pg.query(f"SELECT id, name, n FROM {table} ORDER BY id, n")


def test_rows_become_visible_on_checkpoint_complete(postgres: Postgres, pg_table: str) -> None:
    sink = opened(postgres, pg_table)
    sink.write_batch([{"id": 1, "name": "a", "n": 1}, (2, "b", 2)])
    assert rows(postgres, pg_table) == []
    sink.snapshot_state(1)
    assert postgres.prepared() == ["absflow:clicks:pg:0:1"]
    assert rows(postgres, pg_table) == []  # prepared, not committed
    sink.write_batch([(3, "c", 3)])
    sink.notify_checkpoint_complete(1)
    sink.committer.drain()  # type: ignore[union-attr]
    assert rows(postgres, pg_table) == [(1, "a", 1), (2, "b", 2)]
    sink.finish()
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)  # final: waits for its commit
    assert [r[0] for r in rows(postgres, pg_table)] == [1, 2, 3]
    sink.close()
    assert postgres.prepared() == []


def test_upsert_keeps_the_last_row_per_key(postgres: Postgres, pg_table: str) -> None:
    postgres.query(f"ALTER TABLE {pg_table} ADD PRIMARY KEY (id)")
    sink = opened(postgres, pg_table, mode="upsert", key=["id"])
    sink.write_batch([(1, "a", 1), (2, "b", 1), (1, "a", 2)])
    sink.snapshot_state(1)
    sink.write_batch([(2, "b", 5)])
    sink.finish()
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)
    sink.close()
    assert rows(postgres, pg_table) == [(1, "a", 2), (2, "b", 5)]


def test_crash_between_prepare_and_commit_is_committed_once_by_restore(
    postgres: Postgres, pg_table: str
) -> None:
    sink = opened(postgres, pg_table)
    sink.write_batch([(1, "a", 1)])
    state = sink.snapshot_state(1)  # prepared; checkpoint 1 completes, notice never arrives
    crash(sink)
    assert postgres.prepared() == ["absflow:clicks:pg:0:1"]
    for attempt in (1, 2):  # restoring twice commits once
        fresh = opened(postgres, pg_table, attempt=attempt, state=state)
        assert rows(postgres, pg_table) == [(1, "a", 1)]
        assert postgres.prepared() == []
        crash(fresh)


def test_restore_rolls_back_what_the_checkpoint_does_not_cover(
    postgres: Postgres, pg_table: str
) -> None:
    sink = opened(postgres, pg_table)
    sink.write_batch([(1, "a", 1)])
    state1 = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.committer.drain()  # type: ignore[union-attr]
    sink.write_batch([(2, "b", 1)])
    sink.snapshot_state(2)  # prepared, checkpoint 2 never completes
    sink.write_batch([(3, "c", 1)])  # open, never prepared
    crash(sink)
    fresh = opened(postgres, pg_table, attempt=1, state=state1)
    assert postgres.prepared() == []
    fresh.write_batch([(2, "b", 1), (3, "c", 1)])  # the replay
    fresh.finish()
    fresh.snapshot_state(3)
    fresh.notify_checkpoint_complete(3)
    fresh.close()
    assert rows(postgres, pg_table) == [(1, "a", 1), (2, "b", 1), (3, "c", 1)]


def test_fresh_start_rolls_back_prepared_transactions_of_an_earlier_run(
    postgres: Postgres, pg_table: str
) -> None:
    sink = opened(postgres, pg_table)
    sink.write_batch([(1, "a", 1)])
    sink.snapshot_state(1)
    crash(sink)
    other = PostgresSink(postgres.dsn, pg_table, COLS)  # another subtask: untouched
    other.open(ctx(subtask=1))
    other.restore_state(None)
    assert postgres.prepared() == ["absflow:clicks:pg:0:1"]
    fresh = opened(postgres, pg_table, attempt=1)
    assert postgres.prepared() == []
    assert rows(postgres, pg_table) == []
    fresh.close()
    other.close()


@pytest.mark.parametrize("exactly_once", [True, False])
def test_replay_after_a_crash_duplicates_rows_only_without_two_phase_commit(
    postgres: Postgres, pg_table: str, exactly_once: bool
) -> None:
    """The companion: committing at write (exactly_once=False) repeats the replayed rows."""
    sink = opened(postgres, pg_table, exactly_once=exactly_once)
    sink.write_batch([(1, "a", 1)])
    state1 = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    if sink.committer is not None:
        sink.committer.drain()
    sink.write_batch([(2, "b", 1)])  # after checkpoint 1: replayed after the crash
    crash(sink)
    fresh = opened(postgres, pg_table, attempt=1, state=state1, exactly_once=exactly_once)
    fresh.write_batch([(2, "b", 1)])
    fresh.finish()
    fresh.snapshot_state(2)
    fresh.notify_checkpoint_complete(2)
    fresh.close()
    expected = [(1, "a", 1), (2, "b", 1)]
    if exactly_once:
        assert rows(postgres, pg_table) == expected
    else:
        assert rows(postgres, pg_table) == [*expected, (2, "b", 1)]


# -- bad input -----------------------------------------------------------------------------
def test_server_down_is_named_within_seconds(tmp_path: Any) -> None:
    dsn = f"postgresql://postgres@/postgres?host={tmp_path}&port=5999"
    sink = PostgresSink(dsn, "t", COLS, connect_timeout_s=2)
    started = time.monotonic()
    with pytest.raises(ConnectorError) as info:
        sink.check_system("pg")
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert "cannot connect to PostgreSQL at" in message and "5999" in message
    assert "start the server or fix the DSN" in message


def test_wrong_table_schema_is_named(postgres: Postgres, pg_table: str) -> None:
    with pytest.raises(ConnectorError, match=r"has no column\(s\) \['city'\]"):
        PostgresSink(postgres.dsn, pg_table, ["id", "city"]).check_system("pg")
    with pytest.raises(ConnectorError, match="does not exist; create it"):
        PostgresSink(postgres.dsn, "no_such_table", COLS).check_system("pg")
    with pytest.raises(ConnectorError, match=r"no unique index on \['id'\]"):
        PostgresSink(postgres.dsn, pg_table, COLS, mode="upsert", key=["id"]).check_system("pg")


def test_a_record_that_does_not_fit_names_the_table(postgres: Postgres, pg_table: str) -> None:
    sink = opened(postgres, pg_table)
    with pytest.raises(ConnectorError, match=f"rows do not fit table '{pg_table}'"):
        sink.write_batch([(1, "a", "not a number")])
    crash(sink)
    assert rows(postgres, pg_table) == []

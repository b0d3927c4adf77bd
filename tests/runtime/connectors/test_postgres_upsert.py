"""PostgresSink upsert mode: two-phase through a staging table, no row travels in the
snapshot, and a prepared epoch never blocks the next one."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from runtime.connectors import pg_sql
from runtime.connectors.postgres import PostgresSink
from tests.conftest import Postgres
from tests.runtime.connectors.test_postgres import COLS, crash, ctx, opened, rows

GID1 = "absflow:clicks:pg:0:1"


@pytest.fixture
def keyed(postgres: Postgres, pg_table: str) -> str:
    postgres.query(f"ALTER TABLE {pg_table} ADD PRIMARY KEY (id)")
    postgres.query(f"DROP TABLE IF EXISTS {pg_sql.staging_name(pg_table)}")
    return pg_table


def upsert(pg: Postgres, table: str, **kw: Any) -> PostgresSink:
    return opened(pg, table, mode="upsert", key=["id"], **kw)


def staged(pg: Postgres, table: str) -> list[tuple[Any, ...]]:
    stage = pg_sql.staging_name(table)
    return pg.query(f"SELECT id, n, _absflow_txn FROM {stage} ORDER BY _absflow_seq")


def test_an_epoch_is_prepared_at_the_barrier_and_merged_on_completion(
    postgres: Postgres, keyed: str
) -> None:
    sink = upsert(postgres, keyed)
    sink.write_batch([(1, "a", 1), (2, "b", 1), (1, "a", 2)])
    state = sink.snapshot_state(1)
    assert state["pending"] == [[1, GID1]]  # the gid, not the rows
    assert postgres.prepared() == [GID1]
    assert rows(postgres, keyed) == [] and staged(postgres, keyed) == []  # not committed
    sink.write_batch([(2, "b", 5)])
    sink.notify_checkpoint_complete(1)
    sink.committer.drain()  # type: ignore[union-attr]
    assert rows(postgres, keyed) == [(1, "a", 2), (2, "b", 1)]  # last per key, in order
    assert staged(postgres, keyed) == []  # merged and deleted in one transaction
    sink.finish()
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)
    sink.close()
    assert rows(postgres, keyed) == [(1, "a", 2), (2, "b", 5)]
    assert postgres.prepared() == []


def test_a_prepared_epoch_does_not_block_the_next_epochs_upsert_of_its_keys(
    postgres: Postgres, keyed: str
) -> None:
    """The next epoch writes key 1 while the epoch that wrote it is prepared: with the
    staging table it goes on at once (lock_timeout would raise if it waited)."""
    sink = upsert(postgres, keyed)
    sink._conn.execute("SET lock_timeout = '2s'")
    sink._conn.commit()
    sink.write_batch([(1, "a", 1)])
    sink.snapshot_state(1)  # prepared; the checkpoint has not completed
    sink.write_batch([(1, "a", 2)])  # would wait for the prepared one on the target
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)
    sink.committer.drain()  # type: ignore[union-attr]
    assert rows(postgres, keyed) == [(1, "a", 2)]
    sink.close()


def test_companion_a_prepared_upsert_of_the_target_blocks_the_next_epoch(
    postgres: Postgres, keyed: str
) -> None:
    """Why the staging table: a prepared upsert of the target keeps its row lock, and the
    next upsert of that key waits until the prepared one ends (here: lock_timeout)."""
    with psycopg.connect(postgres.dsn) as first:
        first.execute(f"INSERT INTO {keyed} VALUES (1, 'a', 1) ON CONFLICT (id) DO NOTHING")
        first.execute("PREPARE TRANSACTION 'absflow:companion:pg:0:1'")
    try:
        with psycopg.connect(postgres.dsn) as second:
            second.execute("SET lock_timeout = '500ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                second.execute(
                    f"INSERT INTO {keyed} VALUES (1, 'a', 2) "
                    "ON CONFLICT (id) DO UPDATE SET n = EXCLUDED.n"
                )
    finally:
        postgres.query("ROLLBACK PREPARED 'absflow:companion:pg:0:1'")


def test_crash_between_prepare_and_commit_is_merged_once_by_restore(
    postgres: Postgres, keyed: str
) -> None:
    sink = upsert(postgres, keyed)
    sink.write_batch([(1, "a", 1), (1, "a", 3)])
    state = sink.snapshot_state(1)  # checkpoint 1 completes; the notice never arrives
    crash(sink)
    fresh = upsert(postgres, keyed, attempt=1, state=state)
    assert rows(postgres, keyed) == [(1, "a", 3)]
    assert postgres.prepared() == [] and staged(postgres, keyed) == []
    crash(fresh)
    postgres.query(f"UPDATE {keyed} SET n = 7")  # a later writer: a second restore keeps it
    again = upsert(postgres, keyed, attempt=2, state=state)
    assert rows(postgres, keyed) == [(1, "a", 7)]  # the merge is not repeated
    again.close()


def test_crash_between_commit_prepared_and_merge_finishes_the_merge(
    postgres: Postgres, keyed: str
) -> None:
    sink = upsert(postgres, keyed)
    sink.write_batch([(1, "a", 1)])
    state = sink.snapshot_state(1)
    crash(sink)
    postgres.query(f"COMMIT PREPARED '{GID1}'")  # the committer died right after this
    assert staged(postgres, keyed) == [(1, 1, GID1)] and rows(postgres, keyed) == []
    fresh = upsert(postgres, keyed, attempt=1, state=state)
    assert rows(postgres, keyed) == [(1, "a", 1)] and staged(postgres, keyed) == []
    fresh.close()


def test_restore_drops_epochs_after_the_restored_checkpoint(postgres: Postgres, keyed: str) -> None:
    sink = upsert(postgres, keyed)
    sink.write_batch([(1, "a", 1)])
    state1 = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.committer.drain()  # type: ignore[union-attr]
    sink.write_batch([(2, "b", 1)])
    sink.snapshot_state(2)  # prepared; committed but never merged (restore goes back to 1)
    sink.write_batch([(3, "c", 1)])
    sink.snapshot_state(3)  # prepared, never committed
    crash(sink)
    postgres.query("COMMIT PREPARED 'absflow:clicks:pg:0:2'")
    fresh = upsert(postgres, keyed, attempt=1, state=state1)
    assert postgres.prepared() == [] and staged(postgres, keyed) == []
    assert rows(postgres, keyed) == [(1, "a", 1)]
    fresh.write_batch([(2, "b", 1), (3, "c", 1)])  # the replay
    fresh.finish()
    fresh.snapshot_state(4)
    fresh.notify_checkpoint_complete(4)
    fresh.close()
    assert rows(postgres, keyed) == [(1, "a", 1), (2, "b", 1), (3, "c", 1)]


@pytest.mark.parametrize("exactly_once", [True, False])
def test_companion_rows_after_the_checkpoint_survive_a_crash_only_without_two_phase(
    postgres: Postgres, keyed: str, exactly_once: bool
) -> None:
    """Exactly once, an epoch the restore goes back over leaves nothing; at least once
    (exactly_once=False) its upserts stay even if the replay never writes them again."""
    sink = upsert(postgres, keyed, exactly_once=exactly_once)
    sink.write_batch([(1, "a", 1)])
    state1 = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    if sink.committer is not None:
        sink.committer.drain()
    sink.write_batch([(9, "z", 1)])  # after checkpoint 1; the replay differs
    if exactly_once:
        sink.snapshot_state(2)  # prepared, checkpoint 2 never completes
    crash(sink)
    fresh = upsert(postgres, keyed, attempt=1, state=state1, exactly_once=exactly_once)
    fresh.close()
    assert (rows(postgres, keyed) == [(1, "a", 1)]) is exactly_once


def test_subtasks_opening_at_once_create_the_staging_table_once(
    postgres: Postgres, keyed: str
) -> None:
    """Each subtask creates the staging table if it is missing; at once, one does."""
    import threading

    sinks = [PostgresSink(postgres.dsn, keyed, COLS, "upsert", ["id"]) for _ in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(sinks))

    def open_one(i: int) -> None:
        try:
            start.wait()
            sinks[i].open(ctx(subtask=i))
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(len(sinks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for sink in sinks:
        sink.close()
    assert errors == []
    assert staged(postgres, keyed) == []


def test_rows_the_target_refuses_at_merge_wait_in_staging(postgres: Postgres, keyed: str) -> None:
    from runtime.errors import ConnectorError

    sink = upsert(postgres, keyed)  # the staging table exists now, without the check below
    postgres.query(f"ALTER TABLE {keyed} ADD CONSTRAINT small CHECK (n < 100)")
    sink.write_batch([(1, "a", 500)])
    state = sink.snapshot_state(1)
    with pytest.raises(ConnectorError, match=f"(?s)do not fit table '{keyed}'.*nothing is lost"):
        sink.commit(1, state["pending"][0][1])
    assert staged(postgres, keyed) == [(1, 500, GID1)] and rows(postgres, keyed) == []
    postgres.query(f"ALTER TABLE {keyed} DROP CONSTRAINT small")
    sink.commit(1, state["pending"][0][1])  # the retry after the fix
    assert rows(postgres, keyed) == [(1, "a", 500)] and staged(postgres, keyed) == []
    crash(sink)


def test_a_rescaled_restore_merges_every_old_subtasks_epochs(
    postgres: Postgres, keyed: str
) -> None:
    """Two subtasks prepare checkpoint 5 (completion never told) and 6 (never completed);
    one subtask restores 5 for both: 5's rows merged, 6's rolled back, staging empty."""
    import msgpack

    from runtime.sinks import SinkContext
    from statebackend.restore import RescaledState

    states = []
    for i in range(2):
        sink = PostgresSink(postgres.dsn, keyed, COLS, "upsert", ["id"])
        sink.open(SinkContext("pg", i, 2, 0, lambda n, r: None, job="clicks"))
        sink.restore_state(None)
        sink.write_batch([(i, "kept", 5)])
        states.append(msgpack.unpackb(msgpack.packb(sink.snapshot_state(5))))
        sink.write_batch([(i, "replayed", 6)])
        sink.snapshot_state(6)
        crash(sink)
    one = PostgresSink(postgres.dsn, keyed, COLS, "upsert", ["id"])
    one.open(SinkContext("pg", 0, 1, 1, lambda n, r: None, job="clicks"))
    one.restore_state(RescaledState(tuple(enumerate(states)), 2))
    assert postgres.prepared() == [] and staged(postgres, keyed) == []
    assert rows(postgres, keyed) == [(0, "kept", 5), (1, "kept", 5)]
    one.close()

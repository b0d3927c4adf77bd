"""PostgresSink restored at another parallelism, against a real server: the new subtask
that owns an old one commits that old subtask's prepared transactions the savepoint
covers and rolls back the ones it left after it (as that subtask's gids); with the
naive per-index restore they stay prepared, their rows invisible."""

from __future__ import annotations

from typing import Any

import msgpack

from runtime.connectors.postgres import PostgresSink
from runtime.sinks import SinkContext
from statebackend.restore import RescaledState
from tests.conftest import Postgres
from tests.runtime.connectors.test_postgres import crash

COLS = ["id", "name", "n"]


def sink_at(pg: Postgres, table: str, subtask: int, parallelism: int) -> PostgresSink:
    sink = PostgresSink(pg.dsn, table, COLS)
    sink.open(SinkContext("pg", subtask, parallelism, 0, lambda n, r: None, job="clicks"))
    return sink


def prepared_at_two(pg: Postgres, table: str) -> list[Any]:
    """Subtasks 0 and 1 of 2 prepare checkpoint 5 (the savepoint, its completion never
    told) and checkpoint 6 (never completed), then crash; their snapshots of 5."""
    states = []
    for i in range(2):
        sink = sink_at(pg, table, i, 2)
        sink.restore_state(None)
        sink.write_batch([(i, "kept", 5)])
        states.append(msgpack.unpackb(msgpack.packb(sink.snapshot_state(5))))
        sink.write_batch([(i, "replayed", 6)])
        sink.snapshot_state(6)
        crash(sink)
    # gids carry the checkpoint expected at begin: 1 (a fresh start), then 6
    assert pg.prepared() == [f"absflow:clicks:pg:{i}:{n}" for i in range(2) for n in (1, 6)]
    return states


def test_one_subtask_recovers_both_old_ones(postgres: Postgres, pg_table: str) -> None:
    states = prepared_at_two(postgres, pg_table)
    sink = sink_at(postgres, pg_table, 0, 1)
    sink.restore_state(RescaledState(tuple(enumerate(states)), 2))
    assert postgres.prepared() == []
    assert postgres.query(f"SELECT id, name FROM {pg_table} ORDER BY id") == [
        (0, "kept"),
        (1, "kept"),
    ]
    sink.close()


def test_companion_the_naive_restore_leaves_the_other_subtask_prepared(
    postgres: Postgres, pg_table: str
) -> None:
    states = prepared_at_two(postgres, pg_table)
    sink = sink_at(postgres, pg_table, 0, 1)
    sink.restore_state(states[0])
    sink.close()
    left = postgres.prepared()
    assert left == ["absflow:clicks:pg:1:1", "absflow:clicks:pg:1:6"]
    assert postgres.query(f"SELECT id FROM {pg_table}") == [(0,)]  # subtask 1's rows lost
    for gid in left:  # leave the server clean
        postgres.query(f"ROLLBACK PREPARED '{gid}'")

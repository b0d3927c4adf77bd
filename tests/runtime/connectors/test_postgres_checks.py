"""PostgresSink bad input: wrong credentials, a server that is down (explain still works
offline), a table that already holds another run's rows (append mode)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from runtime import Dataflow
from runtime.connectors.postgres import PostgresSink
from runtime.errors import ConnectorError
from runtime.sources import CollectionSource
from tests.conftest import Postgres
from tests.runtime.connectors.test_postgres import COLS, crash, opened, rows

USER, PASSWORD = "absflow_pw", "right-password"


@pytest.fixture
def password_user(postgres: Postgres) -> Iterator[str]:
    """A role that must log in with a password (scram-sha-256 in pg_hba.conf, first line)."""
    hba = os.path.join(postgres.datadir, "pg_hba.conf")
    original = Path(hba).read_text()
    Path(hba).write_text(
        f"local all {USER} scram-sha-256\nhost all {USER} 127.0.0.1/32 scram-sha-256\n" + original
    )
    postgres.query(f"DROP ROLE IF EXISTS {USER}")
    postgres.query(f"CREATE ROLE {USER} LOGIN PASSWORD '{PASSWORD}'")
    postgres.query("SELECT pg_reload_conf()")
    try:
        yield USER
    finally:
        Path(hba).write_text(original)
        postgres.query("SELECT pg_reload_conf()")
        postgres.query(f"DROP OWNED BY {USER}")
        postgres.query(f"DROP ROLE IF EXISTS {USER}")


def as_user(pg: Postgres, password: str) -> str:
    return make_conninfo(pg.dsn, user=USER, password=password)


def test_wrong_credentials_are_named_within_seconds(
    postgres: Postgres, pg_table: str, password_user: str
) -> None:
    postgres.query(f"GRANT ALL ON {pg_table} TO {USER}")
    PostgresSink(as_user(postgres, PASSWORD), pg_table, COLS).check_system("pg")  # the right one
    started = time.monotonic()
    with pytest.raises(ConnectorError) as info:
        PostgresSink(as_user(postgres, "wrong"), pg_table, COLS).check_system("pg")
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert f"as user {USER!r}" in message and "password authentication failed" in message
    assert "fix the user or password in the DSN" in message


def down_dsn(tmp_path: Path) -> str:
    return f"postgresql://postgres@/postgres?host={tmp_path}&port=5999"


def test_server_down_is_named_when_the_job_starts_and_explain_stays_offline(
    tmp_path: Path,
) -> None:
    flow = Dataflow("down", parallelism=1)
    sink = PostgresSink(down_dsn(tmp_path), "t", COLS, connect_timeout_s=2)
    flow.source(CollectionSource([(1, "a", 1)]), name="one").sink(sink, name="pg")
    flow.validate()  # no connection: the server is down and nothing complains
    assert "pg" in flow.explain()
    started = time.monotonic()
    with pytest.raises(ConnectorError, match=r"cannot connect to PostgreSQL at .*5999"):
        flow.run(launcher="local")
    assert time.monotonic() - started < 10


def test_an_unparsable_dsn_is_refused_offline() -> None:
    with pytest.raises(ConnectorError, match="DSN does not parse"):
        PostgresSink("host=x port", "t", COLS).validate("pg")
    assert conninfo_to_dict("host=x port=1")  # the form the message suggests parses


def test_append_refuses_a_table_with_rows_of_an_earlier_run(
    postgres: Postgres, pg_table: str
) -> None:
    postgres.query(f"INSERT INTO {pg_table} VALUES (0, 'earlier', 0)")
    with pytest.raises(ConnectorError) as info:
        opened(postgres, pg_table)
    message = str(info.value)
    assert f"table {pg_table!r}" in message and "already holds rows" in message
    assert "if_exists='append'" in message and "restore_from" in message
    assert rows(postgres, pg_table) == [(0, "earlier", 0)]  # nothing touched


def test_a_restart_of_the_same_run_keeps_its_at_least_once_rows(
    postgres: Postgres, pg_table: str
) -> None:
    """At least once, rows are in before any checkpoint; the restart (attempt 1, nothing
    to restore) is the same run, not an earlier one."""
    sink = opened(postgres, pg_table, exactly_once=False)
    sink.write_batch([(1, "a", 1)])
    crash(sink)
    fresh = opened(postgres, pg_table, attempt=1, exactly_once=False)
    fresh.write_batch([(1, "a", 1)])
    fresh.close()
    assert rows(postgres, pg_table) == [(1, "a", 1), (1, "a", 1)]


def test_append_adds_to_earlier_rows_when_asked_and_on_restore(
    postgres: Postgres, pg_table: str
) -> None:
    postgres.query(f"INSERT INTO {pg_table} VALUES (0, 'earlier', 0)")
    sink = opened(postgres, pg_table, if_exists="append")
    sink.write_batch([(1, "a", 1)])
    state = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.committer.drain()  # type: ignore[union-attr]
    crash(sink)
    fresh = opened(postgres, pg_table, attempt=1, state=state)  # same job restores: fine
    fresh.close()
    assert rows(postgres, pg_table) == [(0, "earlier", 0), (1, "a", 1)]


def test_a_record_of_the_wrong_type_names_the_table_in_upsert_mode(
    postgres: Postgres, pg_table: str
) -> None:
    postgres.query(f"ALTER TABLE {pg_table} ADD PRIMARY KEY (id)")
    sink = opened(postgres, pg_table, mode="upsert", key=["id"])
    with pytest.raises(ConnectorError, match=f"rows do not fit table '{pg_table}'"):
        sink.write_batch([(1, "a", "not a number")])
    crash(sink)

"""The PostgreSQL sink's SQL (runtime/connectors/pg_sql.py) that needs no server: names of
the staging and owners tables, quoting, and the upsert's conflict clause. The statements
run against a server are tested with one (test_postgres*.py)."""

from __future__ import annotations

import pytest

from runtime.connectors import pg_sql

pytest.importorskip("psycopg")


@pytest.mark.parametrize(
    ("table", "staging"),
    [
        ("events", "events_absflow_staging"),
        ("sales.events", "sales.events_absflow_staging"),
    ],
)
def test_the_staging_table_sits_next_to_its_target(table: str, staging: str) -> None:
    assert pg_sql.staging_name(table) == staging


def test_a_long_table_name_keeps_the_staging_name_within_postgres_63_bytes() -> None:
    long = "t" * 63
    staged = pg_sql.staging_name(f"s.{long}")
    schema, _, name = staged.partition(".")
    assert schema == "s" and len(name) == 63 and name.endswith("_absflow_staging")
    assert pg_sql.staging_name("t" * 40) != pg_sql.staging_name("t" * 41)


def test_the_owners_table_is_in_the_targets_schema() -> None:
    assert pg_sql.owners_name("sales.events") == "sales.absflow_sink_owners"
    assert pg_sql.owners_name("events") == "absflow_sink_owners"


def test_identifiers_are_quoted_part_by_part() -> None:
    assert pg_sql.ident("s.Events").as_string(None) == '"s"."Events"'
    assert pg_sql.ident('we"ird').as_string(None) == '"we""ird"'


def test_an_upsert_updates_every_column_outside_the_key() -> None:
    clause = pg_sql.on_conflict(["k1", "k2", "v", "w"], ["k1", "k2"]).as_string(None)
    assert clause == 'ON CONFLICT ("k1", "k2") DO UPDATE SET "v" = EXCLUDED."v", "w" = EXCLUDED."w"'


def test_an_upsert_whose_columns_are_all_key_does_nothing_on_conflict() -> None:
    assert pg_sql.on_conflict(["k"], ["k"]).as_string(None) == 'ON CONFLICT ("k") DO NOTHING'

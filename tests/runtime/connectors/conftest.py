"""Real systems for the connector tests: a PostgreSQL server (pgserver's wheel) in a
temp dir, started once per session with two-phase commit enabled and stopped after."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class Postgres:
    """A running server; ``dsn`` reaches it over its Unix socket (no TCP port)."""

    dsn: str
    datadir: str

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []

    def prepared(self) -> list[str]:
        return [gid for (gid,) in self.query("SELECT gid FROM pg_prepared_xacts ORDER BY gid")]


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    pgserver = pytest.importorskip("pgserver")
    datadir = tempfile.mkdtemp(prefix="pgserver-absflow-")
    server = pgserver.get_server(datadir, cleanup_mode="stop")
    try:
        server.psql("ALTER SYSTEM SET max_prepared_transactions = 64;")
        server.cleanup()  # restart: the setting needs it
        server = pgserver.get_server(datadir, cleanup_mode="stop")
        pg = Postgres(server.get_uri(), datadir)
        yield pg
        leftover = pg.prepared()
        assert not leftover, f"prepared transactions left behind: {leftover}"
    finally:
        server.cleanup()
        shutil.rmtree(datadir, ignore_errors=True)


@pytest.fixture
def pg_table(postgres: Postgres, request: pytest.FixtureRequest) -> str:
    """A fresh table (id int, name text, n int) named after the test."""
    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:50].lower()
    postgres.query(f"DROP TABLE IF EXISTS {name}")
    postgres.query(f"CREATE TABLE {name} (id int, name text, n int)")
    return name

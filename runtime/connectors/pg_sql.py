"""SQL the PostgreSQL sink runs, kept apart from its transaction logic: COPY, the upsert
staging table and its merge, the checks of a target table.

The staging table (``<table>_absflow_staging`` next to the target unless named) holds
each upsert epoch's rows tagged with the epoch's transaction id (``_absflow_txn``, the
prepared transaction's gid) and an insertion order (``_absflow_seq``). It has no unique
index, so inserting into it never conflicts with and never locks a row of the target.

The owners table (``absflow_sink_owners`` in the target's schema) holds, per sink
subtask (``absflow:<job>:<step>:<subtask>``), the attempt that owns its transactions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TXN_COL, SEQ_COL = "_absflow_txn", "_absflow_seq"
OWNERS = "absflow_sink_owners"


def ident(name: str) -> Any:
    """``"schema.table"`` or ``"table"`` as a quoted SQL identifier."""
    from psycopg import sql

    return sql.Identifier(*name.split("."))


def staging_name(table: str) -> str:
    schema, _, name = table.rpartition(".")
    staged = f"{name[: 63 - len('_absflow_staging')]}_absflow_staging"
    return f"{schema}.{staged}" if schema else staged


def copy_rows(conn: Any, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from psycopg import sql

    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    copy = sql.SQL("COPY {} ({}) FROM STDIN").format(ident(table), cols)
    with conn.cursor() as cur, cur.copy(copy) as out:
        for row in rows:
            out.write_row(row)


def upsert_rows(
    conn: Any,
    table: str,
    columns: Sequence[str],
    key: Sequence[str],
    rows: Sequence[Sequence[Any]],
) -> None:
    """INSERT ... ON CONFLICT (key) DO UPDATE, one statement per row (at-least-once mode)."""
    from psycopg import sql

    stmt = sql.SQL("INSERT INTO {} ({}) VALUES ({}) ").format(
        ident(table),
        sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)),
    )
    with conn.cursor() as cur:
        cur.executemany(stmt + on_conflict(columns, key), rows)


def on_conflict(columns: Sequence[str], key: Sequence[str]) -> Any:
    from psycopg import sql

    updates = [c for c in columns if c not in key]
    action = (
        sql.SQL("DO UPDATE SET ")
        + sql.SQL(", ").join(
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updates
        )
        if updates
        else sql.SQL("DO NOTHING")
    )
    return (
        sql.SQL("ON CONFLICT ({}) ").format(sql.SQL(", ").join(sql.Identifier(k) for k in key))
        + action
    )


def ensure_staging(conn: Any, table: str, staging: str, columns: Sequence[str]) -> None:
    """Create the staging table like the target (its column types, defaults and checks,
    no indexes) if it is missing. Every sink subtask runs this at open, serialised by a
    session advisory lock; the check runs in a transaction begun after the lock was
    taken, so it sees a table another subtask created meanwhile."""
    from psycopg import sql

    with conn.transaction():
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", [staging])
    try:
        with conn.transaction():
            if conn.execute("SELECT to_regclass(%s)", [staging]).fetchone()[0] is not None:
                return
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS, "
                    "{} text NOT NULL, {} bigint GENERATED ALWAYS AS IDENTITY)"
                ).format(
                    ident(staging), ident(table), sql.Identifier(TXN_COL), sql.Identifier(SEQ_COL)
                )
            )
            conn.execute(
                sql.SQL("CREATE INDEX ON {} ({}, {})").format(
                    ident(staging), sql.Identifier(TXN_COL), sql.Identifier(SEQ_COL)
                )
            )
    finally:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", [staging])


def owners_name(table: str) -> str:
    """The sinks' bookkeeping table of attempt owners, in the target table's schema."""
    schema, _, _ = table.rpartition(".")
    return f"{schema}.{OWNERS}" if schema else OWNERS


def ensure_owners(conn: Any, owners: str) -> None:
    """Create the owners table (one row per sink subtask: who may seal and commit its
    transactions) if it is missing; serialised like `ensure_staging`. One round trip when
    it exists (every open but the first)."""
    from psycopg import sql

    if conn.execute("SELECT to_regclass(%s)", [owners]).fetchone()[0] is not None:
        return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", [owners])
    try:
        with conn.transaction():
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (sink text PRIMARY KEY, owner text NOT NULL, "
                    "claimed_at timestamptz NOT NULL DEFAULT now())"
                ).format(ident(owners))
            )
    finally:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", [owners])


def claim_owner(conn: Any, owners: str, sink: str, owner: str) -> None:
    """Make ``owner`` the owner of ``sink`` (waits for every transaction that holds the
    row: a seal or a commit of the previous owner in flight)."""
    from psycopg import sql

    conn.execute(
        sql.SQL(
            "INSERT INTO {} (sink, owner) VALUES (%s, %s) ON CONFLICT (sink) "
            "DO UPDATE SET owner = EXCLUDED.owner, claimed_at = now()"
        ).format(ident(owners)),
        [sink, owner],
    )


def read_owner(conn: Any, owners: str, sink: str) -> str | None:
    """The owner of ``sink`` now (no lock)."""
    from psycopg import sql

    row = conn.execute(
        sql.SQL("SELECT owner FROM {} WHERE sink = %s").format(ident(owners)), [sink]
    ).fetchone()
    return None if row is None else str(row[0])


def begin_reading_owner(conn: Any, owners: str, sink: str) -> str | None:
    """Begin a transaction on ``conn`` (autocommit) and read the owner of ``sink``, its row
    share-locked until the transaction ends (a claim waits); one round trip."""
    from psycopg import sql

    cur = conn.execute(
        sql.SQL("BEGIN; SELECT owner FROM {} WHERE sink = {} FOR SHARE").format(
            ident(owners), sql.Literal(sink)
        )
    )
    cur.nextset()  # past BEGIN's result
    row = cur.fetchone()
    return None if row is None else str(row[0])


def stage_rows(
    conn: Any, staging: str, columns: Sequence[str], gid: str, rows: Sequence[Sequence[Any]]
) -> None:
    copy_rows(conn, staging, [*columns, TXN_COL], [(*row, gid) for row in rows])


def merge(
    conn: Any, table: str, staging: str, columns: Sequence[str], key: Sequence[str], gid: str
) -> int:
    """Upsert transaction ``gid``'s staged rows into ``table`` (the last per key in the
    order they were written) and delete them from staging, in one transaction: merging
    the same ``gid`` again finds nothing (idempotent). Returns the rows merged."""
    from psycopg import sql

    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    stmt = sql.SQL(
        "INSERT INTO {table} ({cols}) SELECT {cols} FROM ("
        "SELECT DISTINCT ON ({keys}) {cols} FROM {staging} WHERE {txn} = %s "
        "ORDER BY {keys}, {seq} DESC) AS epoch ORDER BY {keys} "
    ).format(
        table=ident(table),
        cols=cols,
        keys=keys,
        staging=ident(staging),
        txn=sql.Identifier(TXN_COL),
        seq=sql.Identifier(SEQ_COL),
    ) + on_conflict(columns, key)
    with conn.transaction():
        merged: int = conn.execute(stmt, [gid]).rowcount
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE {} = %s").format(ident(staging), sql.Identifier(TXN_COL)),
            [gid],
        )
    return merged


def staged_txns(conn: Any, staging: str, owner: str) -> list[str]:
    """Transaction ids with committed rows in staging that start with ``owner:``."""
    from psycopg import sql

    rows = conn.execute(
        sql.SQL("SELECT DISTINCT {0} FROM {1} WHERE starts_with({0}, %s)").format(
            sql.Identifier(TXN_COL), ident(staging)
        ),
        [owner + ":"],
    ).fetchall()
    return [gid for (gid,) in rows]


def drop_staged(conn: Any, staging: str, gid: str) -> None:
    from psycopg import sql

    conn.execute(
        sql.SQL("DELETE FROM {} WHERE {} = %s").format(ident(staging), sql.Identifier(TXN_COL)),
        [gid],
    )


def columns_of(conn: Any, table: str) -> set[str]:
    return {
        row[0]
        for row in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0 AND NOT attisdropped",
            [table],
        )
    }


def unique_keys(conn: Any, table: str) -> list[set[str]]:
    rows = conn.execute(
        "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a "
        "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = %s::regclass AND i.indisunique GROUP BY i.indexrelid",
        [table],
    ).fetchall()
    return [set(cols) for (cols,) in rows]


def has_rows(conn: Any, table: str) -> bool:
    from psycopg import sql

    query = sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(ident(table))
    return bool(conn.execute(query).fetchone()[0])

"""PostgreSQL sink, exactly once through two-phase commit (psycopg 3).

Each checkpoint's rows are written in one transaction on the task's connection and
``PREPARE TRANSACTION``'d at the barrier under the gid ``absflow:<job>:<step>:<subtask>:<n>``
(`runtime.transactions.TxnId`). CHECKPOINT_COMPLETE commits them with ``COMMIT
PREPARED`` on the committer thread's own connection; a gid that is gone was committed
already (commits are idempotent). On restore, this subtask's prepared transactions
listed in the restored snapshot are committed and all its others (sealed after the
restored checkpoint, or by a run nobody restores) are rolled back.

Upsert mode is idempotent by key, and a prepared transaction would hold its row locks
until the checkpoint completes - the next epoch's upsert of the same key would then
wait on the task loop for a commit only the task loop can trigger. So in upsert mode
a checkpoint's rows (the last per key) travel in the snapshot and are upserted in one
transaction on completion, on the committer thread; repeating it after a restore
writes the same values (Flink's write-ahead sink).

Append mode needs ``max_prepared_transactions`` > 0 on the server (``ALTER SYSTEM SET
max_prepared_transactions = 64`` and a restart).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.errors import ConnectorError
from runtime.sinks import SinkContext, TwoPhaseCommitSink
from runtime.transactions import TxnId

log = logging.getLogger("absflow.sinks.postgres")

MODES = ("append", "upsert")


@dataclass
class _Txn:
    gid: str
    rows: int = 0
    upserts: dict[tuple[Any, ...], tuple[Any, ...]] = field(default_factory=dict)


class PostgresSink(TwoPhaseCommitSink):
    """Rows into ``table`` (``"name"`` or ``"schema.name"``), exactly once.

    Records are dicts (values taken by column name) or tuples in ``columns`` order.
    ``mode="append"`` inserts every record (COPY); ``mode="upsert"`` inserts or updates
    by ``key`` (the table needs a unique index on exactly those columns).
    ``exactly_once=False`` commits each batch as it arrives (at-least-once: a restore
    replays, and appended rows repeat) - the baseline the two-phase commit is measured by.
    """

    commit_off_loop = True

    def __init__(
        self,
        dsn: str,
        table: str,
        columns: Sequence[str],
        mode: str = "append",
        key: Sequence[str] = (),
        exactly_once: bool = True,
        connect_timeout_s: int = 5,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"PostgresSink: mode must be one of {MODES}, got {mode!r}")
        if mode == "upsert" and not key:
            raise ValueError("PostgresSink: mode='upsert' needs key=[column, ...]")
        missing = [k for k in key if k not in columns]
        if missing:
            raise ValueError(f"PostgresSink: key columns {missing} are not in columns")
        self.dsn, self.table, self.columns = dsn, table, list(columns)
        self.mode, self.key = mode, list(key)
        self.exactly_once = exactly_once
        self.connect_timeout_s = connect_timeout_s
        self._conn: Any = None
        self._commit_conn: Any = None

    # -- connections and checks ------------------------------------------------------------
    def where(self) -> str:
        from psycopg.conninfo import conninfo_to_dict

        try:
            info = conninfo_to_dict(self.dsn)
        except Exception:
            return "PostgreSQL (unparsable DSN)"
        return (
            f"PostgreSQL at {info.get('host', 'localhost')}:{info.get('port', 5432)} "
            f"database {info.get('dbname', '?')!r}"
        )

    def connect(self, autocommit: bool) -> Any:
        import psycopg

        try:
            return psycopg.connect(
                self.dsn, autocommit=autocommit, connect_timeout=self.connect_timeout_s
            )
        except psycopg.OperationalError as err:
            raise ConnectorError(
                f"PostgreSQL sink: cannot connect to {self.where()}: {str(err).strip()}; "
                f"start the server or fix the DSN (host, port, user, password)"
            ) from err

    def validate(self, step_name: str) -> None:
        conn = self.connect(autocommit=True)
        try:
            self._check(conn, step_name)
        finally:
            conn.close()

    def _check(self, conn: Any, step_name: str) -> None:
        """The table exists with the columns (and unique key) this sink writes, and the
        server can prepare transactions."""
        where = f"sink '{step_name}': table {self.table!r} in {self.where()}"
        if conn.execute("SELECT to_regclass(%s)", [self.table]).fetchone()[0] is None:
            raise ConnectorError(f"{where} does not exist; create it with columns {self.columns}")
        have = {
            row[0]
            for row in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
                "AND attnum > 0 AND NOT attisdropped",
                [self.table],
            )
        }
        missing = [c for c in self.columns if c not in have]
        if missing:
            raise ConnectorError(
                f"{where} has no column(s) {missing} (it has {sorted(have)}); "
                f"ALTER TABLE to add them or change the sink's columns"
            )
        if self.mode == "upsert":
            uniques = conn.execute(
                "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_attribute a "
                "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                "WHERE i.indrelid = %s::regclass AND i.indisunique GROUP BY i.indexrelid",
                [self.table],
            ).fetchall()
            if not any(set(cols) == set(self.key) for (cols,) in uniques):
                raise ConnectorError(
                    f"{where} has no unique index on {self.key} (needed by upsert); "
                    f"add PRIMARY KEY or UNIQUE ({', '.join(self.key)})"
                )
        if self.exactly_once and self.mode == "append":
            slots = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])
            if slots <= 0:
                raise ConnectorError(
                    f"sink '{step_name}': {self.where()} has max_prepared_transactions = 0, "
                    f"so it cannot prepare transactions (two-phase commit); run ALTER SYSTEM "
                    f"SET max_prepared_transactions = 64 and restart the server"
                )

    # -- the contract ----------------------------------------------------------------------
    def open(self, ctx: SinkContext) -> None:
        super().open(ctx)
        self._conn = self.connect(autocommit=not self.exactly_once)
        self._check(self._conn, ctx.step_name)
        if not self.exactly_once:
            return
        self._conn.rollback()  # end the checks' transaction: each epoch starts clean

    def write_batch(self, records: list[Any]) -> None:
        if self.exactly_once:
            super().write_batch(records)
        else:
            self._write(self._conn, self._rows(records))  # autocommit: visible at once

    def begin_transaction(self, txn_id: TxnId) -> _Txn:
        return _Txn(str(txn_id))

    def write_to_transaction(self, txn: _Txn, records: list[Any]) -> None:
        if self.mode == "upsert":
            positions = [self.columns.index(k) for k in self.key]
            for row in self._rows(records):
                txn.upserts[tuple(row[i] for i in positions)] = row
        else:
            rows = self._rows(records)
            self._write(self._conn, rows)
            txn.rows += len(rows)

    def _rows(self, records: list[Any]) -> list[tuple[Any, ...]]:
        cols = self.columns
        try:
            return [tuple(r[c] for c in cols) if isinstance(r, dict) else tuple(r) for r in records]
        except KeyError as err:
            raise ConnectorError(
                f"PostgreSQL sink '{self.ctx.step_name}': a record has no field {err} "
                f"(table {self.table!r} columns {cols}); map records to these columns"
            ) from err

    def _write(self, conn: Any, rows: list[tuple[Any, ...]]) -> None:
        from psycopg import sql

        if not rows:
            return
        table = sql.Identifier(*self.table.split("."))
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in self.columns)
        try:
            if self.mode == "append":
                with conn.cursor() as cur:
                    copy = sql.SQL("COPY {} ({}) FROM STDIN").format(table, cols)
                    with cur.copy(copy) as out:
                        for row in rows:
                            out.write_row(row)
            else:
                updates = [c for c in self.columns if c not in self.key]
                action = (
                    sql.SQL("DO UPDATE SET ")
                    + sql.SQL(", ").join(
                        sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updates
                    )
                    if updates
                    else sql.SQL("DO NOTHING")
                )
                stmt = (
                    sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) ").format(
                        table,
                        cols,
                        sql.SQL(", ").join(sql.Placeholder() * len(self.columns)),
                        sql.SQL(", ").join(sql.Identifier(k) for k in self.key),
                    )
                    + action
                )
                with conn.cursor() as cur:
                    cur.executemany(stmt, rows)
        except Exception as err:
            import psycopg

            if not isinstance(err, psycopg.DataError | psycopg.ProgrammingError):
                raise
            raise ConnectorError(
                f"PostgreSQL sink '{self.ctx.step_name}': rows do not fit table "
                f"{self.table!r} ({self.columns}): {str(err).strip()}"
            ) from err

    def pre_commit(self, txn: _Txn, checkpoint_id: int) -> Any:
        from psycopg import sql

        if not self.exactly_once:
            return None
        if self.mode == "upsert":
            return {"rows": list(txn.upserts.values())} if txn.upserts else None
        if txn.rows == 0:
            return None  # nothing to commit: no prepared transaction either
        self._conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(txn.gid)))
        return txn.gid

    def commit(self, checkpoint_id: int, handle: Any) -> None:
        if handle is None:
            return
        if self._commit_conn is None or self._commit_conn.closed:
            self._commit_conn = self.connect(autocommit=True)
        conn = self._commit_conn
        if isinstance(handle, dict):  # upsert mode: the rows themselves
            with conn.transaction():
                self._write(conn, [tuple(row) for row in handle["rows"]])
        else:
            self._finish_prepared(conn, "COMMIT", str(handle))

    @staticmethod
    def _finish_prepared(conn: Any, verb: str, gid: str) -> bool:
        """``COMMIT``/``ROLLBACK PREPARED gid``; False if it is not (any more) prepared."""
        import psycopg
        from psycopg import sql

        try:
            conn.execute(sql.SQL(verb + " PREPARED {}").format(sql.Literal(gid)))
        except psycopg.errors.UndefinedObject:
            return False  # done before: idempotent
        return True

    def prepared(self, conn: Any) -> list[str]:
        """This sink subtask's prepared transactions (in this database)."""
        owner = self.txn_id(0).owner + ":"
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
            "AND starts_with(gid, %s)",
            [owner],
        ).fetchall()
        return [gid for (gid,) in rows if TxnId.parse(gid) is not None]

    def recover(self, pending: list[tuple[int, Any]], checkpoint_id: int | None) -> None:
        if not self.exactly_once:
            return
        conn = self.connect(autocommit=True)
        try:
            for n, handle in pending:
                if isinstance(handle, dict):
                    self.commit(n, handle)  # upserts: writing them again is harmless
            keep = [str(h) for _, h in pending if isinstance(h, str)]
            committed = sum(self._finish_prepared(conn, "COMMIT", gid) for gid in keep)
            lingering = [gid for gid in self.prepared(conn) if gid not in keep]
            for gid in lingering:
                self._finish_prepared(conn, "ROLLBACK", gid)
        finally:
            conn.close()
        if committed or lingering:
            log.info(
                "sink '%s'[%d]: restore from checkpoint %s committed %d and rolled back %d "
                "prepared transaction(s)",
                self.ctx.step_name,
                self.ctx.subtask,
                checkpoint_id,
                committed,
                len(lingering),
            )

    def close(self) -> None:
        try:
            super().close()
        finally:
            for conn in (self._conn, self._commit_conn):
                if conn is not None and not conn.closed:
                    conn.close()  # an open, unprepared epoch is rolled back

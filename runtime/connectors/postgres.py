"""PostgreSQL sink, exactly once through two-phase commit (psycopg 3).

Each checkpoint's rows are written in one transaction on the task's connection and
``PREPARE TRANSACTION``'d at the barrier under the gid ``absflow:<job>:<step>:<subtask>:<n>``
(`runtime.transactions.TxnId`). CHECKPOINT_COMPLETE commits them with ``COMMIT
PREPARED`` on the committer thread's own connection; a gid that is gone was committed
already (commits are idempotent). On restore, this subtask's prepared transactions
listed in the restored snapshot are committed and all its others (sealed after the
restored checkpoint, or by a run nobody restores) are rolled back.

Append mode COPYs the rows into the target table itself. Upsert mode cannot prepare an
upsert of the target: the prepared transaction would hold its row locks until the
checkpoint completes, and the next epoch's upsert of the same key would wait on the
task loop for a commit only the task loop can trigger. So an upsert epoch COPYs its rows
into a staging table (`pg_sql`: no unique index, so no conflict and no lock on a target
row) in the transaction that is prepared; on completion the committer runs ``COMMIT
PREPARED`` and then, in one transaction, upserts that epoch's staged rows into the
target (the last per key) and deletes them from staging, so a repeated merge finds
nothing. A restore commits and merges the restored epochs in order and drops staged
rows of epochs after the restored checkpoint. No row travels in the snapshot.

Append mode refuses, on a fresh start (no checkpoint restored), a table that already
holds rows: they came from an earlier run or another job, and the job's output would be
mixed with them (``if_exists="append"`` allows it). Rows are expected only from the
same job: on a restore (the restored checkpoint says so) or a restart of the same run
(attempt > 0; at-least-once rows may be in before any checkpoint).

Fenced by attempt (`runtime.transactions.Epoch`): the owners table (`pg_sql`) names
the attempt that owns each sink subtask. A restore claims the subtask by updating its
row; every seal (``PREPARE TRANSACTION``) and commit (``COMMIT PREPARED`` and the
upsert merge) runs while a transaction of the sink's fence connection holds that row
share-locked after checking the owner (``SELECT ... FOR SHARE``), so a claim waits for a
seal or commit in flight, and a seal or commit after the claim finds the new owner and
fails (`StaleAttemptError`). A stale attempt's transaction sealed before the claim is
rolled back by the new owner's restore; its commit can no longer run. The fence
connection ends a lock held longer than ``FENCE_IDLE_TIMEOUT_S`` (a host that lost its
link in the middle of a commit), so a claim never waits for it longer.

Both modes need ``max_prepared_transactions`` > 0 on the server (``ALTER SYSTEM SET
max_prepared_transactions = 64`` and a restart).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.connectors import pg_sql
from runtime.errors import ConnectorError
from runtime.sinks import OtherRunsOutput, SinkContext, SinkSnapshot, TwoPhaseCommitSink
from runtime.transactions import Epoch, TxnId

log = logging.getLogger("absflow.sinks.postgres")

MODES = ("append", "upsert")
IF_EXISTS = ("fail", "append")
# The server ends a fence connection idle this long inside its transaction (the row lock
# of a seal or commit whose task lost its link): a claim waits at most this long.
FENCE_IDLE_TIMEOUT_S = 60


@dataclass
class _Txn:
    gid: str
    rows: int = 0


# A prepared transaction's gid (None: nothing to commit); from older checkpoints, the
# upsert epoch's rows themselves ({"rows": [...]}).
Handle = str | dict[str, Any] | None


class PostgresSink(TwoPhaseCommitSink[_Txn, Handle]):
    """Rows into ``table`` (``"name"`` or ``"schema.name"``), exactly once.

    Records are dicts (values taken by column name) or tuples in ``columns`` order.
    ``mode="append"`` inserts every record (COPY); ``mode="upsert"`` inserts or updates
    by ``key`` (the table needs a unique index on exactly those columns) through the
    staging table ``staging_table`` (default ``<table>_absflow_staging``, created on
    first use). ``if_exists`` (append mode): ``"fail"`` refuses to start fresh on a
    table that holds rows, ``"append"`` adds to them.
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
        if_exists: str = "fail",
        staging_table: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"PostgresSink: mode must be one of {MODES}, got {mode!r}")
        if mode == "upsert" and not key:
            raise ValueError("PostgresSink: mode='upsert' needs key=[column, ...]")
        if if_exists not in IF_EXISTS:
            raise ValueError(
                f"PostgresSink: if_exists must be one of {IF_EXISTS}, got {if_exists!r}"
            )
        missing = [k for k in key if k not in columns]
        if missing:
            raise ValueError(f"PostgresSink: key columns {missing} are not in columns")
        self.dsn, self.table, self.columns = dsn, table, list(columns)
        self.mode, self.key = mode, list(key)
        self.exactly_once = exactly_once
        self.connect_timeout_s = connect_timeout_s
        self.if_exists = if_exists
        self.staging = staging_table or pg_sql.staging_name(table)
        self.owners = pg_sql.owners_name(table)
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
            f"database {info.get('dbname', '?')!r} as user {info.get('user', '(default)')!r}"
        )

    def connect(self, autocommit: bool) -> Any:
        import psycopg

        try:
            return psycopg.connect(
                self.dsn, autocommit=autocommit, connect_timeout=self.connect_timeout_s
            )
        except psycopg.OperationalError as err:
            text = str(err).strip()
            fix = (
                "fix the user or password in the DSN (or the server's pg_hba.conf)"
                if "authentication failed" in text or "password" in text
                else "start the server or fix the DSN (host, port, user, password)"
            )
            raise ConnectorError(
                f"PostgreSQL sink: cannot connect to {self.where()}: {text}; {fix}"
            ) from err

    def validate(self, step_name: str) -> None:
        """Offline (explain() and run() call it; the server may be down): the DSN parses."""
        from psycopg.conninfo import conninfo_to_dict

        try:
            conninfo_to_dict(self.dsn)
        except Exception as err:
            raise ConnectorError(
                f"sink '{step_name}': the PostgreSQL DSN does not parse: {err}; write it as "
                f"'postgresql://user:password@host:port/dbname' or 'host=... dbname=...'"
            ) from err

    def check_system(self, step_name: str) -> None:
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
        have = pg_sql.columns_of(conn, self.table)
        missing = [c for c in self.columns if c not in have]
        if missing:
            raise ConnectorError(
                f"{where} has no column(s) {missing} (it has {sorted(have)}); "
                f"ALTER TABLE to add them or change the sink's columns"
            )
        if self.mode == "upsert":
            if not any(cols == set(self.key) for cols in pg_sql.unique_keys(conn, self.table)):
                raise ConnectorError(
                    f"{where} has no unique index on {self.key} (needed by upsert); "
                    f"add PRIMARY KEY or UNIQUE ({', '.join(self.key)})"
                )
            if (
                self.exactly_once
                and conn.execute("SELECT to_regclass(%s)", [self.staging]).fetchone()[0] is not None
            ):
                staged = pg_sql.columns_of(conn, self.staging)
                lost = [c for c in [*self.columns, pg_sql.TXN_COL] if c not in staged]
                if lost:
                    raise ConnectorError(
                        f"sink '{step_name}': staging table {self.staging!r} in {self.where()} "
                        f"has no column(s) {lost}; drop it when no job runs (the sink "
                        f"recreates it like {self.table!r})"
                    )
        if self.exactly_once:
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
        # one fence connection per thread (the task loop seals, the committer commits)
        self._fence = threading.local()
        self._fence_conns: list[Any] = []
        pg_sql.ensure_owners(self._fence_conn(), self.owners)
        if self.mode == "upsert":
            pg_sql.ensure_staging(self._conn, self.table, self.staging, self.columns)

    # -- the attempt fence -----------------------------------------------------------------
    def _fence_conn(self) -> Any:
        """This thread's fence connection (autocommit; its transactions hold the owner row)."""
        conn = getattr(self._fence, "conn", None)
        if conn is None or conn.closed:
            conn = self.connect(autocommit=True)
            conn.execute(f"SET idle_in_transaction_session_timeout = '{FENCE_IDLE_TIMEOUT_S}s'")
            self._fence.conn = conn
            self._fence_conns.append(conn)
        return conn

    @contextlib.contextmanager
    def owner_lock(self) -> Iterator[None]:
        """A transaction on this thread's fence connection that reads the owner row (share
        lock; `owner` returns what it read) and holds it until the seal, commit or claim
        is done (a claim's update takes the row exclusively). Two round trips per seal or
        commit: the barrier waits for them."""
        if not self.exactly_once:
            yield
            return
        conn = self._fence_conn()
        self._fence.owner = pg_sql.begin_reading_owner(conn, self.owners, self.txn_id(0).owner)
        self._fence.locked = True
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")
        finally:
            self._fence.locked = False

    def claim(self, epoch: Epoch) -> None:
        if self.exactly_once:
            pg_sql.claim_owner(self._fence_conn(), self.owners, self.txn_id(0).owner, str(epoch))

    def owner(self) -> Epoch | None:
        """Under ``owner_lock``: the owner it read (and holds); else the owner now."""
        if not self.exactly_once:
            return None
        if getattr(self._fence, "locked", False):
            return Epoch.parse(self._fence.owner)
        return Epoch.parse(pg_sql.read_owner(self._fence_conn(), self.owners, self.txn_id(0).owner))

    def write_batch(self, records: list[Any]) -> None:
        if self.exactly_once:
            super().write_batch(records)
        else:  # autocommit: visible at once
            rows = self._rows(records)
            self._fit(
                pg_sql.copy_rows
                if self.mode == "append"
                else lambda c, t, cols, r: pg_sql.upsert_rows(c, t, cols, self.key, r),
                self._conn,
                self.table,
                rows,
            )

    def begin_transaction(self, txn_id: TxnId) -> _Txn:
        return _Txn(str(txn_id))

    def write_to_transaction(self, txn: _Txn, records: list[Any]) -> None:
        rows = self._rows(records)
        if not rows:
            return
        if self.mode == "upsert":
            gid = txn.gid
            self._fit(
                lambda c, t, cols, r: pg_sql.stage_rows(c, t, cols, gid, r),
                self._conn,
                self.staging,
                rows,
            )
        else:
            self._fit(pg_sql.copy_rows, self._conn, self.table, rows)
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

    def _fit(self, write: Any, conn: Any, table: str, rows: list[tuple[Any, ...]]) -> None:
        """Run ``write``; rows the table refuses raise a ConnectorError naming it."""
        import psycopg

        try:
            write(conn, table, self.columns, rows)
        except (psycopg.DataError, psycopg.ProgrammingError, psycopg.IntegrityError) as err:
            raise ConnectorError(
                f"PostgreSQL sink '{self.ctx.step_name}': rows do not fit table "
                f"{self.table!r} ({self.columns}): {str(err).strip()}; fix the records "
                f"(a map before the sink) or the table's column types"
            ) from err

    def pre_commit(self, txn: _Txn, checkpoint_id: int) -> Handle:
        from psycopg import sql

        if not self.exactly_once or txn.rows == 0:
            return None  # nothing to commit: no prepared transaction either
        self._conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(txn.gid)))
        return txn.gid

    def commit(self, checkpoint_id: int, handle: Handle) -> None:
        if handle is None:
            return
        if self._commit_conn is None or self._commit_conn.closed:
            self._commit_conn = self.connect(autocommit=True)
        conn = self._commit_conn
        if isinstance(handle, dict):  # a checkpoint of an older version: the rows themselves
            with conn.transaction():
                pg_sql.upsert_rows(conn, self.table, self.columns, self.key, handle["rows"])
            return
        self._finish_prepared(conn, "COMMIT", str(handle))
        if self.mode == "upsert":
            self._merge(conn, str(handle))

    def _merge(self, conn: Any, gid: str) -> None:
        import psycopg

        try:
            pg_sql.merge(conn, self.table, self.staging, self.columns, self.key, gid)
        except (psycopg.DataError, psycopg.IntegrityError) as err:
            raise ConnectorError(
                f"PostgreSQL sink '{self.ctx.step_name}': the rows of {gid} do not fit table "
                f"{self.table!r}: {str(err).strip()}; they wait in {self.staging!r} (nothing "
                f"is lost): fix the table's constraints and restart, the merge runs again"
            ) from err

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

    def abort_uncovered(self, restored: SinkSnapshot) -> None:
        """Roll back this subtask's other prepared transactions; settle staged upserts."""
        if not self.exactly_once:
            return
        checkpoint_id, pending = restored.checkpoint, restored.pending
        keep = [str(h) for _, h in pending if isinstance(h, str)]
        conn = self.connect(autocommit=True)
        try:
            lingering = [gid for gid in self.prepared(conn) if gid not in keep]
            for gid in lingering:
                self._finish_prepared(conn, "ROLLBACK", gid)
            if self.mode == "upsert":
                self._settle_staged(conn, keep, checkpoint_id)
        finally:
            conn.close()
        if pending or lingering:
            log.info(
                "sink '%s'[%d]: restore from checkpoint %s committed %d and rolled back %d "
                "prepared transaction(s)",
                self.ctx.step_name,
                self.ctx.subtask,
                checkpoint_id,
                len(keep),
                len(lingering),
            )

    def _settle_staged(self, conn: Any, keep: list[str], checkpoint_id: int | None) -> None:
        """Staged rows of committed epochs the restored snapshot does not list: merged in
        order if the restored checkpoint covers them, dropped (the sources replay them) if not."""
        staged = [
            (txn.checkpoint_id, gid)
            for gid in pg_sql.staged_txns(conn, self.staging, self.txn_id(0).owner)
            if gid not in keep and (txn := TxnId.parse(gid)) is not None
        ]
        for n, gid in sorted(staged):
            if checkpoint_id is not None and n <= checkpoint_id:
                self._merge(conn, gid)
            else:
                pg_sql.drop_staged(conn, self.staging, gid)

    def other_runs_output(self) -> OtherRunsOutput | None:
        """Append mode with ``if_exists="fail"``: any row. Rows of this run's earlier
        attempts are not another run's (a restart without a checkpoint: at-least-once
        rows may be in before any checkpoint); upserts overwrite by key."""
        if self.ctx.attempt > 0 or self.mode != "append" or self.if_exists != "fail":
            return None
        conn = self.connect(autocommit=True)
        try:
            earlier = pg_sql.has_rows(conn, self.table)
        finally:
            conn.close()
        if not earlier:
            return None
        return OtherRunsOutput(
            f"PostgreSQL table {self.table!r} in {self.where()} already holds rows (from an "
            f"earlier run or another job)",
            f"empty the table (TRUNCATE {self.table}), write to another table, or pass "
            f"if_exists='append' to add to them",
        )

    def close(self) -> None:
        try:
            super().close()
        finally:
            fences = getattr(self, "_fence_conns", [])
            for conn in (self._conn, self._commit_conn, *fences):
                if conn is not None and not conn.closed:
                    conn.close()  # an open, unprepared epoch is rolled back

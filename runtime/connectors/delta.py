"""Delta Lake sink (deltalake / delta-rs): one table commit per checkpoint, exactly once.

Each sink subtask is a Delta *application* with id ``absflow:<job>:<step>:<subtask>``
(`runtime.transactions.TxnId.owner`). Its commit for checkpoint n carries the
application transaction (app id, version = n) in the same atomic log entry as the
data, so the table itself records how far each subtask got: a commit replayed after a
restore finds ``transaction_version(app_id) >= n`` and is skipped.

Fenced by attempt (`runtime.transactions.Epoch`) through Delta's own optimistic
concurrency: a restore claims the subtask with a commit (no data) whose application
transaction ``<app id>:owner`` gets the next version; every data commit reads that
version (it must still be the one this attempt claimed) and carries it again, so a claim
that lands between the check and the commit makes the commit conflict (delta-rs refuses
a commit when a concurrent one changed an application id it carries) and the stale
attempt fails (`StaleAttemptError`). Seals are checked against the same version. A table
that does not exist yet is created by the claim when the sink has a ``schema``; without
one the fence starts with the table's first commit.

Pre-commit seals the epoch's rows as Arrow IPC (zstd) bytes, which travel in the
checkpoint; the commit (committer thread) appends them. A fresh start (no restored
checkpoint) refuses a table that already holds commits of its application id: those
came from another run of a job with this name, and skipping "already committed"
versions would lose data.
"""

from __future__ import annotations

import io
import threading
from typing import Any

from runtime.errors import ConnectorError
from runtime.sinks import OtherRunsOutput, SinkContext, TwoPhaseCommitSink
from runtime.transactions import Epoch, StaleAttemptError, TxnId

OWNER_KEY = "absflow.owner"  # the claim commit's metadata: the epoch that claimed
FENCE_KEY = "absflow.fence"  # ... and which fence version it claimed


class DeltaSink(TwoPhaseCommitSink[list[Any], bytes | None]):
    """Records (dicts) appended to the Delta table at ``uri`` (created on first commit).

    ``schema`` (a ``pyarrow.Schema``) fixes the column types; without it they are
    inferred per epoch. ``storage_options`` go to delta-rs (e.g. S3 endpoint, keys).
    """

    commit_off_loop = True
    skip_replayed = True  # off only to show what the application transaction prevents

    def __init__(
        self,
        uri: str,
        schema: Any = None,
        partition_by: list[str] | None = None,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.uri, self.schema, self.partition_by = uri, schema, partition_by
        self.storage_options = storage_options

    @property
    def app_id(self) -> str:
        return self.txn_id(0).owner

    def _table(self) -> Any:
        """The table, or None if it does not exist yet."""
        from deltalake import DeltaTable

        try:
            if not DeltaTable.is_deltatable(self.uri, storage_options=self.storage_options):
                return None
            return DeltaTable(self.uri, storage_options=self.storage_options)
        except OSError as err:
            raise ConnectorError(
                f"Delta sink: cannot read table {self.uri}: {err}; check the path and the "
                f"storage options (endpoint, credentials)"
            ) from err

    @property
    def fence_id(self) -> str:
        """The application id whose version names the owning attempt's claim."""
        return f"{self.app_id}:owner"

    def check_system(self, step_name: str) -> None:
        table = self._table()
        if table is None or self.schema is None:
            return
        import pyarrow as pa

        have = pa.schema(table.schema().to_arrow())
        missing = [f.name for f in self.schema if f.name not in have.names]
        if missing:
            raise ConnectorError(
                f"sink '{step_name}': Delta table {self.uri} has no column(s) {missing} "
                f"(it has {have.names}); write to a new table or change the sink's schema"
            )

    def open(self, ctx: SinkContext) -> None:
        super().open(ctx)
        import pyarrow.ipc  # noqa: F401 - here, not in the first checkpoint's pre-commit

        self.check_system(ctx.step_name)
        self._claimed: int | None = None  # the fence version this attempt claimed
        self._seen = threading.local()  # the table as the owner check read it (per thread)

    # -- the attempt fence -----------------------------------------------------------------
    def claim(self, epoch: Epoch) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.exceptions import CommitFailedError

        for _ in range(5):  # a data commit of an older attempt may race the claim
            table = self._table()
            if table is None and self.schema is None:
                return  # nothing to claim in yet: the fence starts with the first commit
            version = 1 if table is None else (table.transaction_version(self.fence_id) or 0) + 1
            properties = CommitProperties(
                app_transactions=[Transaction(self.fence_id, version)],
                custom_metadata={OWNER_KEY: str(epoch), FENCE_KEY: f"{self.fence_id}@{version}"},
            )
            try:
                if table is None:
                    DeltaTable.create(
                        self.uri,
                        self.schema,
                        mode="append",
                        partition_by=self.partition_by,
                        storage_options=self.storage_options,
                        commit_properties=properties,
                    )
                else:
                    table.create_write_transaction(
                        [],
                        mode="append",
                        schema=table.schema(),
                        partition_by=table.metadata().partition_columns or None,
                        commit_properties=properties,
                    )
            except CommitFailedError:
                continue
            self._claimed = version
            return
        raise ConnectorError(
            f"Delta sink '{self.ctx.step_name}': could not claim {self.uri} for attempt "
            f"{epoch} (5 concurrent commits in a row); is another job writing as {self.app_id!r}?"
        )

    def owner(self) -> Epoch | None:
        table = self._seen.table = self._fresh_table()
        version = None if table is None else table.transaction_version(self.fence_id)
        if version is None:
            return None
        if version == self._claimed:
            return self.ctx.epoch
        return self._claimant(table, version)

    def _fresh_table(self) -> Any:
        """This thread's table brought up to the newest version (reads only the log entries
        written since its last look, not the whole log), or None if none exists yet."""
        table = getattr(self._seen, "cached", None)
        if table is None:
            table = self._seen.cached = self._table()
        else:
            table.update_incremental()
        return table

    def _claimant(self, table: Any, version: int) -> Epoch:
        """The epoch whose claim commit set the fence to ``version`` (from the log)."""
        mark = f"{self.fence_id}@{version}"
        for entry in table.history(100):
            if entry.get(FENCE_KEY) == mark:
                found = Epoch.parse(entry.get(OWNER_KEY))
                if found is not None:
                    return found
        return Epoch(f"(claim {version} of {self.fence_id})", -1)

    def begin_transaction(self, txn_id: TxnId) -> list[Any]:
        return []

    def write_to_transaction(self, txn: list[Any], records: list[Any]) -> None:
        txn.extend(records)

    def pre_commit(self, txn: list[Any], checkpoint_id: int) -> bytes | None:
        self._seen.__dict__.pop("table", None)  # read by the seal's owner check: not needed
        if not txn:
            return None
        import pyarrow as pa

        try:
            batch = pa.Table.from_pylist(txn, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
            raise ConnectorError(
                f"Delta sink '{self.ctx.step_name}': records do not fit the schema of "
                f"{self.uri}: {err}; fix the records or the sink's schema"
            ) from err
        out = io.BytesIO()
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_stream(out, batch.schema, options=options) as writer:
            writer.write_table(batch)
        return out.getvalue()

    def commit(self, checkpoint_id: int, handle: bytes | None) -> None:
        if handle is None:
            return
        import pyarrow as pa
        from deltalake import CommitProperties, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError

        # The table as the fence check read it (a fenced commit): the data commit is
        # based on that version, so a claim committed since makes it conflict.
        table = self._seen.__dict__.pop("table", None) or self._table()
        if table is not None and self.skip_replayed:
            done = table.transaction_version(self.app_id)
            if done is not None and done >= checkpoint_id:
                return  # committed before (a replay after a restore)
        data = pa.ipc.open_stream(pa.BufferReader(handle)).read_all()
        txns = [Transaction(self.app_id, checkpoint_id)]
        if self._claimed is not None:
            txns.append(Transaction(self.fence_id, self._claimed))
        try:
            write_deltalake(
                self.uri if table is None else table,
                data,
                mode="append",
                partition_by=self.partition_by,
                storage_options=self.storage_options if table is None else None,
                commit_properties=CommitProperties(
                    app_transactions=txns,
                    custom_metadata={"absflow.checkpoint": str(checkpoint_id)},
                ),
            )
        except CommitFailedError:
            self._raise_if_claimed_since(checkpoint_id)
            raise  # another conflict: the committer retries

    def _raise_if_claimed_since(self, checkpoint_id: int) -> None:
        table = self._table()
        version = None if table is None else table.transaction_version(self.fence_id)
        if version is not None and version != self._claimed:
            owner = self._claimant(table, version)
            raise StaleAttemptError(
                f"sink '{self.ctx.step_name}'[{self.ctx.subtask}] of attempt "
                f"{self.ctx.attempt} will not commit checkpoint {checkpoint_id}: attempt "
                f"{owner.attempt} of run {owner.run} claimed {self.uri} while it committed "
                f"(this task belongs to a failed attempt and ends now)"
            )

    # Nothing outside the table to abort on a restore (the default ``abort_uncovered``):
    # an uncommitted epoch exists only in the snapshot (or nowhere).

    def other_runs_output(self) -> OtherRunsOutput | None:
        table = self._table()
        done = None if table is None else table.transaction_version(self.app_id)
        if done is None:
            return None
        return OtherRunsOutput(
            f"Delta table {self.uri} already holds commits of application {self.app_id!r} "
            f"up to checkpoint {done}, written by another run of job {self.ctx.job!r}",
            f"give the job (or this sink step) another name (a fresh start would skip "
            f"its checkpoints <= {done})",
        )

"""Delta Lake sink (deltalake / delta-rs): one table commit per checkpoint, exactly once.

Each sink subtask is a Delta *application* with id ``absflow:<job>:<step>:<subtask>``
(`runtime.transactions.TxnId.owner`). Its commit for checkpoint n carries the
application transaction (app id, version = n) in the same atomic log entry as the
data, so the table itself records how far each subtask got: a commit replayed after a
restore finds ``transaction_version(app_id) >= n`` and is skipped.

Pre-commit seals the epoch's rows as Arrow IPC (zstd) bytes, which travel in the
checkpoint; the commit (committer thread) appends them. A fresh start (no restored
checkpoint) refuses a table that already holds commits of its application id: those
came from another run of a job with this name, and skipping "already committed"
versions would lose data.
"""

from __future__ import annotations

import io
from typing import Any

from runtime.errors import ConnectorError
from runtime.sinks import OtherRunsOutput, SinkContext, TwoPhaseCommitSink
from runtime.transactions import TxnId


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

    def begin_transaction(self, txn_id: TxnId) -> list[Any]:
        return []

    def write_to_transaction(self, txn: list[Any], records: list[Any]) -> None:
        txn.extend(records)

    def pre_commit(self, txn: list[Any], checkpoint_id: int) -> bytes | None:
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

        table = self._table()
        if table is not None and self.skip_replayed:
            done = table.transaction_version(self.app_id)
            if done is not None and done >= checkpoint_id:
                return  # committed before (a replay after a restore)
        data = pa.ipc.open_stream(pa.BufferReader(handle)).read_all()
        write_deltalake(
            self.uri if table is None else table,
            data,
            mode="append",
            partition_by=self.partition_by,
            storage_options=self.storage_options if table is None else None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(self.app_id, checkpoint_id)],
                custom_metadata={"absflow.checkpoint": str(checkpoint_id)},
            ),
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

"""Parquet part-file sink (Flink's FileSink for bulk formats), exactly once.

Each subtask writes its records into in-progress files under ``<dir>/.inprogress/``
(hidden: Spark, pyarrow and pandas skip names starting with '.'), rolling to a new file
when one reaches ``roll_size_bytes`` or ``roll_interval_s``. At a barrier the open
file is closed (Parquet cannot be appended to) and the epoch's files become pending;
when the checkpoint completes they are renamed to their final names
``part-<job>-<subtask>-<checkpoint>-<seq>.parquet`` in ``<dir>``, where readers see
them. A rename whose source is gone and whose target exists was done before, so
commits are idempotent. A restore commits the restored checkpoint's files, deletes
this subtask's in-progress leftovers and the final files of later checkpoints (their
records are replayed).

Fenced by attempt (`runtime.transactions.Epoch`) like the `FileSink`: a restore claims
the subtask by writing its epoch to ``<dir>/.inprogress/.owner-<subtask>``, and every
seal and commit (the renames) first checks that marker. On a local or mounted directory
the claim and each check-and-commit hold an exclusive flock on
``.inprogress/.lock-<subtask>``, so a commit racing the claim either ends before it or
finds the new owner; an object store has no such lock, so there the check narrows the
window but a commit already past it can still finish. In-progress files carry their
attempt (``...-a<attempt>.parquet``): two attempts never write one file.
"""

from __future__ import annotations

import contextlib
import fcntl
import posixpath
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.errors import ConnectorError
from runtime.sinks import OtherRunsOutput, SinkContext, SinkSnapshot, TwoPhaseCommitSink
from runtime.transactions import Epoch, TxnId, _clean

HIDDEN = ".inprogress"


@dataclass
class _Epoch:
    txn: TxnId
    closed: list[str] = field(default_factory=list)  # in-progress paths, rolled
    writer: Any = None
    stream: Any = None
    path: str = ""
    opened_at: float = 0.0


Renames = Sequence[Sequence[str]]  # [in-progress path, final path] of each file


class ParquetSink(TwoPhaseCommitSink[_Epoch, Renames | None]):
    """Records (dicts) into Parquet part files under ``directory`` (a path or fsspec URL).

    ``schema`` (a ``pyarrow.Schema``) fixes the column types (else inferred from the
    first batch). ``storage_options`` go to fsspec (e.g. S3 endpoint and keys).
    """

    commit_off_loop = True

    def __init__(
        self,
        directory: str,
        schema: Any = None,
        roll_size_bytes: int = 128 * 1024 * 1024,
        roll_interval_s: float = 600.0,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.directory, self.schema = directory.rstrip("/"), schema
        self.roll_size_bytes, self.roll_interval_s = roll_size_bytes, roll_interval_s
        self.storage_options = storage_options or {}
        self.fs: Any = None
        self.root = ""

    def _open_fs(self) -> None:
        import fsspec

        self.fs, self.root = fsspec.core.url_to_fs(self.directory, **self.storage_options)
        self.root = self.root.rstrip("/")

    def check_system(self, step_name: str) -> None:
        """The output directory can be created (a local one is); an object store's bucket
        must exist already (the sink does not create buckets)."""
        self._open_fs()
        bucket = self.root.split("/", 1)[0]
        if "file" not in self.fs.protocol and not self._bucket_exists(bucket):
            raise ConnectorError(
                f"sink '{step_name}': the bucket {bucket!r} of the Parquet output "
                f"{self.directory} does not exist; create it or fix the URL"
            )
        try:
            self.fs.makedirs(posixpath.join(self.root, HIDDEN), exist_ok=True)
        except Exception as err:
            raise ConnectorError(
                f"sink '{step_name}': cannot create the Parquet output directory "
                f"{self.directory}: {err}; check the path, bucket and credentials"
            ) from err

    def _bucket_exists(self, bucket: str) -> bool:
        try:
            self.fs.info(bucket)  # raises, unlike exists(), when the credentials are wrong
        except FileNotFoundError:
            return False
        except Exception:
            return True  # not allowed to look (or wrong keys): the write below names it
        return True

    def open(self, ctx: SinkContext) -> None:
        super().open(ctx)
        import pyarrow.parquet  # noqa: F401 - here, not in the first epoch's write

        self.check_system(ctx.step_name)
        self.prefix = f"part-{_clean(ctx.job)}-{ctx.subtask}-"

    # -- the attempt fence -----------------------------------------------------------------
    def _fence_path(self, kind: str) -> str:
        return posixpath.join(self.root, HIDDEN, f".{kind}-{self.ctx.subtask}")

    def claim(self, epoch: Epoch) -> None:
        self.fs.pipe_file(self._fence_path("owner"), str(epoch).encode())

    def owner(self) -> Epoch | None:
        try:
            return Epoch.parse(self.fs.cat_file(self._fence_path("owner")).decode())
        except FileNotFoundError:
            return None

    @contextlib.contextmanager
    def owner_lock(self) -> Iterator[None]:
        """An exclusive flock on ``.inprogress/.lock-<subtask>`` where the output is a local
        (or mounted) directory; nothing on an object store (see the module's docstring)."""
        if "file" not in self.fs.protocol:
            yield
            return
        with open(self._fence_path("lock"), "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -- writing ---------------------------------------------------------------------------
    def begin_transaction(self, txn_id: TxnId) -> _Epoch:
        return _Epoch(txn_id)

    def write_to_transaction(self, txn: _Epoch, records: list[Any]) -> None:
        if not records:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pa.Table.from_pylist(records, schema=self.schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
            raise ConnectorError(
                f"Parquet sink '{self.ctx.step_name}': records do not fit the schema of "
                f"{self.directory}: {err}; fix the records or the sink's schema"
            ) from err
        if self.schema is None:
            self.schema = table.schema
        if txn.writer is None:
            seq = len(txn.closed)
            txn.path = posixpath.join(
                self.root,
                HIDDEN,
                f"{self.prefix}{txn.txn.checkpoint_id}-{seq}-a{self.ctx.attempt}.parquet",
            )
            txn.stream = self.fs.open(txn.path, "wb")
            txn.writer = pq.ParquetWriter(txn.stream, self.schema)
            txn.opened_at = time.monotonic()
        txn.writer.write_table(table)
        if (
            txn.stream.tell() >= self.roll_size_bytes
            or time.monotonic() - txn.opened_at >= self.roll_interval_s
        ):
            self._roll(txn)

    def _roll(self, txn: _Epoch) -> None:
        if txn.writer is None:
            return
        txn.writer.close()
        txn.stream.close()
        txn.closed.append(txn.path)
        txn.writer = txn.stream = None

    def pre_commit(self, txn: _Epoch, checkpoint_id: int) -> Renames | None:
        self._roll(txn)
        if not txn.closed:
            return None
        name = posixpath.basename
        final = [
            [path, posixpath.join(self.root, f"{self.prefix}{checkpoint_id}-{i}.parquet")]
            for i, path in enumerate(txn.closed)
        ]
        assert all(name(p).startswith(self.prefix) for p, _ in final)
        return final

    # -- committing ------------------------------------------------------------------------
    def commit(self, checkpoint_id: int, handle: Renames | None) -> None:
        for src, dst in handle or ():
            if self.fs.exists(src):
                self.fs.mv(src, dst)
            elif not self.fs.exists(dst):
                raise ConnectorError(
                    f"Parquet sink '{self.ctx.step_name}': in-progress file {src} of "
                    f"checkpoint {checkpoint_id} is gone and {dst} does not exist; "
                    f"the directory {self.directory} was changed outside absflow"
                )

    def _ours(self, folder: str) -> list[tuple[str, int]]:
        """(path, checkpoint) of this subtask's files in ``folder``."""
        found = []
        for path in self.fs.ls(folder, detail=False):
            base = posixpath.basename(path)
            if base.startswith(self.prefix) and base.endswith(".parquet"):
                found.append((path, int(base[len(self.prefix) :].split("-")[0])))
        return found

    def other_runs_output(self) -> OtherRunsOutput | None:
        finals = self._ours(self.root)
        if not finals:
            return None
        return OtherRunsOutput(
            f"the Parquet output {self.directory} already holds part files of job "
            f"{self.ctx.job!r} (e.g. {finals[0][0]}) from another run",
            "write to another directory",
        )

    def abort_uncovered(self, restored: SinkSnapshot) -> None:
        checkpoint_id = restored.checkpoint
        for path, n in self._ours(self.root):
            if checkpoint_id is not None and n > checkpoint_id:
                self.fs.rm(path)  # committed after the restored checkpoint: replayed
        for path, _ in self._ours(posixpath.join(self.root, HIDDEN)):
            self.fs.rm(path)  # in-progress leftovers of earlier attempts

    def close(self) -> None:
        super().close()
        txn = self.current
        if isinstance(txn, _Epoch) and txn.writer is not None:
            self._roll(txn)
            for path in txn.closed:
                self.fs.rm(path)

"""Checkpoint storage: every path and every byte of a checkpoint root.

::

    root/
      chk-7/                 one directory per checkpoint
        count[0].state       one state file per task (statebackend.snapshot format)
        count[1].state
        _metadata            CheckpointMetadata JSON, written LAST
      shared/count[0]/...    chain files of incremental keyed state (statebackend.shared)

A task state of at most ``inline_threshold`` bytes is not a file: the same bytes go
inline in the ack and ``_metadata`` (Flink's ``state.storage.fs.memory-threshold``):
no file to create, fsync and later delete (a PUT and a DELETE on an object store).

A checkpoint counts as completed only once its ``_metadata`` exists; a ``chk-<n>``
directory without one is in progress or was aborted. Writers: each task writes its
own state file (`write_task_state`, as a part: ``_metadata`` publishes it, so a kill
half-way may leave a partial one in an incomplete checkpoint, and one fsync makes it
durable); the coordinator writes ``_metadata`` (`write_metadata`, atomically) after
every task acknowledged, and alone calls `retain`/`discard`.
All I/O goes through a `statebackend.fs.FileSystem`; a storage is its ``root`` and the
job's ``storage_options``. On an object store (``s3://bucket/prefix``) "directories" are
key prefixes: nothing is renamed, ``_metadata`` is one PUT, `discard` removes a prefix.
"""

from __future__ import annotations

import contextlib
import enum
import io
import logging
import re
import uuid
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from statebackend.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    CorruptStateError,
    StorageUsageError,
)
from statebackend.fs import FileSystem, filesystem_for
from statebackend.incremental import StateRef
from statebackend.metadata import CheckpointMetadata, OperatorLayout, TaskStateHandle
from statebackend.snapshot import (
    EncodedSnapshot,
    OperatorSnapshot,
    encode_task_snapshot,
    joined,
    keyed_state_streams,
    read_keyed_state,
    read_operator_state,
    verify_state_file,
    write_chunks,
)

log = logging.getLogger("absflow.statebackend")


def _inline(encoded: EncodedSnapshot, layout: Mapping[str, OperatorLayout]) -> TaskStateHandle:
    data = joined(encoded.chunks)
    return TaskStateHandle("", encoded.size, zlib.crc32(data), dict(layout), data)


METADATA = "_metadata"
_CHK = re.compile(r"chk-(\d+)")
_LIST_HINT = "list the checkpoints with `python -m jobmanager checkpoints DIR`"


class CheckpointStatus(enum.Enum):
    COMPLETED = "completed"  # _metadata verifies, every state file matches it
    INCOMPLETE = "incomplete"  # no _metadata: in progress, or aborted
    CORRUPT = "corrupt"  # _metadata or a state file fails its checks


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """One ``chk-<n>`` directory: its status, its metadata when readable, and the
    problem (None when completed)."""

    checkpoint_id: int
    status: CheckpointStatus
    metadata: CheckpointMetadata | None
    problem: str | None


class CheckpointStorage:
    """The checkpoints of one job under ``root`` (a path, ``file://`` or fsspec URL opened
    with ``storage_options``). No I/O in the constructor; a missing root has none."""

    def __init__(
        self,
        root: str,
        fs: FileSystem | None = None,
        storage_options: Mapping[str, Any] | None = None,
        inline_threshold: int = 0,
        compression: bool = False,
    ) -> None:
        """``inline_threshold``: task states of at most this many bytes are held inline in
        the ack and ``_metadata`` instead of a state file (0: always a file).
        ``compression``: task states written are lz4-compressed section by section
        (``JobConfig.snapshot_compression``); reading takes either."""
        if fs is None:
            fs, root = filesystem_for(root, storage_options)
        self.fs: FileSystem = fs
        self.root: str = root
        self.storage_options = dict(storage_options or {})
        self.inline_threshold = inline_threshold
        self.compression = compression
        # Whether each checkpoint this instance wrote or read is a savepoint: retain()
        # runs at every completion and need not read the metadata it wrote.
        self._savepoint: dict[int, bool] = {}

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.root!r})"

    def exists(self) -> bool:
        """Whether the root directory exists."""
        return self.fs.is_dir(self.root)

    def probe(self) -> None:
        """Write and remove a small file under the root (creating the root): proves the
        storage writable from here. Raises what the write raised (an OSError)."""
        path = self.fs.join(self.root, f".absflow-probe-{uuid.uuid4().hex[:8]}")
        self.fs.write_whole(path, b"")
        self.fs.remove(path)

    def warm_up(self) -> None:
        """Make one request now, so that the first state write does not pay for building
        the client (for S3 that is about half a second of CPU). Errors are left to that
        write to report: it names the URL and the host."""
        with contextlib.suppress(Exception):
            self.fs.is_dir(self.root)

    def location(self, checkpoint_id: int) -> str:
        """The ``chk-<n>`` directory of a checkpoint (for messages and display)."""
        return self.fs.join(self.root, f"chk-{checkpoint_id}")

    def task_state_path(self, checkpoint_id: int, task_id: str) -> str:
        """Where task ``task_id`` writes its state file of checkpoint ``checkpoint_id``."""
        if not task_id or "/" in task_id or "\\" in task_id or task_id in (".", ".."):
            raise StorageUsageError(f"task id {task_id!r} cannot be used as a file name")
        return self.fs.join(self.location(checkpoint_id), f"{task_id}.state")

    # -- state files (tasks) ---------------------------------------------------------------
    def write_task_state(
        self,
        checkpoint_id: int,
        task_id: str,
        snapshots: Mapping[str, OperatorSnapshot],
        layout: Mapping[str, OperatorLayout],
    ) -> TaskStateHandle:
        """Write a task's state file (any thread): afterwards its bytes are durable; an
        error removes it, a kill half-way may leave part of it, which no ``_metadata``
        names. A state of at most ``inline_threshold`` bytes is not written but held in
        the handle. Returns the handle the task acknowledges with."""
        path = self.task_state_path(checkpoint_id, task_id)
        encoded = encode_task_snapshot(snapshots, compress=self.compression)
        if encoded.size <= self.inline_threshold:
            return _inline(encoded, layout)
        with self.fs.open_write_part(path) as out:  # published by _metadata
            crc = write_chunks(out, encoded.chunks)
        return TaskStateHandle(f"{task_id}.state", encoded.size, crc, dict(layout))

    def inline_handle(
        self, snapshots: Mapping[str, OperatorSnapshot], layout: Mapping[str, OperatorLayout]
    ) -> TaskStateHandle | None:
        """The handle of a state held inline, encoded now on the caller's thread, so the
        task can ack at once instead of waiting for its writer thread and its next turn.
        Only for a state of at most ``inline_threshold`` bytes before compression (it
        takes microseconds); None otherwise, or if it did not fit: `write_task_state`."""
        raw = sum(
            len(s.operator_state or b"") + len(s.keyed_state or b"") for s in snapshots.values()
        )
        if raw > self.inline_threshold:
            return None
        encoded = encode_task_snapshot(snapshots, compress=self.compression)
        return _inline(encoded, layout) if encoded.size <= self.inline_threshold else None

    def read_operator_state(
        self, checkpoint_id: int, handle: TaskStateHandle, operator: str
    ) -> bytes | None:
        """The operator-state blob of ``operator`` in a task's state, or None."""
        with self._open_state(checkpoint_id, handle) as f:
            return read_operator_state(f, operator)

    def read_keyed_state(
        self, checkpoint_id: int, handle: TaskStateHandle, operator: str, key_groups: range
    ) -> list[bytes]:
        """Keyed-state blobs of ``operator`` in a task's state overlapping ``key_groups``."""
        with self._open_state(checkpoint_id, handle) as f:
            return read_keyed_state(f, operator, key_groups)

    @contextlib.contextmanager
    def keyed_state_streams(
        self, checkpoint_id: int, handle: TaskStateHandle, operator: str, key_groups: range
    ) -> Iterator[Iterator[BinaryIO]]:
        """As `read_keyed_state`, each blob a stream (``snapshot.keyed_state_streams``),
        while the file is open."""
        with self._open_state(checkpoint_id, handle) as f:
            yield keyed_state_streams(f, operator, key_groups)

    @contextlib.contextmanager
    def _open_state(self, checkpoint_id: int, handle: TaskStateHandle) -> Iterator[BinaryIO]:
        """A task's state, from its file or from the bytes held inline (named in errors)."""
        directory = self.location(checkpoint_id)
        if handle.inline is not None:
            inline = io.BytesIO(handle.inline)
            inline.name = f"{self.fs.join(directory, METADATA)} (inline state)"
            yield inline
            return
        with self.fs.open_read(self.fs.join(directory, handle.file)) as f:
            yield f

    # -- metadata (coordinator) -------------------------------------------------------------
    def write_metadata(self, metadata: CheckpointMetadata) -> str:
        """Write ``chk-<n>/_metadata`` whole; this completes the checkpoint. Returns where."""
        path = self.fs.join(self.location(metadata.checkpoint_id), METADATA)
        self.fs.write_whole(path, metadata.to_json().encode("utf-8"))
        self._savepoint[metadata.checkpoint_id] = metadata.savepoint
        return path

    def read_metadata(self, checkpoint_id: int) -> CheckpointMetadata:
        """The verified metadata of checkpoint ``checkpoint_id``."""
        directory = self.location(checkpoint_id)
        path = self.fs.join(directory, METADATA)
        try:
            text = self.fs.read_bytes(path).decode("utf-8", errors="replace")
        except FileNotFoundError:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} is not completed: {path!r} does not exist "
                f"({self._describe(directory)}); {_LIST_HINT}"
            ) from None
        metadata = CheckpointMetadata.from_json(text, path)
        if metadata.checkpoint_id != checkpoint_id:
            raise CorruptCheckpointError(
                f"checkpoint metadata {path!r} belongs to checkpoint {metadata.checkpoint_id}, "
                f"not {checkpoint_id}; the directory was renamed or copied"
            )
        return metadata

    # -- listing and checking ----------------------------------------------------------------
    def checkpoint_ids(self) -> list[int]:
        """Ids of the ``chk-<n>`` directories, ascending (complete or not)."""
        try:
            names = self.fs.list_dirs(self.root)  # one request on an object store
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(int(m.group(1)) for name in names if (m := _CHK.fullmatch(name)))

    def completed_checkpoints(self) -> list[int]:
        """Ids of checkpoints with a ``_metadata`` file, ascending (not verified)."""
        return self._completed_among(self.checkpoint_ids())

    def _completed_among(self, ids: list[int]) -> list[int]:
        return [n for n in ids if self.fs.exists(self.fs.join(self.location(n), METADATA))]

    def check(self, checkpoint_id: int, verify_files: bool = True) -> CheckpointMetadata:
        """Verified metadata of a checkpoint whose state and chain files all exist with
        the recorded size (and, if ``verify_files``, crc32 and section checksums).
        Raises CheckpointNotFoundError or CorruptCheckpointError saying what failed."""
        metadata = self.read_metadata(checkpoint_id)
        directory = self.location(checkpoint_id)
        for task_id, handle in sorted(metadata.tasks.items()):
            if handle.inline is not None:
                self._check_inline(checkpoint_id, task_id, handle)
            else:
                path = self.fs.join(directory, handle.file)
                where = f"checkpoint {checkpoint_id}: state file {path!r} of task {task_id!r}"
                self._check_file(self.fs, path, handle.size, handle.crc32, verify_files, where)
            chain_files = {ref.path: ref for chain in handle.chains.values() for ref in chain}
            for ref in chain_files.values():  # incremental state (statebackend.incremental)
                fs, path = self.locate(ref)
                where = f"checkpoint {checkpoint_id}: chain file {path!r} of task {task_id!r}"
                self._check_file(fs, path, ref.size, ref.crc32, verify_files, where)
            for store in handle.stores.values():  # RocksDB files (statebackend.rocksdb)
                for f in store.files:
                    fs, path = self.locate(f.ref)
                    where = f"checkpoint {checkpoint_id}: store file {path!r} of task {task_id!r}"
                    self._check_raw_file(fs, path, f.ref.size, f.ref.crc32, verify_files, where)
        return metadata

    @staticmethod
    def _check_size(fs: FileSystem, path: str, size: int, where: str) -> None:
        try:
            actual = fs.size(path)
        except OSError:
            raise CorruptCheckpointError(f"{where} is missing") from None
        if actual != size:
            raise CorruptCheckpointError(f"{where} has {actual} bytes, metadata records {size}")

    @classmethod
    def _check_raw_file(
        cls, fs: FileSystem, path: str, size: int, crc: int, verify: bool, where: str
    ) -> None:
        """A file of no absflow format (a store's): its size, and with ``verify`` its crc32."""
        cls._check_size(fs, path, size, where)
        if verify:
            got = 0
            with fs.open_read(path) as f:
                while chunk := f.read(1 << 20):
                    got = zlib.crc32(chunk, got)
            if got != crc:
                raise CorruptCheckpointError(
                    f"{where}: crc32 {got:#010x}, the checkpoint recorded {crc:#010x}"
                )

    @classmethod
    def _check_file(
        cls, fs: FileSystem, path: str, size: int, crc: int, verify: bool, where: str
    ) -> None:
        """A state file of absflow's format: its size, and with ``verify`` its framing and crc32."""
        cls._check_size(fs, path, size, where)
        if verify:
            try:
                with fs.open_read(path) as f:
                    verify_state_file(f, crc)
            except CorruptStateError as err:
                raise CorruptCheckpointError(f"{where}: {err.what}") from err

    def locate(self, ref: StateRef) -> tuple[FileSystem, str]:
        """Where a chain file is: under this root, or under another one (state inherited
        from ``restore_from``, opened with the same ``storage_options``)."""
        if ref.foreign:
            return filesystem_for(ref.path, self.storage_options)
        return self.fs, self.fs.join(self.root, *ref.path.split("/"))

    def _check_inline(self, checkpoint_id: int, task_id: str, handle: TaskStateHandle) -> None:
        """The inline state of ``task_id``: its recorded size, crc32 and every section."""
        where = f"checkpoint {checkpoint_id}: the inline state of task {task_id!r}"
        if len(handle.inline or b"") != handle.size:
            raise CorruptCheckpointError(f"{where} has another size than metadata records")
        try:
            with self._open_state(checkpoint_id, handle) as f:
                verify_state_file(f, handle.crc32)
        except CorruptStateError as err:
            raise CorruptCheckpointError(f"{where}: {err.what}") from err

    def status(self, checkpoint_id: int) -> CheckpointInfo:
        """Whether checkpoint ``checkpoint_id`` is completed, incomplete or corrupt."""
        try:
            return CheckpointInfo(
                checkpoint_id, CheckpointStatus.COMPLETED, self.check(checkpoint_id), None
            )
        except CheckpointNotFoundError as err:
            return CheckpointInfo(checkpoint_id, CheckpointStatus.INCOMPLETE, None, str(err))
        except CorruptCheckpointError as err:
            try:
                readable: CheckpointMetadata | None = self.read_metadata(checkpoint_id)
            except (CheckpointNotFoundError, CorruptCheckpointError):
                readable = None
            return CheckpointInfo(checkpoint_id, CheckpointStatus.CORRUPT, readable, str(err))

    def latest_valid(self, verify_files: bool = True) -> tuple[int, CheckpointMetadata] | None:
        """The newest checkpoint that passes :meth:`check`, with its metadata.

        Newer checkpoints that fail (no ``_metadata``, bad checksum, missing or corrupt
        state file) are skipped with a WARNING on ``absflow.statebackend`` naming the
        checkpoint and why. None if no checkpoint is valid.
        """
        for checkpoint_id in reversed(self.checkpoint_ids()):
            try:
                return checkpoint_id, self.check(checkpoint_id, verify_files)
            except CheckpointNotFoundError:
                log.warning(
                    "skipping checkpoint %d in %s: no %s (incomplete or aborted)",
                    checkpoint_id,
                    self.root,
                    METADATA,
                )
            except CorruptCheckpointError as err:
                log.warning("skipping checkpoint %d in %s: %s", checkpoint_id, self.root, err)
        return None

    # -- deleting (coordinator) ------------------------------------------------------------
    def discard(self, checkpoint_id: int) -> None:
        """Delete ``chk-<n>`` (missing is fine). ``_metadata`` goes first, so a crash
        half-way leaves an incomplete checkpoint, never a completed one missing files."""
        directory = self.location(checkpoint_id)
        self._savepoint.pop(checkpoint_id, None)
        self.fs.remove(self.fs.join(directory, METADATA))
        self.fs.remove_tree(directory)

    def retain(self, keep: int) -> list[int]:
        """Keep the newest ``keep`` completed checkpoints and every savepoint; delete older
        completed ones and incomplete ``chk-*`` older than the newest completed one (newer
        ones may be in progress). Returns the deleted ids, ascending."""
        if keep < 1:
            raise StorageUsageError(f"retain(keep={keep}): keep at least 1 completed checkpoint")
        ids = self.checkpoint_ids()
        completed = self._completed_among(ids)
        if not completed:
            return []
        kept = set(completed[-keep:])
        newest = completed[-1]
        done = set(completed)
        deleted = [
            i
            for i in ids
            if i < newest and i not in kept and not (i in done and self.is_savepoint(i))
        ]
        for checkpoint_id in deleted:
            self.discard(checkpoint_id)
        return deleted

    def is_savepoint(self, checkpoint_id: int) -> bool:
        """Whether a completed checkpoint is a savepoint (unreadable metadata: it is not,
        which only makes it a candidate for deletion like any other broken checkpoint)."""
        known = self._savepoint.get(checkpoint_id)
        if known is not None:
            return known
        try:
            savepoint = self.read_metadata(checkpoint_id).savepoint
        except (CheckpointNotFoundError, CorruptCheckpointError):
            return False
        self._savepoint[checkpoint_id] = savepoint
        return savepoint

    def savepoints(self) -> list[int]:
        """Ids of the completed savepoints, ascending."""
        return [n for n in self.completed_checkpoints() if self.is_savepoint(n)]

    # -- restore_from ------------------------------------------------------------------------
    @staticmethod
    def resolve(
        path: str, storage_options: Mapping[str, Any] | None = None
    ) -> tuple[CheckpointStorage, int]:
        """Resolve ``run(restore_from=PATH)`` (a path or URL, as for the constructor).

        PATH may be a ``chk-<n>`` directory (or its ``_metadata`` file): that checkpoint,
        which must be complete and intact; or a checkpoint root: its latest valid
        checkpoint. Raises CheckpointNotFoundError / CorruptCheckpointError.
        """
        fs, path = filesystem_for(path, storage_options)
        parent, name = _split(path)
        if name == METADATA and fs.exists(path) and not fs.is_dir(path):
            path = parent
            parent, name = _split(path)
        if not fs.is_dir(path):
            what = "is not a directory" if fs.exists(path) else "does not exist"
            raise CheckpointNotFoundError(
                f"cannot restore from {path!r}: it {what}; pass a checkpoint root or a "
                f"chk-<n> directory in it ({_LIST_HINT})"
            )
        m = _CHK.fullmatch(name)
        if m:
            storage = CheckpointStorage(parent, fs, storage_options)
            checkpoint_id = int(m.group(1))
            storage.check(checkpoint_id)
            return storage, checkpoint_id
        storage = CheckpointStorage(path, fs, storage_options)
        found = storage.latest_valid()
        if found is None:
            raise CheckpointNotFoundError(
                f"cannot restore from {path!r}: no valid checkpoint in it "
                f"({storage._describe(path)}); pass a root holding chk-<n>/_metadata "
                f"({_LIST_HINT})"
            )
        return storage, found[0]

    def _describe(self, directory: str) -> str:
        try:
            names = sorted(self.fs.list_dir(directory))
        except FileNotFoundError:
            return "the directory does not exist"
        except NotADirectoryError:
            return "it is a file, not a directory"
        if not names:
            return "the directory is empty"
        shown = ", ".join(names[:8]) + (f", … ({len(names)} entries)" if len(names) > 8 else "")
        return f"it holds: {shown}"

    # Last in the class: a method named ``list`` shadows the builtin in annotations below it.
    def list(self) -> list[CheckpointInfo]:
        """Every ``chk-<n>`` directory with its status, ascending by id."""
        return [self.status(n) for n in self.checkpoint_ids()]


def _split(path: str) -> tuple[str, str]:
    """(parent, last name) of a path, ignoring a trailing separator."""
    stripped = path.rstrip("/") or path
    parent, _, name = stripped.rpartition("/")
    return parent or "/", name

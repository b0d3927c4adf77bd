"""Chain files of incremental checkpoints under ``<root>/shared/``: writing and reading
them, checking a checkpoint's chains, and deleting them when no checkpoint needs them.

Who deletes what (Flink's ``SharedStateRegistry``): a chain file is referenced by every
checkpoint whose chain holds it, and it is made before any of them completes. The
coordinator's `SharedStateRegistry` counts, for every completed checkpoint it knows,
the files it refers to; when retention deletes a checkpoint, a file that no remaining
checkpoint refers to is deleted with it. A file no completed checkpoint refers to yet
is never deleted while tasks run (an in-flight checkpoint, or the next one after an
aborted one, may still take it into its chain): between attempts, when no task runs,
`SharedStateRegistry.remove_orphans` deletes those no completed checkpoint refers to.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping

from statebackend.errors import CheckpointNotFoundError, CorruptCheckpointError
from statebackend.incremental import SHARED_DIR, StateRef
from statebackend.metadata import CheckpointMetadata
from statebackend.snapshot import (
    OperatorSnapshot,
    encode_task_snapshot,
    read_keyed_state,
    write_chunks,
)
from statebackend.storage import CheckpointStorage

log = logging.getLogger("absflow.statebackend")


def write_chain_file(
    storage: CheckpointStorage, path: str, snapshots: Mapping[str, OperatorSnapshot]
) -> tuple[int, int]:
    """Write a chain file at ``path`` (relative to the root; any thread): keyed sections
    of ``snapshots``. Returns ``(size, crc32)``. Durable when it returns; a kill half-way
    leaves a partial file that no checkpoint names (an orphan)."""
    encoded = encode_task_snapshot(snapshots, compress=storage.compression)
    with storage.fs.open_write_part(storage.fs.join(storage.root, *path.split("/"))) as out:
        crc = write_chunks(out, encoded.chunks)
    return encoded.size, crc


def read_chain_blob(
    storage: CheckpointStorage,
    ref: StateRef,
    operator: str,
) -> bytes:
    """The keyed blob of ``operator`` in chain file ``ref`` (a file with no section for it
    holds no key of it: an empty full blob or delta is returned as b"")."""
    fs, path = storage.locate(ref)
    try:
        with fs.open_read(path) as f:
            blobs = read_keyed_state(f, operator, range(*ref.file_key_groups))
    except FileNotFoundError:
        raise CorruptCheckpointError(
            f"chain file {path!r} of '{operator}' is missing: the checkpoint cannot be "
            "restored (its incremental state was deleted); restore an older checkpoint or "
            "a savepoint"
        ) from None
    return blobs[0] if blobs else b""


class SharedStateRegistry:
    """The chain files under ``storage``'s root and the completed checkpoints that refer
    to them (coordinator side; one thread)."""

    def __init__(self, storage: CheckpointStorage) -> None:
        self.storage = storage
        self._refs: dict[int, frozenset[str]] = {}
        self._counts: Counter[str] = Counter()

    def load(self) -> None:
        """Register every readable completed checkpoint under the root."""
        for n in self.storage.completed_checkpoints():
            if n in self._refs:
                continue
            try:
                self.register(self.storage.read_metadata(n))
            except (CheckpointNotFoundError, CorruptCheckpointError) as err:
                log.debug("shared state: not counting checkpoint %d: %s", n, err)

    def register(self, metadata: CheckpointMetadata) -> None:
        """A completed checkpoint: count the chain files it refers to."""
        files = frozenset(f for h in metadata.tasks.values() for f in h.shared_files())
        old = self._refs.get(metadata.checkpoint_id)
        if old is not None:
            self._counts.subtract(old)
        self._refs[metadata.checkpoint_id] = files
        self._counts.update(files)

    def referenced(self) -> set[str]:
        return {path for path, count in self._counts.items() if count > 0}

    def release(self, deleted: Iterable[int]) -> list[str]:
        """Checkpoints ``deleted`` are gone: delete the chain files only they referred to.
        Returns the deleted files (relative paths)."""
        freed: set[str] = set()
        for n in deleted:
            files = self._refs.pop(n, frozenset())
            self._counts.subtract(files)
            freed |= files
        gone = sorted(f for f in freed if self._counts[f] <= 0)
        for path in gone:
            del self._counts[path]
            self.storage.fs.remove(self.storage.fs.join(self.storage.root, *path.split("/")))
        return gone

    def remove_orphans(self) -> list[str]:
        """Delete the chain files no completed checkpoint refers to. Only while no task
        of the job runs (between attempts): a running task's next checkpoint may refer to
        a file no completed one does yet."""
        self.load()
        fs, root = self.storage.fs, self.storage.root
        shared = fs.join(root, SHARED_DIR)
        try:
            task_dirs = fs.list_dirs(shared)
        except (FileNotFoundError, NotADirectoryError):
            return []
        keep = self.referenced()
        removed: list[str] = []
        for task_dir in sorted(task_dirs):
            try:
                names = fs.list_dir(fs.join(shared, task_dir))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in sorted(names):
                rel = f"{SHARED_DIR}/{task_dir}/{name}"
                if rel not in keep:
                    fs.remove(fs.join(shared, task_dir, name))
                    removed.append(rel)
        if removed:
            log.info("removed %d chain file(s) no checkpoint refers to", len(removed))
        return removed

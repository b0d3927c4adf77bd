"""A task's incremental checkpoints of keyed state: the chain of each operator, what a
checkpoint writes into it, and its compaction (``statebackend.incremental`` has the
format and the rules; this is the task's side of them).

At a barrier (task-loop thread, `KeyedChangelog.capture`), an operator that tracks its
changed keys and has a chain gets a delta (work proportional to the keys changed in the
epoch); one without a chain gets a base once its largest state holds
``incremental_min_keys`` keys, and below that is checkpointed whole, as before. A
savepoint is whole, in the checkpoint's own directory: self-contained; the final
checkpoint at the end of the input is incremental like any other (as in Flink).

The chain's files are written by the checkpointer's writer thread
(`ChainWrite.write`), in checkpoint order, one file per task and checkpoint. A file
whose write failed poisons every checkpoint whose chain holds it (they decline), and the
operator's next checkpoint starts a new chain with a base. Compaction runs in a thread
of its own (`KeyedChangelog._compact`) once a chain holds more than
``SPACE_AMPLIFICATION`` times the live keys or ``incremental_max_chain`` deltas, and
merges the newest files of like size (`_run_to_merge`); the merged file replaces the
files it covers from the next checkpoint on.

Threading: `capture`, `inherit` and `compaction_done` on the task-loop thread; the
`PendingFile` events are set by the writer thread, read by the compaction thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from runtime.task_faults import TaskFaults
from statebackend.errors import StateError
from statebackend.incremental import StateRef, merge_chain, shared_path
from statebackend.keyed import KeyedStateBackend
from statebackend.metadata import TaskStateHandle
from statebackend.shared import read_chain_blob, write_chain_file
from statebackend.snapshot import OperatorSnapshot
from statebackend.storage import CheckpointStorage

log = logging.getLogger("absflow.task")


@dataclass(eq=False)
class PendingFile:
    """A chain file: its path (relative to the root, or absolute), whether it is a base,
    and, once written (`done` set), its `StateRef`; ``failed`` if the write failed."""

    path: str
    base: bool
    key_groups: tuple[int, int]
    ref: StateRef | None = None
    keys: int | None = None  # keys written in it (None: not known, e.g. inherited)
    failed: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def written(cls, ref: StateRef) -> PendingFile:
        pending = cls(ref.path, ref.base, ref.key_groups, ref)
        pending.done.set()
        return pending

    def resolve(self, size: int, crc: int) -> None:
        self.ref = StateRef(self.path, size, crc, self.base, self.key_groups, self.key_groups)
        self.done.set()

    def fail(self) -> None:
        self.failed = True
        self.done.set()


@dataclass
class ChainWrite:
    """What checkpoint ``checkpoint_id`` writes into the chains of one task: a file
    (``path``) with a section per operator, and each operator's chain as of it."""

    checkpoint_id: int
    path: str
    snapshots: dict[str, OperatorSnapshot] = field(default_factory=dict)
    files: dict[str, PendingFile] = field(default_factory=dict)
    chains: dict[str, tuple[PendingFile, ...]] = field(default_factory=dict)

    def write(self, storage: CheckpointStorage) -> tuple[dict[str, tuple[StateRef, ...]], int]:
        """Write the file (writer thread, in checkpoint order): ``(chains, bytes written)``.
        Raises StateError when an earlier file of a chain failed (the checkpoint declines)."""
        for name, chain in self.chains.items():
            for pending in chain[:-1]:
                if pending.failed or pending.ref is None:
                    self._fail()
                    raise StateError(
                        f"the chain of '{name}' holds {pending.path}, whose write failed; "
                        "the next checkpoint writes a new base"
                    )
        written = 0
        if self.snapshots:
            try:
                size, crc = write_chain_file(storage, self.path, self.snapshots)
            except BaseException:
                self._fail()
                raise
            for pending in self.files.values():
                pending.resolve(size, crc)
            written = size
        chains = {
            name: tuple(p.ref for p in chain if p.ref is not None)
            for name, chain in self.chains.items()
        }
        return chains, written

    def _fail(self) -> None:
        for pending in self.files.values():
            pending.fail()


@dataclass
class _Chain:
    files: list[PendingFile]
    compaction: Future[PendingFile | None] | None = None
    covers: tuple[PendingFile, ...] = ()


class KeyedChangelog:
    """The chains of one task's keyed operators (see the module docstring)."""

    def __init__(
        self,
        task_id: str,
        attempt: int,
        enabled: bool,
        min_keys: int,
        max_chain: int,
        drop_deltas: bool = False,
        faults: TaskFaults | None = None,
    ) -> None:
        self.task_id, self.attempt = task_id, attempt
        self.enabled, self.min_keys, self.max_chain = enabled, min_keys, max_chain
        self.drop_deltas = drop_deltas
        self._faults = faults  # fault injection: a kill half way through a compaction
        self._checkpoint_id = 0  # of the capture under way
        self._chains: dict[str, _Chain] = {}
        self._staged: ChainWrite | None = None
        self._compactor: ThreadPoolExecutor | None = None
        self.compactions = 0

    # -- restore ---------------------------------------------------------------------------
    def inherit(self, operator: str, refs: list[StateRef]) -> None:
        """The chain restored for ``operator`` (refs narrowed to its key groups)."""
        if self.enabled and refs:
            self._chains[operator] = _Chain([PendingFile.written(r) for r in refs])

    # -- the barrier -----------------------------------------------------------------------
    def capture(
        self,
        checkpoint_id: int,
        operator: str,
        keyed: KeyedStateBackend,
        storage: CheckpointStorage,
    ) -> bool:
        """Snapshot ``keyed`` incrementally if it is (or now becomes) chained: stage its
        base or delta for checkpoint ``checkpoint_id`` and return True; False: snapshot it
        whole, as before (its changed keys are forgotten)."""
        chain = self._chains.get(operator)
        if chain is not None and any(p.failed for p in chain.files):
            log.warning(
                "task %s: a chain file of '%s' was not written; starting a new chain",
                self.task_id,
                operator,
            )
            del self._chains[operator]
            chain = None
        if not self.enabled:
            return False
        if chain is None and keyed.key_count() < self.min_keys:
            keyed.forget_changes()
            return False
        self._apply_compaction(operator)
        self._checkpoint_id = checkpoint_id
        if chain is not None:
            _localize(chain, storage.root)
        groups = (keyed.key_groups.start, keyed.key_groups.stop)
        staged = self._staged
        if staged is None or staged.checkpoint_id != checkpoint_id:
            path = shared_path(self.task_id, checkpoint_id, self.attempt, "chk")
            staged = self._staged = ChainWrite(checkpoint_id, path)
        if chain is None:
            blob = keyed.start_chain()
            pending = PendingFile(staged.path, True, groups, keys=keyed.key_count())
            chain = self._chains[operator] = _Chain([pending])
        else:
            blob = keyed.snapshot_delta(drop=self.drop_deltas)
            pending = PendingFile(staged.path, False, groups, keys=keyed.delta_keys)
            chain.files.append(pending)
        staged.snapshots[operator] = OperatorSnapshot(None, blob, keyed.key_groups)
        staged.files[operator] = pending
        staged.chains[operator] = tuple(chain.files)
        self._maybe_compact(operator, chain, keyed, storage)
        return True

    def take(self) -> ChainWrite | None:
        """What this checkpoint writes into the chains (after every operator's capture)."""
        staged, self._staged = self._staged, None
        return staged

    # -- compaction ------------------------------------------------------------------------
    def _maybe_compact(
        self, operator: str, chain: _Chain, keyed: KeyedStateBackend, storage: CheckpointStorage
    ) -> None:
        """Start a compaction of ``chain`` when a restore would read much more than the
        state (its files hold more than ``SPACE_AMPLIFICATION`` times the live keys), when
        it holds ``max_chain`` deltas, or when a file of it lies under another root."""
        if chain.compaction is not None:
            return
        files = chain.files
        foreign = any(p.path.startswith("/") or "://" in p.path for p in files)
        known = all(p.keys is not None for p in files)
        written = sum(p.keys or 0 for p in files)
        amplified = known and written > SPACE_AMPLIFICATION * max(keyed.key_count(), 1)
        if len(files) - 1 < self.max_chain and not foreign and not amplified:
            return
        covers = tuple(files) if foreign or not known else _run_to_merge(files)
        if len(covers) < 2 and not foreign:
            return
        if self._compactor is None:
            self._compactor = ThreadPoolExecutor(1, thread_name_prefix="absflow-compact")
        target = shared_path(self.task_id, 0, self.attempt, "merged")
        key_groups, key_group_of = keyed.key_groups, keyed.key_group_of
        chain.covers = covers
        die = self._faults is not None and self._faults.kill_during_compaction(self._checkpoint_id)
        chain.compaction = self._compactor.submit(
            self._compact, storage, operator, covers, target, key_groups, key_group_of, die
        )

    def _compact(
        self,
        storage: CheckpointStorage,
        operator: str,
        covers: tuple[PendingFile, ...],
        target: str,
        key_groups: range,
        key_group_of: Callable[[Any], int],
        die: bool = False,
    ) -> PendingFile | None:
        """Merge ``covers`` into one file at ``target`` (compaction thread); ``die``
        (fault injection): SIGKILL this process half way through writing it."""
        for pending in covers:
            pending.done.wait()
            if pending.failed or pending.ref is None:
                return None
        blobs = []
        for pending in covers:
            assert pending.ref is not None
            blob = read_chain_blob(storage, pending.ref, operator)
            if blob:
                blobs.append((pending.ref, blob))
        if not blobs:
            return None
        merged, base, keys = merge_chain(blobs, key_groups, key_group_of)
        if die:
            TaskFaults.die_writing(storage, 0, self.task_id, target)
        result = PendingFile(target, base, (key_groups.start, key_groups.stop), keys=keys)
        size, crc = write_chain_file(
            storage, target, {operator: OperatorSnapshot(None, merged, key_groups)}
        )
        result.resolve(size, crc)
        return result

    def _apply_compaction(self, operator: str) -> None:
        """A finished compaction's file replaces the files it covers (task-loop thread)."""
        chain = self._chains.get(operator)
        if chain is None or chain.compaction is None or not chain.compaction.done():
            return
        future, covers = chain.compaction, chain.covers
        chain.compaction, chain.covers = None, ()
        try:
            merged = future.result()
        except Exception as err:  # e.g. a full disk: the chain goes on, longer
            log.warning("task %s: compacting '%s' failed: %s", self.task_id, operator, err)
            return
        files = chain.files
        n = len(covers)
        start = next((i for i, p in enumerate(files) if p is covers[0]), None)
        if merged is None or start is None or tuple(files[start : start + n]) != covers:
            return
        chain.files = [*files[:start], merged, *files[start + n :]]
        self.compactions += 1

    def close(self) -> None:
        if self._compactor is not None:
            self._compactor.shutdown(wait=False, cancel_futures=True)
            self._compactor = None


SPACE_AMPLIFICATION = 2.0
"""A chain whose files hold more than this many times the operator's live keys is
compacted: a restore would read that much more than the state."""
SIZE_RATIO = 1.0
"""A compaction merges the newest files and goes on to an older one while that one is at
most this many times the keys gathered so far (RocksDB's universal compaction): files
of like size merge, each key is rewritten O(log n) times, and the base only once the
deltas after it hold as many keys as it does."""


def _run_to_merge(files: Sequence[PendingFile]) -> tuple[PendingFile, ...]:
    """The files a compaction merges (a run ending at the newest; see SIZE_RATIO); every
    delta when no two newest files are of like size."""
    sizes = [p.keys or 0 for p in files]
    start, gathered = len(files) - 1, sizes[-1]
    while start > 0 and sizes[start - 1] <= SIZE_RATIO * max(gathered, 1):
        start -= 1
        gathered += sizes[start]
    if len(files) - start < 2:
        start = min(1, len(files) - 2)
    return tuple(files[start:])


def _localize(chain: _Chain, root: str) -> None:
    """Inherited files under this job's own root get paths relative to it (the shared
    state registry counts those); files of another root stay absolute."""
    prefix = root.rstrip("/") + "/"
    for i, pending in enumerate(chain.files):
        ref = pending.ref
        if ref is not None and ref.path.startswith(prefix):
            chain.files[i] = PendingFile.written(
                dataclasses.replace(ref, path=ref.path[len(prefix) :])
            )


def restore_chains(
    keyed: KeyedStateBackend,
    operator: str,
    handles: Sequence[TaskStateHandle],
    storage: CheckpointStorage,
) -> list[StateRef] | None:
    """Apply the chains of ``operator`` held by ``handles`` (the restored state files whose
    key groups overlap ``keyed``'s) to ``keyed``, each file in order and only its keys
    that count. Returns the chain the operator inherits (each file narrowed to its key
    groups, paths absolute under ``storage``'s root), or None when a handle holds the
    operator's keyed state whole (no chain: its next checkpoint starts one)."""
    inherited: list[StateRef] = []
    whole = False
    for handle in handles:
        chain = handle.chains.get(operator)
        if not chain:
            whole = whole or operator in handle.operators
            continue
        for ref in chain:
            mine = ref.narrowed(keyed.key_groups, storage.root)
            if mine is None:
                continue
            blob = read_chain_blob(storage, ref, operator)
            if blob:
                keyed.restore([blob], range(*mine.key_groups), range(*ref.file_key_groups))
            inherited.append(mine)
    return None if whole else inherited

"""Incremental checkpoints of keyed state: chains of state files (Flink's incremental
checkpoints and changelog, FLIP-158; seed 000 §7's "decouple snapshot state from
operator state").

A keyed operator whose state is large (``JobConfig.incremental_min_keys``) is not
written whole at every checkpoint. Its first incremental checkpoint writes a **base**
(a full snapshot); each later one writes a **delta**: the values of the keys changed
since the previous checkpoint and the keys deleted (``KeyedStateBackend.
snapshot_delta``: work proportional to the changed keys). The operator's state at
checkpoint n is its **chain**: ``base, delta, delta, ...``, applied in order.

Chain files are task state files (``statebackend.snapshot`` format, keyed sections
only) under the checkpoint root's ``shared/<task id>/`` (`shared_path`): a file is
written once, by the checkpoint that made it, and referenced by every later checkpoint
of the chain, so it outlives the ``chk-<n>`` directory it was made for. The task's
``TaskStateHandle.chains`` lists each operator's chain as `StateRef`s; the coordinator
deletes a shared file once no retained checkpoint refers to it
(`statebackend.shared.SharedStateRegistry`, Flink's ``SharedStateRegistry``).

**Compaction** bounds a chain (`runtime.changelog`): when its files hold more than twice
the operator's live keys, or it holds ``max_chain`` deltas, a background thread of the task
merges the newest files of like size (`merge_chain`): into a new delta (tombstones kept:
they still delete base keys), or, once the deltas hold as many keys as the base, base and
deltas into a new base. The merged file replaces the refs it covers from the next
checkpoint on.

A `StateRef` also says which of its file's keys count (``key_groups``): after a rescale
an instance inherits the chains of every old instance whose key groups overlap its own,
each narrowed to the overlap, so two files never both decide a key.

A **savepoint** is written whole into its ``chk-<n>`` directory: self-contained, any
chain restores from it, and a user may delete the checkpoints behind it. The final
checkpoint at the end of the input is a checkpoint like any other (incremental).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from statebackend.errors import CorruptCheckpointError
from statebackend.keyed import FORMAT_VERSION, Deletion, Entry, pack_delta, unpack_blob

SHARED_DIR = "shared"


@dataclass(frozen=True, slots=True)
class StateRef:
    """One file of an operator's chain: ``path`` relative to the checkpoint root (or an
    absolute path/URL of another root: state inherited from ``restore_from``), its
    ``size`` and whole-file ``crc32``, whether it is a ``base`` (full) or a delta, and the
    key groups ``[start, stop)`` whose keys in it count. ``file_key_groups`` are the
    key groups of the instance that wrote it: a reader hashes keys only where those
    are not inside the key groups that count for it."""

    path: str
    size: int
    crc32: int
    base: bool
    key_groups: tuple[int, int]
    file_key_groups: tuple[int, int]

    @property
    def foreign(self) -> bool:
        """Whether the file lives under another checkpoint root (never deleted here)."""
        return self.path.startswith("/") or "://" in self.path

    def narrowed(self, key_groups: range, root: str | None) -> StateRef | None:
        """This ref as inherited by an instance owning ``key_groups`` (None if they do
        not overlap); ``root``: the checkpoint root the ref's path is relative to, when
        it is not the inheriting job's own (the path becomes absolute)."""
        start = max(self.key_groups[0], key_groups.start)
        stop = min(self.key_groups[1], key_groups.stop)
        if start >= stop:
            return None
        path = self.path
        if root is not None and not self.foreign:
            path = f"{root.rstrip('/')}/{path}"
        return StateRef(path, self.size, self.crc32, self.base, (start, stop), self.file_key_groups)

    def encode(self) -> list[Any]:
        return [
            self.path,
            self.size,
            self.crc32,
            self.base,
            *self.key_groups,
            *self.file_key_groups,
        ]

    @classmethod
    def decode(cls, data: Any) -> StateRef:
        try:
            path, size, crc, base, start, stop, fstart, fstop = data
            return cls(
                str(path), int(size), int(crc), bool(base), (int(start), int(stop)),
                (int(fstart), int(fstop)),
            )  # fmt: skip
        except (TypeError, ValueError) as err:
            raise CorruptCheckpointError(
                f"chain entry {data!r} is malformed ({err}): expected [path, size, crc32, "
                f"base, key group start, stop, file key group start, stop]"
            ) from err


def shared_path(task_id: str, checkpoint_id: int, attempt: int, what: str) -> str:
    """A new chain file's path relative to the root: unique across attempts (a task of
    an old attempt behind a partition may still be writing) and compactions."""
    return f"{SHARED_DIR}/{task_id}/{checkpoint_id}-{attempt}-{what}-{uuid.uuid4().hex[:8]}.state"


def chain_bytes(chain: Sequence[StateRef]) -> int:
    return sum(ref.size for ref in chain)


def merge_chain(
    blobs: Sequence[tuple[StateRef, bytes]],
    key_groups: range,
    key_group_of: Callable[[object], int],
) -> tuple[bytes, bool, int]:
    """Merge a run of a chain (in order) into one blob for an instance owning
    ``key_groups``: ``(blob, base, keys in it)``. Starting at a base, the result is a full blob
    (deletions applied and dropped); else a delta that keeps the deletions (they still
    delete keys of the base before it). Keys outside a ref's ``key_groups`` are dropped.
    """
    if not blobs:
        raise ValueError("merge_chain needs at least one file")
    is_base = blobs[0][0].base
    kinds: dict[str, str] = {}
    values: dict[str, dict[object, object]] = {}
    deleted: dict[str, set[object]] = {}
    for ref, blob in blobs:
        lo = max(ref.key_groups[0], key_groups.start)
        hi = min(ref.key_groups[1], key_groups.stop)
        filtered = not (lo <= ref.file_key_groups[0] and ref.file_key_groups[1] <= hi)
        entries, deletions = unpack_blob(blob)
        for name, keys in deletions:
            state = values.setdefault(name, {})
            gone = deleted.setdefault(name, set())
            for key in keys:
                if not filtered or lo <= key_group_of(key) < hi:
                    state.pop(key, None)
                    gone.add(key)
        for kind, name, state_entries in entries:
            kinds.setdefault(name, kind)
            state = values.setdefault(name, {})
            gone = deleted.setdefault(name, set())
            if filtered:
                state_entries = {
                    k: v for k, v in state_entries.items() if lo <= key_group_of(k) < hi
                }
            state.update(state_entries)
            if gone:
                gone.difference_update(state_entries)
    layout: list[Entry] = [(kind, name, values[name]) for name, kind in kinds.items()]
    count = max((len(state) for state in values.values()), default=0)
    if is_base:
        packed: bytes = msgpack.packb([FORMAT_VERSION, layout], use_bin_type=True)
        return packed, True, count
    removals: list[Deletion] = [(name, list(keys)) for name, keys in deleted.items() if keys]
    tombstones = max((len(keys) for keys in deleted.values()), default=0)
    return pack_delta(layout, removals), False, count + tombstones


@dataclass(frozen=True, slots=True)
class StoreFile:
    """One file of an embedded store's checkpoint: its ``name`` in the store's directory
    and where it is in checkpoint storage (``ref``: an SST file is uploaded once and
    referenced by every checkpoint that holds it, like a chain file)."""

    name: str
    ref: StateRef


@dataclass(frozen=True, slots=True)
class StoreCheckpoint:
    """An operator instance's keyed state as the files of its store's checkpoint
    (``statebackend.rocksdb``): the instance owned ``key_groups``; every key in the files
    is of those key groups."""

    key_groups: tuple[int, int]
    files: tuple[StoreFile, ...]

    @property
    def size(self) -> int:
        return sum(f.ref.size for f in self.files)

    def encode(self) -> dict[str, Any]:
        return {
            "key_groups": list(self.key_groups),
            "files": [[f.name, *f.ref.encode()] for f in self.files],
        }

    @classmethod
    def decode(cls, data: Any) -> StoreCheckpoint:
        try:
            start, stop = data["key_groups"]
            files = tuple(StoreFile(str(f[0]), StateRef.decode(f[1:])) for f in data["files"])
            return cls((int(start), int(stop)), files)
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise CorruptCheckpointError(
                f"store checkpoint {data!r} is malformed ({err!r}): expected "
                "{'key_groups': [start, stop], 'files': [[name, path, size, crc32, ...]]}"
            ) from err

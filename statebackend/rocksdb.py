"""Keyed state larger than memory: an embedded RocksDB (``rocksdict``) behind the same
state API (``JobConfig.state_backend = "rocksdb"``; Flink's RocksDB state backend).

Why RocksDB: ``benchmarks/state_store.py`` measured it against LMDB at 1 M keys. LMDB
reads faster, but its checkpoint copies its whole file every time; RocksDB's checkpoint
hard-links its immutable SST files, so a checkpoint uploads only the files that are new
since the previous one (0.09 MB after 1 % of 1 M keys changed, against 65 MB).

**Layout.** Every state of an operator instance lives in one database, one entry per
(state, key): the store key is ``key group (2 bytes, big-endian) | len(name) (1 byte) |
name | msgpack(key)``, the value ``msgpack(value)``. Key group first, so a key-group
range is a key range: a rescale copies ranges. The kind of each state is an entry under
the prefix ``b"\\xff\\xff"`` (outside every key group).

**The operator's side.** ``value_state``, ``list_state`` and ``map_state`` return a
`StoreState`, a mutable mapping operators index like the in-memory backend's dicts. It
keeps a bounded cache of hot keys in front of the store: reads are served from it, and
writes go to it (marked dirty) and reach the store when evicted or before a snapshot
(`RocksDBStateBackend.flush`). A value read from the cache may be changed in place (a
list state's list, a map state's dict): such values are written back too. Contract: a
value object taken from a state stays live until another key of the same state is
accessed (eviction happens then); operators change a key's value right after reading it.
Values read back from the store follow the restore rule of ``statebackend.keyed``
(sequences come back as tuples, a list state's list as a list).

**Checkpoints** (`RocksDBStateBackend.local_checkpoint`, then `StoreWrite.write`): the
synchronous part writes the dirty keys back and takes RocksDB's checkpoint (a flush of
the write buffer and hard links of the SST files) into a local directory; the
asynchronous part uploads the SST files not uploaded before to the checkpoint root's
``shared/<task>/`` and the small metadata files (MANIFEST, CURRENT, OPTIONS) of this
checkpoint, then removes the local links. The checkpoint's `StoreCheckpoint` lists every
file it needs; the job manager's ``SharedStateRegistry`` counts them like chain files,
so retention never deletes a file a retained checkpoint refers to. A **savepoint** is the
canonical whole snapshot of ``statebackend.keyed`` instead, spooled from such a local
checkpoint on the writer thread (`StoreWrite.spool`): either backend restores it.

**Restore.** At the same key groups the task downloads the checkpoint's files and opens
them as its database (their SST files count as uploaded: the next checkpoint is
incremental again); at another parallelism it opens each overlapping old database and
copies the ranges of its own key groups. Canonical blobs (a savepoint, or a checkpoint
of the in-memory backend, whole or chained) are written into the store key by key.

**Memory.** ``memory_budget`` bytes are shared out: a quarter to RocksDB's write buffers,
an eighth to its block cache (index and filter blocks included), three eighths to the
caches of hot keys, sized by a sampled per-entry cost; the last quarter is headroom for
what comes and goes: a Python dict or set that grows or sheds deleted slots holds its
old table and its new one at once (a cache churns: it evicts and inserts), and a
compaction holds the index and filter of the file it writes.

Threading: the task-loop thread, except `StoreWrite.write` (the checkpoint writer thread).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, BinaryIO

import msgpack

from statebackend.errors import CorruptCheckpointError, StateError
from statebackend.incremental import SHARED_DIR, StateRef, StoreCheckpoint, StoreFile
from statebackend.keyed import (
    _THAW,
    DELTA_VERSION,
    ENTRY_OVERHEAD,
    FORMAT_VERSION,
    KeyedStateBackend,
    StateKind,
    _freeze,
    _pairs_to_dict,
    restored_kind,
    sizeof,
)
from statebackend.snapshot import SpooledBlob
from statebackend.storage import CheckpointStorage

if TYPE_CHECKING:  # an optional dependency (the rocksdb extra), typed (py.typed)
    from rocksdict import Options, Rdict, WriteBatch

META = b"\xff\xff"
"""Prefix of the entries that name each state's kind (above every key group)."""
_GONE = object()  # a deleted key in the cache, until written back
_MISS = object()
_BATCH = 10_000  # entries per write batch when copying or restoring
_COPY_CHUNK = 1 << 20
_MUTABLE = (list, dict, bytearray, set)
DEFAULT_BUDGET = 256 << 20
DIRTY_OVERHEAD = 32
"""Bytes a cached key costs in the set of dirty keys (a slot in a set's table)."""


def _rocksdict() -> ModuleType:
    try:
        import rocksdict
    except ImportError as err:
        raise StateError(
            "state_backend='rocksdb' needs the rocksdict package (RocksDB in a wheel): "
            "pip install 'absflow[rocksdb]' (or pip install rocksdict), or use "
            "state_backend='memory'"
        ) from err
    return rocksdict


_pack: Callable[[object], bytes] = msgpack.Packer(use_bin_type=True).pack
"""msgpack bytes of a key or value (one packer: ``packb`` builds one per call)."""


def _unpack(raw: bytes) -> Any:
    return msgpack.unpackb(
        raw, use_list=True, strict_map_key=False, object_pairs_hook=_pairs_to_dict
    )


def _name_prefix(name: str) -> bytes:
    encoded = name.encode()
    if len(encoded) > 255:
        raise StateError(f"state name {name!r} is longer than 255 bytes; give it a shorter name")
    return bytes([len(encoded)]) + encoded


class EntryCost:
    """The memory one cached entry costs, sampled: the first 32 entries and every
    ``every``-th after them are measured
    (``statebackend.keyed.sizeof`` of key and value plus the dict slot), the mean is kept."""

    __slots__ = ("_total", "count", "every_mask", "samples")

    def __init__(self, every: int = 256) -> None:
        self.every_mask = every - 1  # a power of two
        self.count = 0  # entries cached (the caller counts, and samples every 256th)
        self.samples = 0
        self._total = 0

    def sample(self, key: object, value: object) -> None:
        self.samples += 1
        self._total += sizeof(key) + sizeof(value) + ENTRY_OVERHEAD + DIRTY_OVERHEAD

    @property
    def per_entry(self) -> int:
        return self._total // self.samples if self.samples else 200


class StoreState(MutableMapping[object, object]):
    """One named state of a `RocksDBStateBackend`: key -> value, a bounded cache of hot
    keys in front of the store (see the module docstring)."""

    def __init__(self, backend: RocksDBStateBackend, name: str, kind: StateKind) -> None:
        self._backend = backend
        self.name, self.kind = name, kind
        self._prefix = _name_prefix(name)
        # the store key's head per key group: key group (2 bytes) | len(name) | name
        self._heads = [
            kg.to_bytes(2, "big") + self._prefix for kg in range(backend.max_parallelism)
        ]
        self._thaw = _THAW[kind]
        self._always_mutable = kind is not StateKind.VALUE
        self._cache: dict[object, object] = {}
        self._dirty: set[object] = set()
        self.capacity = 1 << 30  # set by the backend from its budget

    # -- encoding --------------------------------------------------------------------------
    def _store_key(self, key: object) -> bytes:
        return self._heads[self._backend.key_group_of(key)] + _pack(key)

    def _load(self, key: object) -> object:
        raw = self._backend.db.get(self._store_key(key))
        if raw is None:
            return _MISS
        value = self._thaw(_unpack(raw))
        self._put_cache(key, value)
        if self._always_mutable or value.__class__ in _MUTABLE:
            self._dirty.add(key)  # it may be changed in place
        return value

    def _put_cache(self, key: object, value: object) -> None:
        cache = self._cache
        if len(cache) >= self.capacity:
            self._evict(keep=key)
        cache[key] = value
        cost = self._backend.cost
        cost.count += 1
        if cost.count & cost.every_mask == 0 or cost.samples < 32:
            cost.sample(key, value)

    def _evict(self, keep: object) -> None:
        """Drop the oldest eighth of the cache, writing its dirty keys back (an eighth: the
        pause stays short, the task loop heart-beats between batches)."""
        cache, dirty = self._cache, self._dirty
        n = max(1, len(cache) // 8)
        victims = [k for k, _ in zip(cache, range(n), strict=False) if k != keep]
        batch = self._backend.batch()
        for key in victims:
            value = cache.pop(key)
            if key in dirty:
                dirty.discard(key)
                self._write(batch, key, value)
        self._backend.db.write(batch)

    def _write(self, batch: WriteBatch, key: object, value: object) -> None:
        if value is _GONE:
            batch.delete(self._store_key(key))
        else:
            batch.put(self._store_key(key), _pack(value))

    def flush(self, batch: WriteBatch) -> None:
        """Write the dirty keys into ``batch``; deleted keys leave the cache."""
        cache = self._cache
        for key in self._dirty:
            value = cache[key]
            self._write(batch, key, value)
            if value is _GONE:
                del cache[key]
        self._dirty.clear()

    def drop_cache(self) -> None:
        self._cache.clear()
        self._dirty.clear()

    # -- the mapping -------------------------------------------------------------------------
    def get(self, key: object, default: object = None) -> object:
        value = self._cache.get(key, _MISS)
        if value is _MISS:
            value = self._load(key)
            return default if value is _MISS else value
        if value is _GONE:
            return default
        if self._always_mutable or value.__class__ in _MUTABLE:
            self._dirty.add(key)
        return value

    def __getitem__(self, key: object) -> object:
        value = self.get(key, _MISS)
        if value is _MISS:
            raise KeyError(key)
        return value

    def __setitem__(self, key: object, value: object) -> None:
        cache = self._cache
        if key not in cache:
            self._put_cache(key, value)
        else:
            cache[key] = value
        self._dirty.add(key)

    def __delitem__(self, key: object) -> None:
        if self.get(key, _MISS) is _MISS:
            raise KeyError(key)
        self._cache[key] = _GONE
        self._dirty.add(key)

    def pop(self, key: object, default: object = _MISS) -> object:
        value = self.get(key, _MISS)
        if value is _MISS:
            if default is _MISS:
                raise KeyError(key)
            return default
        self._cache[key] = _GONE
        self._dirty.add(key)
        return value

    def __contains__(self, key: object) -> bool:
        return self.get(key, _MISS) is not _MISS

    def items(self) -> Iterator[tuple[object, object]]:  # type: ignore[override]
        """Every (key, value), from the store after writing the cache back (not for the
        hot path: a scan of the instance's key groups)."""
        self._backend.flush()
        cache = self._cache
        for key, raw in self._backend.scan_state(self._prefix):
            cached = cache.get(key, _MISS)
            yield key, (self._thaw(_unpack(raw)) if cached is _MISS else cached)

    def __iter__(self) -> Iterator[object]:
        for key, _ in self.items():
            yield key

    # lists, not views: each is a scan of the store (not for the hot path)
    def keys(self) -> list[object]:  # type: ignore[override]
        return list(iter(self))

    def values(self) -> list[object]:  # type: ignore[override]
        return [v for _, v in self.items()]

    def __len__(self) -> int:
        """Exact, by a scan (not for the hot path)."""
        return sum(1 for _ in self._backend.scan_state(self._prefix, flush=True))

    def __bool__(self) -> bool:
        return any(True for _ in self._backend.scan_state(self._prefix, flush=True))

    def clear(self) -> None:
        for key in list(self):
            del self[key]


@dataclass
class _Uploaded:
    """SST files of the live database already in checkpoint storage (writer thread)."""

    refs: dict[str, StateRef] = field(default_factory=dict)


class RocksDBStateBackend(KeyedStateBackend):
    """The keyed state of one operator instance in an embedded RocksDB (module docstring).

    The database is opened on first use in a directory under ``directory()`` (the task's
    scratch directory) and removed by `close`."""

    in_memory = False

    def __init__(
        self,
        operator: str,
        max_parallelism: int,
        key_groups: range,
        key_group_of: Callable[[object], int],
        directory: Callable[[], str],
        memory_budget: int | None = None,
        drop_shared: bool = False,
    ) -> None:
        """``drop_shared`` (tests only: the companion of incremental restore): a checkpoint
        lists only the files it uploaded, not those uploaded before."""
        super().__init__(operator, max_parallelism, key_groups, key_group_of)
        if max_parallelism > 0xFFFF:
            raise StateError(
                f"operator {operator!r}: max_parallelism {max_parallelism} does not fit the "
                "store's 2-byte key-group prefix; use max_parallelism <= 65535"
            )
        self._directory = directory
        self.memory_budget = memory_budget or DEFAULT_BUDGET
        self.cost = EntryCost()
        self._db: Rdict | None = None
        self._path: str | None = None
        self._uploaded = _Uploaded()
        self._db_id = uuid.uuid4().hex[:8]
        self.drop_shared = drop_shared

    # -- the database ------------------------------------------------------------------------
    def _options(self) -> Options:
        r = _rocksdict()
        opts = r.Options(raw_mode=True)
        opts.create_if_missing(True)
        budget = self.memory_budget
        opts.set_write_buffer_size(max(1 << 20, budget // 8))
        opts.set_max_write_buffer_number(2)
        opts.set_max_background_jobs(2)
        # Never stall the task's writes behind compaction (a stalled task loop stops
        # heart-beating): reads get slower while compaction catches up instead.
        opts.set_level_zero_slowdown_writes_trigger(1 << 10)
        opts.set_level_zero_stop_writes_trigger(1 << 11)
        opts.set_soft_pending_compaction_bytes_limit(0)
        opts.set_hard_pending_compaction_bytes_limit(0)
        opts.set_max_open_files(256)
        # A compaction builds each output file's index and filter in memory (the filter
        # from every key's hash): at the default 64 MiB per file, two compactions held
        # ~40 MiB past the budget at 3 M keys a task. Files of a 32nd of the budget bound
        # that to a few MiB; one subcompaction at a time.
        opts.set_target_file_size_base(max(1 << 20, budget // 32))
        opts.set_max_subcompactions(1)
        table = r.BlockBasedOptions()
        table.set_block_cache(r.Cache(max(1 << 20, budget // 8)))
        # Index and filter blocks count against the block cache (so against the budget),
        # partitioned into 4 KiB blocks: a whole filter block of a large SST file does not
        # fit a cache shard, and was read from the file on every lookup (a lookup of an
        # absent key took 97 us at 800 k keys, 5 us partitioned). The top level of each
        # (small) and the L0 files' blocks stay pinned.
        table.set_cache_index_and_filter_blocks(True)
        table.set_index_type(r.BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
        table.set_metadata_block_size(4096)
        table.set_pin_top_level_index_and_filter(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        options: Options = opts
        return options

    @property
    def db(self) -> Rdict:
        if self._db is None:
            self._open(None)
        assert self._db is not None  # _open opened it
        return self._db

    def _open(self, from_dir: str | None) -> None:
        """Open the database: a new one, or the checkpoint files in ``from_dir`` (moved)."""
        parent = self._directory()
        safe = "".join(c if c.isalnum() else "_" for c in self.operator)
        self._path = os.path.join(parent, f"rocksdb-{safe}-{self._db_id}")
        if from_dir is not None:
            os.replace(from_dir, self._path)
        r = _rocksdict()
        db: Rdict = r.Rdict(self._path, self._options())
        no_log = r.WriteOptions()
        no_log.disable_wal = True  # a restore starts from a checkpoint, never from the log
        db.set_write_options(no_log)
        self._db = db
        self._size_caches()

    def _size_caches(self) -> None:
        states = max(1, len(self._states))
        per_state = (self.memory_budget * 3 // 8) // states
        for state in self._states.values():
            state.capacity = max(64, per_state // self.cost.per_entry)  # type: ignore[attr-defined]

    def batch(self) -> WriteBatch:
        batch: WriteBatch = _rocksdict().WriteBatch(raw_mode=True)
        return batch

    def close(self) -> None:
        """Close and remove the database (idempotent)."""
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(Exception):
                db.close()
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None

    # -- states ------------------------------------------------------------------------------
    def _state(self, name: str, kind: StateKind) -> Any:
        known = self._kinds.get(name)
        if known is None:
            state = StoreState(self, name, kind)
            self._kinds[name] = kind
            self._states[name] = state  # type: ignore[assignment]
            # the store state stands in for the live dict (as in _states above)
            self._layout.append((kind.value, name, state))  # type: ignore[arg-type]
            if self._db is not None:
                self._db.put(META + name.encode(), kind.value.encode())
                self._size_caches()
            return state
        return super()._state(name, kind)

    def flush(self) -> None:
        """Write every state's dirty keys back to the store (and the state kinds)."""
        self._write_back()
        batch = self.batch()
        for name, kind in self._kinds.items():
            batch.put(META + name.encode(), kind.value.encode())
        for state in self._states.values():
            state.flush(batch)  # type: ignore[attr-defined]
        self.db.write(batch)
        self._size_caches()

    def scan_state(self, prefix: bytes, flush: bool = False) -> Iterator[tuple[object, bytes]]:
        """(key, raw value) of one state (``prefix``: its name prefix), by key group."""
        if flush:
            self.flush()
        db = self.db
        n = len(prefix)
        for kg in self.key_groups:
            start = kg.to_bytes(2, "big") + prefix
            it = db.iter()
            it.seek(start)
            while it.valid():
                k = it.key()
                if not k.startswith(start):
                    break
                yield (
                    _freeze(msgpack.unpackb(k[2 + n :], use_list=True, strict_map_key=False)),
                    it.value(),
                )
                it.next()

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        """The canonical whole snapshot (``statebackend.keyed``'s format), in memory: a
        savepoint spools it from a checkpoint instead (`StoreWrite.spool`). Values are
        copied as stored (no decoding)."""
        self.flush()
        return _canonical(self.db, self.key_groups, None, self.operator).read()

    def start_chain(self) -> bytes:
        raise StateError(f"operator {self.operator!r}: the RocksDB backend has no delta chains")

    def snapshot_delta(self, drop: bool = False) -> bytes:
        raise StateError(f"operator {self.operator!r}: the RocksDB backend has no delta chains")

    def key_count(self) -> int:
        """RocksDB's estimate of the keys in the store (all states; a metric)."""
        if self._db is None:
            return 0
        value = self._db.property_int_value("rocksdb.estimate-num-keys")
        return max(0, int(value or 0) - len(self._kinds))

    def num_keys(self) -> int:
        return self.key_count()

    def local_checkpoint(self, checkpoint_id: int, canonical: bool = False) -> StoreWrite:
        """The synchronous part of a checkpoint: dirty keys written back, then RocksDB's
        checkpoint (write buffer flushed, SST files hard-linked) into a local directory.
        ``canonical`` (a savepoint): the writer thread turns it into the canonical whole
        snapshot (`StoreWrite.spool`) instead of uploading its files."""
        self.flush()  # RocksDB's checkpoint flushes the write buffer (there is no log)
        assert self._path is not None
        target = f"{self._path}.chk-{checkpoint_id}-{uuid.uuid4().hex[:6]}"
        _rocksdict().Checkpoint(self.db).create_checkpoint(target)
        return StoreWrite(
            self.operator,
            target,
            self.key_groups,
            self._db_id,
            self._uploaded,
            self.drop_shared,
            canonical,
        )

    # -- restore -----------------------------------------------------------------------------
    def restore(
        self,
        blobs: Iterable[bytes],
        key_groups: range | None = None,
        written_for: range | None = None,
    ) -> None:
        """Write canonical blobs (whole snapshots or deltas, in order) into the store:
        only keys of this instance's key groups (and of ``key_groups``, if given)."""
        self.restore_streams((io.BytesIO(blob) for blob in blobs), key_groups, written_for)

    def restore_streams(
        self,
        streams: Iterable[BinaryIO],
        key_groups: range | None = None,
        written_for: range | None = None,
    ) -> None:
        """As `restore`, each blob read as a stream, entry by entry: a savepoint of a state
        larger than memory restores within the budget."""
        owned = self.owned_within(key_groups)
        self.flush()
        for state in self._states.values():
            state.drop_cache()  # type: ignore[attr-defined]
        for stream in streams:
            unpacker = msgpack.Unpacker(
                stream,
                read_size=_COPY_CHUNK,
                use_list=True,
                strict_map_key=False,
                object_pairs_hook=_pairs_to_dict,
            )
            try:
                self._restore_blob(unpacker, owned)
            except (ValueError, msgpack.UnpackException) as err:
                raise StateError(
                    f"operator {self.operator!r}: keyed state blob does not decode: {err}"
                ) from err

    def _restore_blob(self, unpacker: msgpack.Unpacker, owned: range) -> None:
        """One canonical blob (``statebackend.keyed``'s format, whole or delta) from
        ``unpacker`` into the store, a write batch per ``_BATCH`` entries."""
        key_group_of, db = self.key_group_of, self.db
        fields, version = unpacker.read_array_header(), unpacker.unpack()
        if (fields, version) not in ((2, FORMAT_VERSION), (3, DELTA_VERSION)):
            raise StateError(
                f"operator {self.operator!r}: keyed state blob has format {version!r}, expected "
                f"[{FORMAT_VERSION}, [...]] or [{DELTA_VERSION}, [...], [...]]; it was written "
                "by another version of absflow"
            )
        for _ in range(unpacker.read_array_header()):
            if unpacker.read_array_header() != 3:
                raise StateError(
                    f"operator {self.operator!r}: a state entry is not [kind, name, map]"
                )
            kind, name = unpacker.unpack(), unpacker.unpack()
            state_kind = restored_kind(self.operator, name, kind)
            self._state(name, state_kind)
            db.put(META + name.encode(), state_kind.value.encode())
            heads = self._states[name]._heads  # type: ignore[attr-defined]
            batch, n = self.batch(), 0
            for _ in range(unpacker.read_map_header()):
                key, value = unpacker.unpack(), unpacker.unpack()
                if key.__class__ is list:
                    key = _freeze(key)
                kg = key_group_of(key)
                if kg in owned:
                    batch.put(heads[kg] + _pack(key), _pack(value))
                    n += 1
                    if n == _BATCH:
                        db.write(batch)
                        batch, n = self.batch(), 0
            db.write(batch)
        if fields == 3:  # a delta's deletions: [[name, [key, ...]], ...]
            batch = self.batch()
            for name, keys in unpacker.unpack():
                prefix = _name_prefix(name)
                for key in keys:
                    key = _freeze(key)
                    kg = key_group_of(key)
                    if kg in owned:
                        batch.delete(kg.to_bytes(2, "big") + prefix + _pack(key))
            db.write(batch)

    def restore_stores(
        self, checkpoints: list[StoreCheckpoint], storage: CheckpointStorage
    ) -> None:
        """Restore from RocksDB checkpoints: one of exactly this instance's key groups is
        opened as the database; others (a rescale) are opened one by one and the ranges of
        this instance's key groups copied from them."""
        if not checkpoints:
            return
        parent = self._directory()
        own = (self.key_groups.start, self.key_groups.stop)
        if len(checkpoints) == 1 and checkpoints[0].key_groups == own and self._db is None:
            chk = checkpoints[0]
            local = os.path.join(parent, f"restore-{uuid.uuid4().hex[:8]}")
            download(storage, chk, local)
            self._open(local)
            self._uploaded.refs.update(
                {f.name: f.ref for f in chk.files if f.name.endswith(".sst") and not f.ref.foreign}
            )
        else:
            for chk in checkpoints:
                self._copy_from(chk, storage, parent)
        for name, kind in _stored_kinds(self.db).items():
            self._state(name, kind)

    def _copy_from(self, chk: StoreCheckpoint, storage: CheckpointStorage, parent: str) -> None:
        lo = max(self.key_groups.start, chk.key_groups[0])
        hi = min(self.key_groups.stop, chk.key_groups[1])
        if lo >= hi:
            return
        local = os.path.join(parent, f"restore-{uuid.uuid4().hex[:8]}")
        download(storage, chk, local)
        r = _rocksdict()
        old = r.Rdict(local, self._options())
        try:
            db = self.db
            batch = self.batch()
            n = 0
            it = old.iter()
            it.seek(META)
            while it.valid() and it.key().startswith(META):
                db.put(it.key(), it.value())
                it.next()
            it = old.iter()
            it.seek(lo.to_bytes(2, "big"))
            stop = hi.to_bytes(2, "big")
            while it.valid():
                k = it.key()
                if k[:2] >= stop:
                    break
                batch.put(k, it.value())
                n += 1
                if n % _BATCH == 0:
                    db.write(batch)
                    batch = self.batch()
                it.next()
            db.write(batch)
        finally:
            old.close()
            shutil.rmtree(local, ignore_errors=True)


def _items(db: Rdict, start: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) from ``start`` on, in key order (raw mode: bytes; iterated in
    rocksdict's Rust, 2.3x faster than its iterator's key, value and next calls)."""
    items: Iterator[tuple[bytes, bytes]] = db.items(from_key=start)  # type: ignore[assignment]
    return items


def _stored_kinds(db: Rdict) -> dict[str, StateKind]:
    """State name -> kind, as ``db`` records them (the entries under ``META``)."""
    kinds: dict[str, StateKind] = {}
    for k, v in _items(db, META):
        if not k.startswith(META):
            break
        kinds[k[len(META) :].decode()] = StateKind(v.decode())
    return kinds


def _canonical(db: Rdict, key_groups: range, spool: str | None, operator: str) -> SpooledBlob:
    """The canonical whole snapshot (``statebackend.keyed``'s format) of the entries of
    ``db`` in ``key_groups``, keys and values copied as stored: one scan, each state's
    entries into a file of its own (``spool.<i>``; in memory when ``spool`` is None),
    then a blob of the heads and those files. A state's map header holds its count,
    known only at the end; the files are joined without copying them."""
    kinds = {name.encode(): kind for name, kind in _stored_kinds(db).items()}
    outs: dict[bytes, Any] = {}
    counts = dict.fromkeys(kinds, 0)
    paths: dict[bytes, str] = {}
    try:
        for i, name in enumerate(kinds):
            if spool is None:
                outs[name] = io.BytesIO()
            else:
                paths[name] = f"{spool}.{i}"
                outs[name] = open(paths[name], "wb", buffering=_COPY_CHUNK)  # noqa: SIM115
        stop = key_groups.stop.to_bytes(2, "big")
        for k, v in _items(db, key_groups.start.to_bytes(2, "big")):
            if k[:2] >= stop:
                break
            n = k[2]
            name = k[3 : 3 + n]
            out = outs.get(name)
            if out is None:
                raise CorruptCheckpointError(
                    f"operator {operator!r}: the store holds keys of state {name!r}, whose "
                    "kind it does not record"
                )
            out.write(k[3 + n :])
            out.write(v)
            counts[name] += 1
    except BaseException:
        for path in paths.values():
            with contextlib.suppress(OSError):
                os.remove(path)
        raise
    finally:
        for out in outs.values():
            if spool is not None:
                out.close()
    packer = msgpack.Packer(use_bin_type=True)
    head = packer.pack_array_header(2) + packer.pack(FORMAT_VERSION)
    head += packer.pack_array_header(len(kinds))
    parts: list[bytes | str] = []
    for name, kind in kinds.items():
        parts.append(
            head
            + packer.pack_array_header(3)
            + packer.pack(kind.value)
            + packer.pack(name.decode())
            + packer.pack_map_header(counts[name])
        )
        head = b""
        parts.append(outs[name].getvalue() if spool is None else paths[name])
    if not kinds:
        parts.append(head)
    return SpooledBlob.of(tuple(parts))


@dataclass
class StoreWrite:
    """One operator's RocksDB checkpoint in ``local_dir``, to upload (writer thread)."""

    operator: str
    local_dir: str
    key_groups: range
    db_id: str
    uploaded: _Uploaded
    drop_shared: bool = False
    canonical: bool = False
    """A savepoint: `spool`, not `write`."""

    def spool(self) -> SpooledBlob:
        """The canonical whole snapshot of this checkpoint (a savepoint's keyed state), in
        local files next to it; the checkpoint's links are removed either way."""
        r = _rocksdict()
        opts = r.Options(raw_mode=True)
        table = r.BlockBasedOptions()
        table.set_block_cache(r.Cache(1 << 20))  # a scan, once: no use for a large cache
        opts.set_block_based_table_factory(table)
        try:
            db = r.Rdict(self.local_dir, opts, access_type=r.AccessType.read_only())
            try:
                return _canonical(db, self.key_groups, f"{self.local_dir}.canonical", self.operator)
            finally:
                db.close()
        finally:
            shutil.rmtree(self.local_dir, ignore_errors=True)

    def write(
        self, storage: CheckpointStorage, task_id: str, checkpoint_id: int
    ) -> tuple[StoreCheckpoint, int]:
        """Upload the SST files not uploaded before and this checkpoint's metadata files;
        ``(checkpoint, bytes uploaded)``. The local links are removed either way."""
        safe = "".join(c if c.isalnum() else "_" for c in self.operator)
        groups = (self.key_groups.start, self.key_groups.stop)
        files: list[StoreFile] = []
        written = 0
        known = self.uploaded.refs
        try:
            for name in sorted(os.listdir(self.local_dir)):
                local = os.path.join(self.local_dir, name)
                ref = known.get(name) if name.endswith(".sst") else None
                if ref is not None and self.drop_shared:
                    continue
                if ref is None:
                    tag = (
                        self.db_id
                        if name.endswith(".sst")
                        else f"{checkpoint_id}-{uuid.uuid4().hex[:6]}"
                    )
                    path = f"{SHARED_DIR}/{task_id}/{safe}-{tag}-{name}"
                    size, crc = _upload(storage, local, path)
                    ref = StateRef(path, size, crc, True, groups, groups)
                    written += size
                    if name.endswith(".sst"):
                        known[name] = ref
                files.append(StoreFile(name, ref))
        finally:
            shutil.rmtree(self.local_dir, ignore_errors=True)
        return StoreCheckpoint(groups, tuple(files)), written

    def discard(self) -> None:
        shutil.rmtree(self.local_dir, ignore_errors=True)


def _upload(storage: CheckpointStorage, local: str, path: str) -> tuple[int, int]:
    crc = size = 0
    with (
        open(local, "rb") as src,
        storage.fs.open_write_part(storage.fs.join(storage.root, *path.split("/"))) as out,
    ):
        while chunk := src.read(_COPY_CHUNK):
            out.write(chunk)
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def download(storage: CheckpointStorage, chk: StoreCheckpoint, local_dir: str) -> None:
    """The files of ``chk`` into ``local_dir``, each checked against its size and crc32.
    Raises CorruptCheckpointError naming a missing or damaged file."""
    os.makedirs(local_dir, exist_ok=True)
    for f in chk.files:
        fs, path = storage.locate(f.ref)
        crc = size = 0
        try:
            with fs.open_read(path) as src, open(os.path.join(local_dir, f.name), "wb") as out:
                while chunk := src.read(_COPY_CHUNK):
                    out.write(chunk)
                    crc = zlib.crc32(chunk, crc)
                    size += len(chunk)
        except FileNotFoundError:
            raise CorruptCheckpointError(
                f"RocksDB file {path!r} is missing: the checkpoint cannot be restored (its "
                "shared state was deleted); restore an older checkpoint or a savepoint"
            ) from None
        if size != f.ref.size or crc != f.ref.crc32:
            raise CorruptCheckpointError(
                f"RocksDB file {path!r} has {size} bytes and crc32 {crc:#010x}; the "
                f"checkpoint recorded {f.ref.size} and {f.ref.crc32:#010x}"
            )

"""Keyed state of one operator instance, partitioned into key groups.

A key's *key group* (``key_group_of(key)``, in ``[0, max_parallelism)``) is fixed for
the life of a job; an instance owns a contiguous range of key groups. A snapshot is
one blob of the instance's whole range, written as one section per operator (no
regrouping in the writer). A checkpoint taken at parallelism p restores at any
parallelism p' <= max_parallelism: each new instance is given the blobs of every old
instance whose range overlaps its own, and :meth:`KeyedStateBackend.restore` keeps
only the keys of its own key groups. (:meth:`KeyedStateBackend.split_by_key_group`
regroups a blob per key group, for writers that want per-key-group sections.)

Blob format (msgpack): ``[FORMAT_VERSION, [[kind, name, {key: value, ...}], ...]]``
with kind one of ``"value" | "list" | "map"``. A *delta* (:meth:`KeyedStateBackend.
snapshot_delta`, incremental checkpoints: ``statebackend.incremental``) is
``[DELTA_VERSION, [[kind, name, {key: value}], ...], [[name, [deleted key, ...]], ...]]``:
the values of the keys changed since the previous snapshot, and the keys deleted since. The state dicts are packed as msgpack
maps directly (a map is a sequence of key/value pairs on the wire; packing the live
dict avoids building a pairs list: 0.7 ms instead of 1.4 ms for 10,000 int entries).
Maps are unpacked through an ``object_pairs_hook``, so keys that are arrays (tuples)
do not need to be hashable on the wire.

Round trip of values (msgpack types only: None, bool, int, float, str, bytes, arrays,
maps):

* keys — state keys, map-state keys, and keys of any dict inside a value — come back
  with every array (recursively) as a **tuple**, since a key must be hashable;
* values follow the channels' rule: a value-state value, an element of a list state
  and a map-state value come back with arrays (recursively) as **tuples**; the list
  of a list state stays a **list** (it is appended to); arrays inside dicts inside a
  value come back as lists;
* maps come back as dicts (map-state values, dicts inside values).
"""

from __future__ import annotations

import itertools
import operator
import sys
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, BinaryIO

import msgpack

from statebackend.errors import StateError

FORMAT_VERSION = 1
DELTA_VERSION = 2
_ABSENT = object()


class StateKind(StrEnum):
    """The shape of one named state; the value of a key is of this shape."""

    VALUE = "value"
    LIST = "list"
    MAP = "map"


Entry = tuple[str, str, dict[object, object]]
"""One state in a blob: ``[kind, name, {key: value}]`` (a msgpack array: a list once
unpacked). Keys and values are the user's, passed along: the backend never looks inside."""
PackedEntry = tuple[str, str, "PackedMap"]  # an Entry whose map is packed ahead
Deletion = tuple[str, list[object]]
"""The keys a delta deletes from one state: ``[name, [key, ...]]``."""


def _freeze(obj: object) -> object:
    """Arrays (unpacked as lists) to tuples, recursively, so they can be dict keys."""
    if type(obj) is list:
        return tuple([_freeze(x) if x.__class__ is list else x for x in obj])
    return obj


def _value_thaw(value: object) -> object:
    return _freeze(value) if value.__class__ is list else value


def _list_thaw(value: list[object]) -> list[object]:
    return [_freeze(x) if x.__class__ is list else x for x in value]


def _map_thaw(value: dict[object, object]) -> dict[object, object]:
    return {k: (_freeze(v) if v.__class__ is list else v) for k, v in value.items()}


def restored_kind(operator: str, name: str, kind: str) -> StateKind:
    """The kind of state ``name`` as a checkpoint names it; StateError if unknown."""
    try:
        return StateKind(kind)
    except ValueError:
        raise StateError(
            f"operator {operator!r}: state {name!r} in the checkpoint has unknown kind {kind!r}"
        ) from None


def _pairs_to_dict(pairs: list[tuple[object, object]]) -> dict[object, object]:
    return {(_freeze(k) if k.__class__ is list else k): v for k, v in pairs}


def _unpack(blob: bytes) -> list[Entry]:
    """Unpack a full keyed-state blob to its list of ``[kind, name, dict]`` entries."""
    entries, _deleted = _unpack_any(blob)
    return entries


def _unpack_any(blob: bytes) -> tuple[list[Entry], list[Deletion]]:
    """A full blob's or a delta's ``[kind, name, dict]`` entries and ``[name, [key, ...]]``
    deletions (none in a full blob)."""
    try:
        decoded = msgpack.unpackb(
            blob, use_list=True, strict_map_key=False, object_pairs_hook=_pairs_to_dict
        )
    except (ValueError, msgpack.UnpackException) as err:
        raise StateError(f"keyed state blob of {len(blob)} bytes is not msgpack: {err}") from err
    if isinstance(decoded, list) and len(decoded) == 3 and decoded[0] == DELTA_VERSION:
        deleted: list[Deletion] = [(name, [_freeze(k) for k in keys]) for name, keys in decoded[2]]
        delta: list[Entry] = decoded[1]
        return delta, deleted
    if (
        not isinstance(decoded, list)
        or len(decoded) != 2
        or decoded[0] != FORMAT_VERSION
        or not isinstance(decoded[1], list)
    ):
        head = decoded[0] if isinstance(decoded, list) and decoded else decoded
        raise StateError(
            f"keyed state blob has format {head!r}, expected [{FORMAT_VERSION}, [...]] or "
            f"[{DELTA_VERSION}, [...], [...]]; it was written by another version of absflow"
        )
    entries: list[Entry] = decoded[1]
    return entries, []


def sizeof(obj: object, depth: int = 2) -> int:
    """A cheap size of ``obj``: ``sys.getsizeof`` plus its first elements', scaled to its
    length, two levels deep (an estimate for sampling, not an exact measure)."""
    size = sys.getsizeof(obj)
    if depth and obj.__class__ in (list, tuple, set, frozenset):
        assert isinstance(obj, list | tuple | set | frozenset)  # narrowing: the test above
        items = list(itertools.islice(obj, 8))
        if items:
            size += sum(sizeof(x, depth - 1) for x in items) * len(obj) // len(items)
    elif depth and type(obj) is dict:
        pairs = list(itertools.islice(obj.items(), 8))
        if pairs:
            per = sum(sizeof(k, depth - 1) + sizeof(v, depth - 1) for k, v in pairs)
            size += per * len(obj) // len(pairs)
    return size


ENTRY_OVERHEAD = 50
"""Bytes a dict entry costs beyond its key and value: a hash and two pointers in a table
about two thirds full (1 M int keys and values: estimate 106 B, measured 106 B)."""
SAMPLE = 16


def _pack(entries: list[Entry]) -> bytes:
    packed: bytes = msgpack.packb([FORMAT_VERSION, entries], use_bin_type=True)
    return packed


class PackedMap:
    """A msgpack map packed ahead, part by part (`KeyedStateBackend.log_new`): ``count``
    entries, no key twice, whose pairs are the ``bodies`` in turn (each part's bytes
    without its map header). `pack_delta` writes one header for them all."""

    __slots__ = ("bodies", "count")

    def __init__(self) -> None:
        self.bodies: list[memoryview] = []
        self.count = 0

    def add(self, packed: bytes, n: int) -> None:
        """A map of ``n`` entries, as ``Packer.pack_map_pairs`` packs it."""
        header = 1 if n <= 15 else 3 if n <= 0xFFFF else 5  # fixmap, map 16, map 32
        self.bodies.append(memoryview(packed)[header:])
        self.count += n


def pack_delta(entries: Sequence[Entry | PackedEntry], deleted: list[Deletion]) -> bytes:
    """A delta blob: ``entries`` as in a full blob (a state's map may be a `PackedMap`),
    ``deleted`` as ``[name, [key, ...]]``."""
    return _pack_entries(DELTA_VERSION, entries, [deleted])


def pack_full(entries: Sequence[Entry | PackedEntry]) -> bytes:
    """A full blob of ``entries`` (a state's map may be a `PackedMap`; a state may come
    twice, applied in turn)."""
    return _pack_entries(FORMAT_VERSION, entries, [])


def _pack_entries(
    version: int, entries: Sequence[Entry | PackedEntry], after: list[list[Deletion]]
) -> bytes:
    """``[version, entries, *after]``, each `PackedMap` copied in with one map header."""
    if not any(type(state) is PackedMap for _, _, state in entries):
        packed: bytes = msgpack.packb([version, entries, *after], use_bin_type=True)
        return packed
    packer = msgpack.Packer(use_bin_type=True)
    parts: list[bytes | memoryview] = [packer.pack_array_header(2 + len(after))]
    parts += [packer.pack(version), packer.pack_array_header(len(entries))]
    for kind, name, state in entries:
        parts += [packer.pack_array_header(3), packer.pack(kind), packer.pack(name)]
        if type(state) is PackedMap:
            parts.append(packer.pack_map_header(state.count))
            parts += state.bodies
        else:
            parts.append(packer.pack(state))
    parts += [packer.pack(item) for item in after]
    return b"".join(parts)


def unpack_blob(blob: bytes) -> tuple[list[Entry], list[Deletion]]:
    """``(entries, deletions)`` of a full blob (no deletions) or a delta, keys frozen."""
    return _unpack_any(blob)


# Restored values follow the channels' rule (sequences are tuples), except the list of
# a list state, which stays a list so it can be appended to. A thaw takes the unpacked
# value of its kind's shape (what the blob's kind says it is).
_THAW: dict[StateKind, Callable[[Any], object]] = {
    StateKind.VALUE: _value_thaw,
    StateKind.LIST: _list_thaw,
    StateKind.MAP: _map_thaw,
}


class ChangedKeys(dict[object, None]):
    """The keys written since the last delta, in the order they were first written: a set
    that keeps order (a dict of None). A delta looks its keys up in this order, which for
    keys new to the state is the state's own insertion order: the lookups walk the
    state's entries in sequence rather than at random. On a state of 5 M keys, a delta of
    its 600 k newest keys took 470 ms with a set's order and 200 ms with this one."""

    __slots__ = ()

    if TYPE_CHECKING:

        def add(self, key: object) -> object: ...

    else:
        add = dict.setdefault  # one key, in C: the operators call it per record

    def add_all(self, keys: Iterable[object]) -> None:
        dict.update(self, zip(keys, itertools.repeat(None)))


class EpochValues(dict[object, object]):
    """The values an operator wrote into one value state in this epoch, apart from the
    live dict (`KeyedStateBackend.epoch_values`): ``epoch[key]`` of a key not written in
    the epoch reads the live dict (``default`` when absent there too), without keeping it
    here. A key read and written many times in an epoch is then read and written in this
    small dict, and nothing else tracks it: the delta takes the dict as it is."""

    __slots__ = ("default", "live")

    def __init__(self, live: dict[object, object], default: object) -> None:
        super().__init__()
        self.live, self.default = live, default

    def __missing__(self, key: object) -> object:
        return self.live.get(key, self.default)


EPOCH_RECORDS_PER_KEY = 4
"""Reduce and aggregate hold an epoch's values apart (`EpochValues`) while the last delta
had at least this many records written per key it held; else they write the live dict
and put each batch's values in the written values. Apart, a record costs what it costs
without checkpoints (a subscript read and write) and a key ~0.3 µs once per epoch (its
first read, a Python call, then its fold); in the live dict, a record costs ~0.2 µs more
(its write into the written values) unless its batch only added new keys (`log_new`)."""


class KeyedStateBackend:
    """The keyed state of one operator instance.

    Threading: task-loop thread only. The dicts returned by ``value_state``,
    ``list_state`` and ``map_state`` are the live state; the operator's hot path reads
    and writes them directly, and they stay the same objects across :meth:`restore`.
    A state name is unique within the backend, whatever its kind.

    :meth:`snapshot` is the synchronous part of a checkpoint (an immutable msgpack
    copy, taken between two batches); writing the file is the asynchronous part and
    touches only that copy. An operator that keeps recent values elsewhere on its hot
    path registers a ``write_back`` (:meth:`add_write_back`): it runs before every
    snapshot and key count, which therefore always see the whole state.

    Incremental checkpoints: an operator whose every write of a key adds the key to
    :attr:`changed` (``tracks_changes`` in ``runtime.operators``) can be snapshotted by
    :meth:`snapshot_delta`, whose cost is proportional to the keys changed since the
    previous delta, not to the whole state. Reduce and aggregate track cheaper: each
    batch's values into :meth:`written_values`, a batch of only new keys into
    :meth:`log_new` (packed at once), or, after a delta of many records a key, the whole
    epoch in :meth:`epoch_values` (nothing tracked per record).
    """

    in_memory = True
    """Whether the state is Python dicts held whole in memory (``statebackend.rocksdb``:
    not)."""

    def __init__(
        self,
        operator: str,
        max_parallelism: int,
        key_groups: range,
        key_group_of: Callable[[object], int],
    ) -> None:
        if max_parallelism < 1:
            raise StateError(
                f"operator {operator!r}: max_parallelism must be >= 1, got {max_parallelism}"
            )
        if key_groups.step != 1 or (
            len(key_groups) and (key_groups.start < 0 or key_groups.stop > max_parallelism)
        ):
            raise StateError(
                f"operator {operator!r}: key groups {key_groups!r} are not a contiguous "
                f"range inside [0, {max_parallelism})"
            )
        self.operator = operator
        self.max_parallelism = max_parallelism
        self.key_groups = key_groups
        self.key_group_of = key_group_of
        self._kinds: dict[str, StateKind] = {}
        self._states: dict[str, dict[object, object]] = {}
        # [kind, name, live dict] per state: snapshot() packs this list as it is.
        self._layout: list[Entry] = []
        self._write_backs: list[Callable[[], None]] = []
        self.changed: ChangedKeys | None = None
        """Keys written (set, changed in place, or deleted) in any state since the last
        :meth:`snapshot_delta` or :meth:`start_chain`, once :meth:`track_changes` was
        called (None before: nothing is tracked); operators that track changes add to it,
        reading it once per batch."""
        self._written: dict[str, dict[object, object]] = {}
        self._epochs: dict[str, EpochValues] = {}
        self._apart = False  # epoch_values() in use this epoch (EPOCH_RECORDS_PER_KEY)
        self.written_records = 0
        """Records the operators wrote into value states since the last delta (reduce and
        aggregate add each batch's length): with :attr:`delta_keys`, whether the next
        epoch's values are held apart (`epoch_values`)."""
        self._logs: dict[str, PackedMap] = {}  # new keys' values, packed (log_new)
        self._packer = msgpack.Packer(use_bin_type=True)
        self._since_empty = False  # tracked since the state was empty, nothing forgotten
        self.delta_keys = 0  # the keys the last delta wrote (changed or deleted)

    def track_changes(self) -> None:
        """Start tracking changed keys (incremental checkpoints are on)."""
        if self.changed is None:
            self.changed = ChangedKeys()
            # from an empty state on, what is tracked is the whole state (start_chain)
            self._since_empty = not any(self._states.values())

    def written_values(self, name: str = "value") -> dict[object, object] | None:
        """Where an operator puts ``key -> value`` for what it writes into the value state
        ``name`` (as well as into the live dict), once changes are tracked (None before):
        the next delta takes these values as they are, where a key in :attr:`changed`
        costs a lookup in every state (a third of the delta's time on a large state).
        Take it anew per batch (a delta starts a new one); a key put here need not be in
        :attr:`changed`, unless another state of it changed too. Reduce and aggregate
        update it from their output, one ``dict.update`` per batch."""
        if self.changed is None:
            return None
        written = self._written.get(name)
        if written is None:
            written = self._written[name] = {}
        return written

    def epoch_values(self, name: str = "value", default: object = None) -> EpochValues | None:
        """Where reduce and aggregate read and write value state ``name`` in this epoch,
        or None: write the live dict and the :meth:`written_values` (changes are not
        tracked, or the last delta had fewer than ``EPOCH_RECORDS_PER_KEY`` records per
        key). ``epoch[key]`` reads the epoch's value, else the live dict's, else
        ``default``; a write goes to the epoch only. The backend folds the epoch into the
        live dict before every snapshot, delta, key count and restore, and the delta takes
        its values as they are. Take it anew per batch, and add the batch's length to
        :attr:`written_records` (in both cases)."""
        if not self._apart:
            return None
        epoch = self._epochs.get(name)
        if epoch is None:
            epoch = self._epochs[name] = EpochValues(self.value_state(name), default)
        else:
            epoch.default = default
        return epoch

    def log_new(self, pairs: list[tuple[object, object]], name: str = "value") -> None:
        """A batch's ``(key, value)`` pairs, put here instead of in :meth:`written_values`
        when each key is new to value state ``name``, none twice, and none is deleted
        before the next delta (reduce and aggregate, when the state grew by the batch's
        length: they never delete). They are packed now, once, with their values as they
        are now (a later write of a key goes into the written values as usual), and the
        next delta copies the bytes: a log of changes, as Flink's changelog state backend
        keeps, so that the checkpoint's synchronous part does not pack them."""
        if self.changed is None or not pairs:
            return
        try:
            packed = self._packer.pack_map_pairs(pairs)
        except (TypeError, ValueError, OverflowError):
            self._packer.reset()  # a failed pack leaves its bytes behind
            written = self.written_values(name)
            assert written is not None
            written.update(pairs)  # the snapshot then names the state and the value
            return
        log = self._logs.get(name)
        if log is None:
            log = self._logs[name] = PackedMap()
        log.add(packed, len(pairs))

    def _fold_epochs(self) -> None:
        """Fold each epoch's values into the live dict and into the written values (the
        epoch itself becomes them when there are none yet: no copy)."""
        for name, epoch in self._epochs.items():
            if not epoch:
                continue
            epoch.live.update(epoch)
            written = self._written.get(name)
            if written:
                written.update(epoch)
                epoch.clear()
            else:
                self._written[name] = epoch
                self._epochs[name] = EpochValues(epoch.live, epoch.default)

    def forget_changes(self) -> None:
        """Forget the changes tracked so far (a whole snapshot, or the start of a chain)."""
        self._fold_epochs()
        if self.changed is not None:
            self.changed.clear()
        self._written = {}
        self._logs = {}
        self.written_records = 0
        self._since_empty = False

    def add_write_back(self, write_back: Callable[[], None]) -> None:
        """Run ``write_back`` before each snapshot and key count: it writes what the
        operator holds outside the live dicts into them."""
        self._write_backs.append(write_back)

    def _write_back(self) -> None:
        self._fold_epochs()
        for write_back in self._write_backs:
            write_back()

    def _state(self, name: str, kind: StateKind) -> dict[Any, Any]:
        """The live dict of state ``name``; its values have the shape ``kind`` says (the
        typed accessors below name it)."""
        known = self._kinds.get(name)
        if known is None:
            state: dict[object, object] = {}
            self._kinds[name] = kind
            self._states[name] = state
            self._layout.append((kind.value, name, state))
            return state
        if known is not kind:
            raise StateError(
                f"operator {self.operator!r}: state {name!r} is a {known.value} state, "
                f"not a {kind.value} state; give the {kind.value} state another name"
            )
        return self._states[name]

    def value_state(self, name: str = "value") -> dict[Any, Any]:
        """The live dict key -> value of the value state ``name``."""
        return self._state(name, StateKind.VALUE)

    def list_state(self, name: str) -> dict[Any, list[Any]]:
        """The live dict key -> list of the list state ``name``."""
        return self._state(name, StateKind.LIST)

    def map_state(self, name: str) -> dict[Any, dict[Any, Any]]:
        """The live dict key -> dict of the map state ``name``."""
        return self._state(name, StateKind.MAP)

    def states_of_kind(self, kind: str) -> list[dict[object, object]]:
        """The live dicts of every state of ``kind`` ("value", "list" or "map")."""
        wanted = StateKind(kind)
        return [self._states[name] for name, k in self._kinds.items() if k is wanted]

    def named_states(self, kind: str) -> list[tuple[str, dict[object, object]]]:
        """``(name, live dict)`` of every state of ``kind``."""
        wanted = StateKind(kind)
        return [(name, self._states[name]) for name, k in self._kinds.items() if k is wanted]

    def snapshot(self) -> bytes:
        """Serialize all states now (synchronous part): a consistent, immutable blob.

        Raises StateError naming the state if a key or value is not a msgpack type.
        """
        self._write_back()
        try:
            return _pack(self._layout)
        except (TypeError, ValueError, OverflowError) as err:
            bad = next((name for _, name, d in self._layout if not _packable(d)), "<unknown>")
            raise StateError(
                f"operator {self.operator!r}: state {bad!r} cannot be snapshotted: {err}; "
                f"keyed state keys and values must be msgpack types (None, bool, int, "
                f"float, str, bytes, list/tuple, dict)"
            ) from err

    def start_chain(self) -> bytes:
        """A full snapshot that starts a chain of deltas: :attr:`changed` starts empty.
        When changes were tracked since the state was empty and none was forgotten (a
        fresh operator, whose first checkpoint found it large), what was tracked is the
        whole state: the blob is made as a delta is (the log already packed, no lookup of
        an unchanged key), with the keys deleted since left out."""
        if self._since_empty:
            entries, _ = self._tracked_entries()
            blob = self._packed(pack_full, entries)
        else:
            blob = self.snapshot()
        self.track_changes()
        self.forget_changes()
        return blob

    def snapshot_delta(self, drop: bool = False) -> bytes:
        """The synchronous part of an incremental checkpoint: for every key in
        :attr:`changed`, its value in each state, or its deletion where the state no
        longer holds it, and the values put in :meth:`written_values` as they are; then
        both start empty. Cost: the changed keys times the states, plus the written
        values. ``drop`` (tests only: the companion of incremental restore) forgets the
        changes instead of writing them."""
        entries, deleted = self._tracked_entries(drop)
        return self._packed(lambda e: pack_delta(e, deleted), entries)

    def _tracked_entries(
        self, drop: bool = False
    ) -> tuple[list[Entry | PackedEntry], list[Deletion]]:
        """What changed since the last delta (see `snapshot_delta`), as entries and
        deletions; the tracking starts anew."""
        self._write_back()
        if self.changed is None:
            raise StateError(f"operator {self.operator!r}: a delta, but changes are not tracked")
        changed = list(self.changed)  # in the order first written (ChangedKeys)
        written, self._written = self._written, {}
        logs, self._logs = self._logs, {}
        self.changed = ChangedKeys()
        records, self.written_records = self.written_records, 0
        if drop:
            changed, written, logs = [], {}, {}
        self.delta_keys = 0
        entries: list[Entry | PackedEntry] = []
        deleted: list[Deletion] = []
        for kind, name, state in self._layout:
            # One lookup of each changed key in the state, in C (map, zip, count), in the
            # order first written: on a large state the lookups are the delta's cost.
            values = list(map(state.get, changed, itertools.repeat(_ABSENT)))
            gone: list[object] = []
            if any(map(operator.is_, values, itertools.repeat(_ABSENT))):
                gone = [k for k, v in zip(changed, values, strict=True) if v is _ABSENT]
                deleted.append((name, gone))
                found = {k: state[k] for k in changed if k in state}
            else:
                found = dict(zip(changed, values, strict=True))
            own = written.get(name)
            if own:  # written values, with what a lookup found (the state now) over them
                for key in gone:
                    own.pop(key, None)
                own.update(found)
                found = own
            log = logs.get(name)
            if log is None:
                entries.append((kind, name, found))
                self.delta_keys = max(self.delta_keys, len(found) + len(gone))
                continue
            # The logged new keys, then (the same state again: a restore applies both in
            # turn, and a key in both was written after it was logged) what else was written.
            entries.append((kind, name, log))
            if found:
                entries.append((kind, name, found))
            self.delta_keys = max(self.delta_keys, log.count + len(found) + len(gone))
        self._apart = records >= EPOCH_RECORDS_PER_KEY * max(self.delta_keys, 1)
        return entries, deleted

    def _packed(
        self, pack: Callable[[list[Entry | PackedEntry]], bytes], entries: list[Entry | PackedEntry]
    ) -> bytes:
        try:
            return pack(entries)
        except (TypeError, ValueError, OverflowError) as err:
            raise StateError(
                f"operator {self.operator!r}: keyed state cannot be snapshotted: {err}; "
                f"keyed state keys and values must be msgpack types (None, bool, int, "
                f"float, str, bytes, list/tuple, dict)"
            ) from err

    def close(self) -> None:
        """Release what the backend holds outside Python objects (nothing, in memory)."""

    def estimated_bytes(self) -> int:
        """The memory the state takes, estimated cheaply: each state's key count times the
        mean cost of a sample of its entries (`sizeof` of key and value, plus
        ``ENTRY_OVERHEAD``). O(states x SAMPLE), not O(keys), after the write-backs (as
        before a snapshot: what an operator holds elsewhere is counted in the state)."""
        self._write_back()
        total = 0
        for state in self._states.values():
            n = len(state)
            if not n:
                continue
            # the newest entries (a dict's end): their values are the state's current shape
            sample = list(itertools.islice(reversed(state.items()), SAMPLE))
            per = sum(sizeof(k) + sizeof(v) for k, v in sample) // len(sample)
            total += n * (per + ENTRY_OVERHEAD)
        return total

    def key_count(self) -> int:
        """Keys of the largest state (O(states) after folding the epochs' values in; a
        lower bound of :meth:`num_keys`)."""
        self._fold_epochs()
        return max((len(state) for state in self._states.values()), default=0)

    @staticmethod
    def split_by_key_group(blob: bytes, key_group_of: Callable[[object], int]) -> dict[int, bytes]:
        """Regroup a :meth:`snapshot` blob per key group (asynchronous part).

        Each value is a blob of the same format holding only that key group's keys;
        states without keys in a group are left out of its blob. Groups without any
        key are absent.
        """
        groups: dict[int, list[Entry]] = {}
        for kind, name, state in _unpack(blob):
            buckets: dict[int, dict[object, object]] = {}
            for key, value in state.items():
                kg = key_group_of(key)
                bucket = buckets.get(kg)
                if bucket is None:
                    bucket = buckets[kg] = {}
                bucket[key] = value
            for kg, bucket in buckets.items():
                groups.setdefault(kg, []).append((kind, name, bucket))
        return {kg: _pack(entries) for kg, entries in sorted(groups.items())}

    def restore(
        self,
        blobs: Iterable[bytes],
        key_groups: range | None = None,
        written_for: range | None = None,
    ) -> None:
        """Merge blobs (whole snapshots, key-group blobs or deltas, in the order they were
        taken) into the live state.

        Only keys whose key group is in ``self.key_groups`` (and in ``key_groups``, if
        given: the part of a chain's file that counts) are kept, so an instance can be
        given every blob of an old checkpoint, or just the key groups it owns. A delta's
        deletions remove keys. Call before processing records; existing keys are
        overwritten. ``written_for``: the key groups of the instance that wrote the blobs;
        when they all count here, no key is hashed (a restore at the same parallelism).
        """
        self._fold_epochs()  # existing keys, which the blobs overwrite
        self._since_empty = False  # restored keys are not tracked
        owned = self.owned_within(key_groups)
        trusted = written_for is not None and (
            owned.start <= written_for.start and written_for.stop <= owned.stop
        )
        first = owned.start

        def inside(key: object) -> int:
            return first

        key_group_of: Callable[[object], int] = inside if trusted else self.key_group_of
        for blob in blobs:
            entries_of, deletions = _unpack_any(blob)
            for name, keys in deletions:
                state = self._states.get(name)
                if state is not None:
                    for key in keys:
                        if key_group_of(key) in owned:
                            state.pop(key, None)
            for kind, name, entries in entries_of:
                state_kind = restored_kind(self.operator, name, kind)
                state = self._state(name, state_kind)
                thaw = _THAW[state_kind]
                if trusted and state_kind is StateKind.VALUE:  # in C, but for sequences
                    state.update(entries)
                    for key in [k for k, v in entries.items() if v.__class__ is list]:
                        state[key] = _freeze(entries[key])
                    continue
                for key, value in entries.items():
                    if key_group_of(key) in owned:
                        state[key] = thaw(value)

    def owned_within(self, key_groups: range | None) -> range:
        """This instance's key groups, within ``key_groups`` if given (a restore keeps
        only the keys of these)."""
        own = self.key_groups
        if key_groups is None:
            return own
        return range(max(own.start, key_groups.start), min(own.stop, key_groups.stop))

    def restore_streams(
        self,
        streams: Iterable[BinaryIO],
        key_groups: range | None = None,
        written_for: range | None = None,
    ) -> None:
        """As `restore`, each blob given as a stream (``snapshot.keyed_state_streams``):
        in memory, each is read whole (the state it holds is held whole anyway)."""
        self.restore((stream.read() for stream in streams), key_groups, written_for)

    def num_keys(self) -> int:
        """Number of distinct keys over all states (a metric; not for the hot path)."""
        self._write_back()
        if len(self._states) == 1:
            return len(next(iter(self._states.values())))
        return len(set().union(*self._states.values()))


def _packable(obj: object) -> bool:
    try:
        msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return False
    return True

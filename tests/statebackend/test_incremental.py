"""Incremental checkpoints of keyed state, without processes: deltas, chains, merging,
narrowing to key groups, and the metadata of chains (chain files on disk: test_shared)."""

from __future__ import annotations

import zlib
from typing import Any

import msgpack
import pytest

from statebackend.errors import CorruptCheckpointError, StateError
from statebackend.incremental import StateRef, merge_chain
from statebackend.keyed import (
    EPOCH_RECORDS_PER_KEY,
    KeyedStateBackend,
    PackedMap,
    pack_delta,
    unpack_blob,
)
from statebackend.metadata import CheckpointMetadata, OperatorLayout, TaskStateHandle
from statebackend.metrics import CheckpointSummary

GROUPS = 8


def group_of(key: Any) -> int:
    return zlib.crc32(msgpack.packb(key)) % GROUPS


def backend(groups: range = range(GROUPS)) -> KeyedStateBackend:
    b = KeyedStateBackend("op", GROUPS, groups, group_of)
    b.track_changes()
    return b


def contents(b: KeyedStateBackend) -> dict[str, dict[Any, Any]]:
    return {name: dict(state) for name, state in b._states.items()}


def write(b: KeyedStateBackend, key: Any, value: int) -> None:
    """An operator's write: the value state, a list state and a map state of ``key``."""
    assert b.changed is not None
    b.value_state()[key] = value
    b.list_state("seen").setdefault(key, []).append(value)
    b.map_state("last").setdefault(key, {})["v"] = (value, key)
    b.changed.add(key)


def delete(b: KeyedStateBackend, key: Any) -> None:
    assert b.changed is not None
    for name in ("value", "seen", "last"):
        b._states[name].pop(key, None)
    b.changed.add(key)


def test_a_base_and_its_deltas_restore_the_live_state_deletions_included() -> None:
    live = backend()
    for k in range(50):
        write(live, (k, "k"), k)
    blobs = [live.start_chain()]
    for epoch in range(1, 4):
        for k in range(epoch * 5, epoch * 5 + 5):
            write(live, (k, "k"), k * 10 + epoch)
        delete(live, (epoch, "k"))
        blobs.append(live.snapshot_delta())
    restored = backend()
    restored.restore(blobs)
    assert contents(restored) == contents(live)
    assert (1, "k") not in restored.value_state() and (20, "k") in restored.value_state()


def test_a_delta_holds_only_the_changed_keys() -> None:
    live = backend()
    for k in range(1000):
        write(live, k, k)
    base = live.start_chain()
    write(live, 7, 70)
    delta = live.snapshot_delta()
    assert len(delta) * 50 < len(base)
    assert live.changed == {}


def test_the_dropped_deltas_companion_loses_the_changes() -> None:
    live = backend()
    write(live, 1, 1)
    blobs = [live.start_chain()]
    write(live, 1, 2)
    blobs.append(live.snapshot_delta(drop=True))
    restored = backend()
    restored.restore(blobs)
    assert restored.value_state()[1] == 1 != live.value_state()[1]


def test_a_delta_without_tracking_is_refused() -> None:
    b = KeyedStateBackend("op", GROUPS, range(GROUPS), group_of)
    with pytest.raises(StateError, match="not tracked"):
        b.snapshot_delta()


def ref(path: str, base: bool, groups: tuple[int, int] = (0, GROUPS)) -> StateRef:
    return StateRef(path, 1, 0, base, groups, groups)


@pytest.mark.parametrize("with_base", [True, False], ids=["into-a-base", "deltas-only"])
def test_merging_a_run_of_a_chain_restores_what_the_run_restores(with_base: bool) -> None:
    live = backend()
    for k in range(30):
        write(live, k, k)
    blobs = [(ref("b", True), live.start_chain())]
    for epoch in range(4):
        write(live, epoch, 100 + epoch)
        delete(live, 20 + epoch)
        if epoch:
            write(live, 20 + epoch - 1, 7)
        blobs.append((ref(f"d{epoch}", False), live.snapshot_delta()))
    run = blobs if with_base else blobs[1:]
    merged, is_base, _ = merge_chain(run, range(GROUPS), group_of)
    assert is_base is with_base
    one = backend()
    one.restore([b for _, b in run] if with_base else [blobs[0][1], *(b for _, b in run)])
    two = backend()
    two.restore([merged] if with_base else [blobs[0][1], merged])
    assert contents(two) == contents(one) == contents(live)


def test_rescaled_chains_keep_each_key_from_the_instance_that_owned_it() -> None:
    # Two old instances (groups 0-3, 4-7) each have a chain; a stale copy of a key of the
    # other half sits in instance 0's base (as after an earlier rescale): it must not count.
    low, high = backend(range(0, 4)), backend(range(4, 8))
    keys = list(range(200))
    for k in keys:
        write(low if group_of(k) < 4 else high, k, k)
    stale_key = next(k for k in keys if group_of(k) >= 4)
    low.value_state()[stale_key] = -1  # a key of the other half, as an old file may hold
    chains = {}
    for name, b, groups in (("low", low, (0, 4)), ("high", high, (4, 8))):
        base = b.start_chain()
        for k in keys[:20]:
            if b.key_groups.start <= group_of(k) < b.key_groups.stop:
                write(b, k, k + 1000)
        chains[name] = [
            (ref(f"{name}-b", True, groups), base),
            (ref(f"{name}-d", False, groups), b.snapshot_delta()),
        ]
    for new_groups in (range(0, 3), range(3, 6), range(6, 8), range(0, 8)):
        new = backend(new_groups)
        for chain in chains.values():
            for r, blob in chain:
                mine = r.narrowed(new_groups, None)
                if mine is not None:
                    new.restore([blob], key_groups=range(*mine.key_groups))
        want = {
            k: (k + 1000 if k in keys[:20] else k)
            for k in keys
            if new_groups.start <= group_of(k) < new_groups.stop
        }
        assert dict(new.value_state()) == want


def handle_with_chains() -> TaskStateHandle:
    chain = (
        StateRef("shared/sum[0]/1-0-chk-aa.state", 120, 7, True, (0, 64), (0, 64)),
        StateRef("s3://other/root/shared/sum[0]/2-0-chk-bb.state", 30, 9, False, (0, 32), (0, 64)),
    )
    return TaskStateHandle(
        "", 10, 3, {"sum": OperatorLayout(0, 2, (0, 64))}, b"x" * 10, {"sum": chain}
    )


def test_chains_round_trip_through_the_metadata_and_count_their_bytes() -> None:
    handle = handle_with_chains()
    assert TaskStateHandle.decode(handle.encode()) == handle
    assert handle.full_size == 160
    assert handle.shared_files() == {"shared/sum[0]/1-0-chk-aa.state"}  # not another root's
    metadata = CheckpointMetadata(
        3, "job", 0, False, 1.0, 2.0, 1.0, 128, {"sum[0]": handle}, {}, CheckpointSummary()
    )
    assert CheckpointMetadata.from_json(metadata.to_json()).tasks["sum[0]"].chains == handle.chains
    with pytest.raises(CorruptCheckpointError, match="chain entry"):
        StateRef.decode(["path", 1])


def test_a_delta_holds_its_keys_in_the_order_first_written() -> None:
    """The changed keys keep the order they were first written in (ChangedKeys): for keys
    new to the state that is the state's own order, which a delta's lookups then walk in
    sequence. Written again, or deleted, a key keeps its place."""
    b = backend()
    b.start_chain()
    assert b.changed is not None
    for key in (9, 3, 7):
        write(b, key, key)
    write(b, 3, 30)
    b.changed.add_all([11, 9, 5])
    b.value_state().update({11: 11, 5: 5})
    delete(b, 7)
    assert list(b.changed) == [9, 3, 7, 11, 5]
    entries, deleted = unpack_blob(b.snapshot_delta())
    values = next(state for kind, name, state in entries if name == "value")
    assert list(values) == [9, 3, 11, 5] and values[3] == 30
    assert ("value", [7]) in [tuple(d) for d in deleted]
    assert b.changed == {} and b.delta_keys == 5


def test_written_values_go_into_the_delta_without_a_lookup() -> None:
    """What an operator puts in ``written_values`` is the delta's value as it is (reduce
    and aggregate: their output pairs); a key also in ``changed`` is looked up, and its
    deletion wins over a value written before it."""
    live = backend()
    values = live.value_state()
    for k in range(100):
        values[k] = k
    live.forget_changes()  # written untracked: the base is a whole snapshot
    blobs = [live.start_chain()]
    for epoch in range(1, 4):
        written = live.written_values()
        assert written is not None
        pairs = [(k, k * 10 + epoch) for k in range(epoch, 200, 7)]
        values.update(pairs)
        written.update(pairs)
        acc = values[3] = [epoch]  # a value changed in place after it was written
        written[3] = acc
        acc.append(-epoch)
        blobs.append(live.snapshot_delta())
        assert live.written_values() == {}
    written = live.written_values()
    assert written is not None
    values[150], written[150] = 1, 1
    del values[150]
    assert live.changed is not None
    live.changed.add(150)  # deleted after it was written: the lookup says so
    blobs.append(live.snapshot_delta())
    restored = backend()
    restored.restore(blobs)
    expected = contents(live)
    expected["value"][3] = tuple(expected["value"][3])  # restored sequences are tuples
    assert contents(restored) == expected
    assert restored.value_state()[3] == (3, -3) and 150 not in restored.value_state()
    ((entries, _),) = [unpack_blob(blobs[1])]
    assert len(entries[0][2]) == len(range(1, 200, 7)) + 1  # only what was written


def test_the_dropped_deltas_companion_loses_written_values() -> None:
    live = backend()
    live.start_chain()
    written = live.written_values()
    assert written is not None
    live.value_state()[1] = written[1] = 5
    restored = backend()
    restored.restore([live.snapshot_delta(drop=True)])
    assert contents(restored) != contents(live)


def test_epoch_values_are_folded_into_the_state_and_make_the_delta() -> None:
    """Values written in an epoch apart (reduce and aggregate, after a delta of many records
    a key) reach the live state before every snapshot, delta and key count; a key not
    written in the epoch reads the live state, else the default; the delta holds each key
    of the epoch once, at its last value, and base plus deltas restore the live state."""
    live = backend()
    values = live.value_state()
    values.update((k, 0) for k in range(1000))
    live.forget_changes()  # written untracked: the base is a whole snapshot
    blobs = [live.start_chain()]
    assert live.epoch_values() is None  # no delta yet: the live dict, and written values
    live.written_records = EPOCH_RECORDS_PER_KEY * 10
    live.written_values()[5] = values[5] = 1  # type: ignore[index]
    blobs.append(live.snapshot_delta())  # 40 records on one key
    for epoch_no in range(1, 4):
        epoch = live.epoch_values("value", -1)
        assert epoch is not None
        assert epoch[5] == 1 + (epoch_no - 1) * 500 and epoch[99_999] == -1
        assert 99_999 not in epoch and 99_999 not in values  # a read keeps nothing
        for i in range(5000):  # a hot key written many times, a new key now and then
            key = i % 10 if i % 50 else 1000 + epoch_no * 1000 + i
            prev = epoch[key] if key in epoch else values.get(key, 0)
            assert isinstance(prev, int)
            epoch[key] = prev + 1
        live.written_records += 5000
        assert live.key_count() == len(values) > 1000  # folded in: counted
        delta = live.snapshot_delta()
        entries, _ = unpack_blob(delta)
        assert len(entries[0][2]) == 10 + 100  # each key of the epoch once
        blobs.append(delta)
    restored = backend()
    restored.restore(blobs)
    assert contents(restored) == contents(live) and restored.value_state()[3] == 3 * 500


def test_a_delta_of_few_records_a_key_goes_back_to_the_live_dict() -> None:
    live = backend()
    live.start_chain()
    live.written_records = EPOCH_RECORDS_PER_KEY
    live.written_values()[1] = live.value_state()[1] = 1  # type: ignore[index]
    live.snapshot_delta()
    assert live.epoch_values() is not None
    epoch = live.epoch_values()
    assert epoch is not None
    for k in range(100):  # one record a key
        epoch[k] = k
    live.written_records += 100
    live.snapshot_delta()
    assert live.epoch_values() is None and live.value_state()[99] == 99


def test_the_dropped_deltas_companion_loses_epoch_values() -> None:
    live = backend()
    live.start_chain()
    live._apart = True
    epoch = live.epoch_values()
    assert epoch is not None
    epoch[1] = 5
    restored = backend()
    restored.restore([live.snapshot_delta(drop=True)])
    assert live.value_state() == {1: 5} and contents(restored) != contents(live)


def test_logged_new_keys_are_packed_once_and_make_the_delta() -> None:
    """A batch that only added new keys (reduce and aggregate: the state grew by its
    length) is logged, packed at once, not put in the written values: the delta copies the
    log's bytes, then holds what else was written (the same state again), a key written
    after it was logged with its later value."""
    live = backend()
    values = live.value_state()
    values.update((k, 0) for k in range(500))
    live.forget_changes()  # written untracked: the base is a whole snapshot
    blobs = [live.start_chain()]
    for epoch in range(1, 4):
        for start in range(epoch * 1000, epoch * 1000 + 300, 100):  # three batches
            pairs: list[tuple[object, object]] = [
                (k, (epoch, k)) for k in range(start, start + 100)
            ]
            values.update(pairs)
            live.log_new(pairs)
        written = live.written_values()
        assert written is not None and written == {}
        values[7] = written[7] = epoch  # an existing key, written as usual
        first = epoch * 1000
        values[first] = written[first] = -epoch  # a logged key written again
        delta = live.snapshot_delta()
        entries, _ = unpack_blob(delta)
        logged, others = entries  # the same state twice: the log, then the rest
        assert logged[1] == others[1] == "value"
        assert logged[2] == {k: [epoch, k] for k in range(first, first + 300)}  # unpacked
        assert others[2] == {7: epoch, first: -epoch}
        blobs.append(delta)
    restored = backend()
    restored.restore(blobs)
    assert contents(restored) == contents(live) and restored.value_state()[1000] == -1


def test_a_value_the_log_cannot_pack_is_named_by_the_snapshot() -> None:
    """log_new of a value msgpack cannot pack puts the batch in the written values (the
    packer starts clean again): the delta then fails naming the state, as a snapshot does."""
    live = backend()
    live.start_chain()
    live.value_state()[1] = live.value_state()[2] = 0
    live.log_new([(1, 0), (2, object())])
    live.log_new([(3, 3)])
    with pytest.raises(StateError, match="keyed state cannot be snapshotted"):
        live.snapshot_delta()
    live.value_state()[4] = 4
    live.log_new([(4, 4)])
    assert unpack_blob(live.snapshot_delta())[0][0][2] == {4: 4}


def test_without_the_log_the_delta_misses_the_new_keys() -> None:
    """The companion: the same new keys, not logged, are not in the delta."""
    live = backend()
    live.start_chain()
    live.value_state().update((k, 1) for k in range(300))
    restored = backend()
    restored.restore([live.snapshot_delta()])
    assert restored.value_state() == {} != live.value_state()


@pytest.mark.parametrize("sizes", [[1], [7, 8], [15, 16], [65535, 1], [40000, 40000], [0, 3]])
def test_a_log_packs_to_the_same_bytes_as_its_dict(sizes: list[int]) -> None:
    """Parts packed ahead make the map their dict packs to, on each side of msgpack's map
    header sizes (fixmap, map 16, map 32) for a part and for the whole."""
    log, start = PackedMap(), 0
    whole: dict[Any, Any] = {}
    packer = msgpack.Packer(use_bin_type=True)
    for n in sizes:
        pairs = [
            ((i, "k") if i % 3 else i, i * 0.5 if i % 2 else [i]) for i in range(start, start + n)
        ]
        log.add(packer.pack_map_pairs(pairs), n)
        whole.update(pairs)
        start += n
    deleted: list[Any] = [["value", [1, 2]]]
    assert pack_delta([("value", "value", log)], deleted) == pack_delta(
        [("value", "value", whole)], deleted
    )


def test_a_base_tracked_since_the_state_was_empty_is_the_whole_state() -> None:
    """A fresh operator's first base is made from what was tracked since its state was
    empty (logged new keys, written values, an epoch apart, changed keys, deletions left
    out), without packing the state again: it restores what a whole snapshot restores."""
    live = backend()
    values = live.value_state()
    for k in range(20):
        write(live, k, k)  # changed keys, in three states
    delete(live, 3)
    new: list[tuple[object, object]] = [(k, k) for k in range(100, 200)]
    values.update(new)
    live.log_new(new)
    written = live.written_values()
    assert written is not None
    values[150] = written[150] = -1  # a logged key written again
    live._apart = True
    epoch = live.epoch_values()
    assert epoch is not None
    epoch[7] = 70  # held apart until the fold
    whole = KeyedStateBackend("op", GROUPS, range(GROUPS), group_of)
    whole.restore([live.snapshot()])
    base = live.start_chain()
    entries, deletions = unpack_blob(base)
    assert deletions == [] and any(type(e[2]) is dict and 150 in e[2] for e in entries)
    restored = backend()
    restored.restore([base])
    assert contents(restored) == contents(whole) == contents(live)
    assert restored.value_state()[7] == 70 and 3 not in restored.value_state()


def test_after_a_forget_or_a_restore_the_base_is_a_whole_snapshot() -> None:
    """The companion: what was tracked is the whole state only from an empty state on,
    with nothing forgotten; after a forget (a checkpoint below incremental_min_keys) or a
    restore the base is a whole snapshot, and keeps what was not tracked since."""
    for reset in ("forget", "restore"):
        live = backend()
        values = live.value_state()
        if reset == "restore":
            live.restore([backend().snapshot()])
        values[1] = 1  # untracked
        if reset == "forget":
            live.forget_changes()
        restored = backend()
        restored.restore([live.start_chain()])
        assert restored.value_state() == {1: 1}, reset
    untracked = backend()
    untracked.value_state()[1] = 1  # with neither, a base from tracking misses it
    restored = backend()
    restored.restore([untracked.start_chain()])
    assert restored.value_state() == {}

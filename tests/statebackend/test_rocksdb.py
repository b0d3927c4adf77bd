"""The rocksdb keyed state backend without tasks: the mapping over a tiny cache (writes,
in-place changes, deletions surviving eviction), canonical snapshots restored by both
backends, and its checkpoints of immutable files uploaded once, restored at the same key
groups and at others."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from statebackend.errors import CorruptStateError
from statebackend.keyed import KeyedStateBackend
from statebackend.rocksdb import RocksDBStateBackend
from statebackend.snapshot import (
    FLAG_RAW,
    OperatorSnapshot,
    keyed_state_streams,
    verify_state_file,
    write_task_snapshot,
)
from statebackend.storage import CheckpointStorage

MAXP = 128


def kg(key: Any) -> int:
    return (key if isinstance(key, int) else len(str(key))) % MAXP


def rocks(
    tmp_path: Path, groups: range = range(MAXP), capacity: int | None = 4
) -> RocksDBStateBackend:
    backend = RocksDBStateBackend("op", MAXP, groups, kg, lambda: str(tmp_path), 1 << 20)
    assert backend.db is not None  # opened: caches sized
    if capacity is not None:
        for state in backend._states.values():
            state.capacity = capacity  # type: ignore[attr-defined]
    return backend


def fill(backend: KeyedStateBackend, n: int = 500) -> None:
    values, lists, maps = (
        backend.value_state(),
        backend.list_state("l"),
        backend.map_state("m"),
    )
    for state in (values, lists, maps):
        if hasattr(state, "capacity"):
            state.capacity = 4  # type: ignore[union-attr]
    for i in range(n):
        values[i] = i * 10
        lst = lists.get(i)
        if lst is None:
            lst = lists[i] = []
        lst.append(i)  # changed in place after the read
        lst.append(-i)
        m = maps.get(i)
        if m is None:
            m = maps[i] = {}
        m[(i, "a")] = i
    for i in range(0, n, 3):
        del values[i]
        maps.pop(i)


def test_a_tiny_cache_keeps_every_write_and_in_place_change(tmp_path: Path) -> None:
    memory = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    store = rocks(tmp_path)
    fill(memory)
    fill(store)
    assert dict(store.value_state().items()) == dict(memory.value_state().items())
    assert dict(store.list_state("l").items()) == memory.list_state("l")
    assert store.map_state("m").get(4) == {(4, "a"): 4}
    assert 3 not in store.value_state() and store.value_state().get(4) == 40
    assert len(store.value_state()) == len(memory.value_state())
    store.close()


def test_canonical_snapshots_restore_on_either_backend(tmp_path: Path) -> None:
    memory = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    store = rocks(tmp_path)
    fill(memory)
    fill(store)
    from_store = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    from_store.restore([store.snapshot()])
    expected = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    expected.restore([memory.snapshot()])
    for kind, name in (("value", "value"), ("list", "l"), ("map", "m")):
        got = dict(from_store.named_states(kind))[name]
        assert got == dict(expected.named_states(kind))[name], name
    into_store = rocks(tmp_path, capacity=None)
    into_store.restore([memory.snapshot()])
    assert into_store.snapshot() == store.snapshot()
    store.close()
    into_store.close()


def test_checkpoints_upload_each_sst_once_and_restore_at_any_key_groups(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "chk"))
    store = rocks(tmp_path / "a")
    fill(store)
    first, written1 = store.local_checkpoint(1).write(storage, "op[0]", 1)
    store.value_state()[10_001] = 1  # a little more
    second, written2 = store.local_checkpoint(2).write(storage, "op[0]", 2)
    shared = {f.ref.path for f in first.files if f.name.endswith(".sst")}
    assert shared and shared <= {f.ref.path for f in second.files}
    assert 0 < written2 < written1 + written2 and written2 < second.size
    want = store.snapshot()
    same = RocksDBStateBackend("op", MAXP, range(MAXP), kg, lambda: str(tmp_path / "b"))
    same.restore_stores([second], storage)
    assert same.snapshot() == want
    halves = [
        RocksDBStateBackend("op", MAXP, groups, kg, lambda: str(tmp_path / "c"))
        for groups in (range(0, 50), range(50, MAXP))
    ]
    merged = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    for half in halves:
        half.restore_stores([second], storage)
        merged.restore([half.snapshot()])
    expected = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    expected.restore([want])
    assert merged.snapshot() == expected.snapshot()
    for backend in (store, same, *halves):
        backend.close()


def contents(backend: KeyedStateBackend) -> dict[str, dict[Any, Any]]:
    """Every state of ``backend`` by name, through its canonical snapshot."""
    copy = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    copy.restore([backend.snapshot()])
    return {
        name: dict(state)
        for kind in ("value", "list", "map")
        for name, state in copy.named_states(kind)
    }


def test_a_savepoint_is_spooled_to_local_files_and_restores_on_either_backend(
    tmp_path: Path,
) -> None:
    """A savepoint's canonical snapshot is spooled from RocksDB's checkpoint to files (not
    built in memory), copied into the state file as it is, uncompressed, and restores on
    both backends; the checkpoint's links and the spool files are removed."""
    memory = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    store = rocks(tmp_path / "a")
    fill(memory)
    fill(store)
    write = store.local_checkpoint(7, canonical=True)
    blob = write.spool()
    assert not os.path.exists(write.local_dir)
    files = [part for part in blob.parts if isinstance(part, str)]
    assert len(files) == 3 and all(os.path.exists(f) for f in files)  # one per state
    assert blob.read() == store.snapshot()
    path = str(tmp_path / "op.state")
    write_task_snapshot(path, {"op": OperatorSnapshot(None, blob, range(MAXP))}, compress=True)
    blob.discard()
    assert not any(os.path.exists(f) for f in files)
    verify_state_file(path)
    with open(path, "rb") as f:
        assert struct.unpack(">8sHHII", f.read(20))[2] & FLAG_RAW  # copied in, not compressed
    into_memory = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    into_store = rocks(tmp_path / "b", capacity=None)
    for target in (into_memory, into_store):
        with open(path, "rb") as f:
            target.restore_streams(keyed_state_streams(f, "op", range(MAXP)))
        assert contents(target) == contents(memory)
    for backend in (store, into_store):
        backend.close()


class LargestRead:
    """A state file that records the largest read taken from it."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.name, self.largest = f, f.name, 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.largest = max(self.largest, len(data))
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.f.seek(offset, whence)


def large_savepoint(tmp_path: Path, keys: int = 300_000) -> tuple[str, int]:
    """A state file holding one canonical section of ``keys`` keys; its path and size."""
    memory = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    values = memory.value_state()
    for i in range(keys):
        values[i] = i
    path = str(tmp_path / "large.state")
    info = write_task_snapshot(path, {"op": OperatorSnapshot(None, memory.snapshot(), range(MAXP))})
    return path, info.size


def test_rocksdb_restores_a_savepoint_as_a_stream(tmp_path: Path) -> None:
    path, size = large_savepoint(tmp_path)
    store = rocks(tmp_path / "s", capacity=None)
    with open(path, "rb") as f:
        counted = LargestRead(f)
        store.restore_streams(keyed_state_streams(counted, "op", range(MAXP)))  # type: ignore[arg-type]
    assert size > 2 << 20 and counted.largest <= 1 << 20
    assert store.value_state().get(299_999) == 299_999 and len(store.value_state()) == 300_000
    store.close()


def test_companion_the_memory_backend_reads_the_section_whole(tmp_path: Path) -> None:
    """The check above can fail: the in-memory backend, which holds the whole state
    anyway, takes the section in one read."""
    path, size = large_savepoint(tmp_path)
    assert size > 2 << 20
    memory = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    with open(path, "rb") as f:
        counted = LargestRead(f)
        memory.restore_streams(keyed_state_streams(counted, "op", range(MAXP)))  # type: ignore[arg-type]
    assert counted.largest > 1 << 20 and len(memory.value_state()) == 300_000


def test_a_damaged_section_fails_a_streamed_restore_at_its_end(tmp_path: Path) -> None:
    path, size = large_savepoint(tmp_path, keys=1000)
    with open(path, "r+b") as f:  # the last value, another positive fixint: still msgpack
        f.seek(size - 1)
        last = f.read(1)[0]
        f.seek(size - 1)
        f.write(bytes([(last ^ 1) & 0x7F]))
    store = rocks(tmp_path / "s", capacity=None)
    with open(path, "rb") as f, pytest.raises(CorruptStateError, match="crc32 mismatch"):
        store.restore_streams(keyed_state_streams(f, "op", range(MAXP)))
    store.close()


def test_the_in_memory_estimate_follows_the_state() -> None:
    backend = KeyedStateBackend("op", MAXP, range(MAXP), kg)
    values = backend.value_state()
    for i in range(100_000):
        values[i * 7919] = i
    per_key = backend.estimated_bytes() / 100_000
    assert 80 < per_key < 160  # an int key and value in a dict: ~106 bytes
    lists = backend.list_state("l")
    for i in range(100_000):
        lists[i] = list(range(20))
    assert backend.estimated_bytes() > 100_000 * (per_key + 20 * 28)

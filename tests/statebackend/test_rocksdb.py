"""The rocksdb keyed state backend without tasks: the mapping over a tiny cache (writes,
in-place changes, deletions surviving eviction), canonical snapshots restored by both
backends, and its checkpoints of immutable files uploaded once, restored at the same key
groups and at others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from statebackend.keyed import KeyedStateBackend
from statebackend.rocksdb import RocksDBStateBackend
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

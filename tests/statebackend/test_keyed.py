import time
from typing import Any

import pytest

from statebackend import KeyedStateBackend, StateError
from tests.statebackend.keygroups import MAX_PARALLELISM, crc32_key_group_of, key_group_range

KG = crc32_key_group_of()


def backend(index: int = 0, parallelism: int = 1) -> KeyedStateBackend:
    return KeyedStateBackend("count", MAX_PARALLELISM, key_group_range(index, parallelism), KG)


def fill(b: KeyedStateBackend, keys: list[Any]) -> None:
    values, lists, maps = b.value_state(), b.list_state("seen"), b.map_state("per_word")
    for i, k in enumerate(keys):
        values[k] = i
        lists[k] = [i, "x", None, b"raw"]
        maps[k] = {"n": i, ("t", 1): [1.5, True]}


KEYS: list[Any] = [*range(300), *(f"w{i}" for i in range(300)), *((f"a{i}", i) for i in range(100))]


def test_key_group_ranges_partition_all_groups() -> None:
    for p in (1, 3, 4, 128):
        groups = [g for i in range(p) for g in key_group_range(i, p)]
        assert groups == list(range(MAX_PARALLELISM))


def test_round_trip_value_list_map() -> None:
    src = backend()
    fill(src, KEYS)
    values = src.value_state()
    values[("nested", (1, 2))] = ("a", [1, (2, 3)], {"k": (4,)})
    dst = backend()
    dst.restore([src.snapshot()])
    # Restored like records on the channels: sequences come back as tuples (dicts inside
    # a value keep lists), except the list of a list state, which stays a list.
    assert dst.value_state() == {
        **src.value_state(),
        ("nested", (1, 2)): ("a", (1, (2, 3)), {"k": [4]}),
    }
    assert dst.list_state("seen") == src.list_state("seen")
    assert dst.map_state("per_word") == {
        k: {mk: (tuple(mv) if isinstance(mv, list) else mv) for mk, mv in m.items()}
        for k, m in src.map_state("per_word").items()
    }
    assert all(type(v) is list for v in dst.list_state("seen").values())
    assert all(type(v) is dict for v in dst.map_state("per_word").values())
    # keys come back hashable: tuples stay tuples, also nested and as map-state keys
    assert ("nested", (1, 2)) in dst.value_state()
    assert ("t", 1) in dst.map_state("per_word")[0]
    assert dst.num_keys() == len(KEYS) + 1


def test_restore_keeps_live_dicts() -> None:
    src = backend()
    src.value_state()["k"] = 1
    dst = backend()
    live = dst.value_state()
    dst.restore([src.snapshot()])
    assert live is dst.value_state() and live == {"k": 1}


def test_snapshot_is_immutable_copy() -> None:
    b = backend()
    b.value_state()["k"] = 1
    blob = b.snapshot()
    b.value_state()["k"] = 2
    again = backend()
    again.restore([blob])
    assert again.value_state() == {"k": 1}


@pytest.mark.parametrize("new_parallelism", [3, 1, 5])
def test_restore_at_another_parallelism(new_parallelism: int) -> None:
    old = [backend(i, 4) for i in range(4)]
    expected: dict[Any, Any] = {}
    for i, key in enumerate(KEYS):  # route each key to the instance owning its key group
        owner = next(b for b in old if KG(key) in b.key_groups)
        owner.value_state()[key] = i
        owner.list_state("seen")[key] = [i]
        expected[key] = i
    # the async part: every instance's snapshot split per key group
    by_group: dict[int, bytes] = {}
    for b in old:
        parts = KeyedStateBackend.split_by_key_group(b.snapshot(), KG)
        assert set(parts) <= set(b.key_groups)
        assert not set(parts) & set(by_group)
        by_group.update(parts)

    new = [backend(i, new_parallelism) for i in range(new_parallelism)]
    for b in new:
        b.restore(blob for kg, blob in by_group.items() if kg in b.key_groups)
    seen: dict[Any, Any] = {}
    for b in new:
        for key, value in b.value_state().items():
            assert KG(key) in b.key_groups
            assert key not in seen
            seen[key] = value
            assert b.list_state("seen")[key] == [value]
    assert seen == expected


def test_restore_filters_foreign_key_groups() -> None:
    """Giving an instance every blob is safe: it keeps only its own keys."""
    src = backend()
    fill(src, KEYS)
    halves = [backend(0, 2), backend(1, 2)]
    for b in halves:
        b.restore([src.snapshot()])
    assert halves[0].num_keys() + halves[1].num_keys() == len(KEYS)
    assert all(KG(k) in halves[1].key_groups for k in halves[1].value_state())


def test_state_name_kind_conflict() -> None:
    b = backend()
    b.value_state("s")
    with pytest.raises(StateError, match="'s' is a value state"):
        b.list_state("s")


def test_unpackable_value_names_the_state() -> None:
    b = backend()
    b.value_state("ok")[1] = 1
    b.list_state("bad")[1] = [object()]
    with pytest.raises(StateError, match="'bad'"):
        b.snapshot()


def test_bad_key_group_range() -> None:
    with pytest.raises(StateError, match="range"):
        KeyedStateBackend("op", 8, range(4, 9), KG)


def test_snapshot_10k_int_entries_is_fast() -> None:
    b = backend()
    values = b.value_state()
    for i in range(10_000):
        values[i] = i * 31
    best = min(_timed(b.snapshot) for _ in range(7))
    assert best < 0.005, f"snapshot of 10,000 int entries took {best * 1e3:.2f} ms"


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start

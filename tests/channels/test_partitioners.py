"""Key groups, stable hashing across processes, and every partitioner's routing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from channels import partitioners
from channels.partitioners import (
    DEFAULT_MAX_PARALLELISM,
    BroadcastPartitioner,
    ForwardPartitioner,
    HashPartitioner,
    PartitioningError,
    RebalancePartitioner,
    UnroutableKeyError,
    fast_key_fn,
    is_identity,
    key_group_for,
    key_group_range,
    stable_hash,
    subtask_for_key_group,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_KEYS: list[Any] = ["word", "ünïcödé", "", b"bytes", 0, 1, -5, 2**40, None, ("a", 1)]


def _flatten(pairs: list[tuple[int, list[Any]]]) -> list[Any]:
    return [record for _, batch in pairs for record in batch]


# --- stable hashing and key groups -------------------------------------------


def test_stable_hash_is_crc32_of_msgpack() -> None:
    for key in ["word", b"bytes", 7, ("a", 1), None]:
        assert stable_hash(key) == zlib.crc32(msgpack.packb(key, use_bin_type=True))


def test_stable_hash_is_equal_across_processes_with_different_hash_seeds() -> None:
    script = (
        "import json, sys\n"
        "from channels.partitioners import stable_hash\n"
        "keys = [['word', 'ünïcödé', '', 0, 1, -5, 2**40, None, ['a', 1]]]\n"
        "print(json.dumps([stable_hash(k) for k in keys[0]] + [hash('word')]))\n"
    )
    results = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO_ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        results.append(json.loads(out.stdout))
    *hashes_1, builtin_1 = results[0]
    *hashes_2, builtin_2 = results[1]
    # The check can fail: the salted builtin hash differs between the two processes.
    assert builtin_1 != builtin_2
    assert hashes_1 == hashes_2
    local = [stable_hash(k) for k in ["word", "ünïcödé", "", 0, 1, -5, 2**40, None, ("a", 1)]]
    assert hashes_1 == local


def test_equal_python_values_hash_equally() -> None:
    assert stable_hash(True) == stable_hash(1) == stable_hash(1.0)
    assert stable_hash(False) == stable_hash(0) == stable_hash(-0.0)
    assert stable_hash((True, 2.0)) == stable_hash((1, 2))
    assert stable_hash([1, "a"]) == stable_hash((1, "a"))
    assert stable_hash(1.5) != stable_hash(1)
    assert stable_hash(2**70) == stable_hash(float(2**70))
    assert stable_hash(2**70) != stable_hash(2**71)


def test_stable_hash_rejects_non_msgpack_key() -> None:
    with pytest.raises(UnroutableKeyError, match=r"'object'.*msgpack types"):
        stable_hash(object())


def test_key_group_for_is_in_range() -> None:
    for key in SAMPLE_KEYS:
        assert 0 <= key_group_for(key, DEFAULT_MAX_PARALLELISM) < DEFAULT_MAX_PARALLELISM
        assert key_group_for(key, 128) == stable_hash(key) % 128


def test_key_group_range_is_the_inverse_of_subtask_for_key_group() -> None:
    for max_parallelism in range(1, 129):
        for parallelism in range(1, min(16, max_parallelism) + 1):
            owned: list[int] = []
            for subtask in range(parallelism):
                groups = key_group_range(subtask, parallelism, max_parallelism)
                assert len(groups) > 0
                for group in groups:
                    assert subtask_for_key_group(group, max_parallelism, parallelism) == subtask
                owned.extend(groups)
            assert owned == list(range(max_parallelism))


def test_key_group_range_rejects_impossible_values() -> None:
    with pytest.raises(PartitioningError, match="parallelism 200 must be between 1 and"):
        key_group_range(0, 200, 128)
    with pytest.raises(PartitioningError, match="subtask 4 is outside"):
        key_group_range(4, 4, 128)


# --- partitioners --------------------------------------------------------------


def test_forward_returns_the_same_list() -> None:
    records = ["a", "b"]
    [(target, batch)] = ForwardPartitioner(3).partition(records)
    assert target == 3
    assert batch is records
    assert ForwardPartitioner(0).partition([]) == []


def test_broadcast_sends_the_same_list_everywhere() -> None:
    records = ["a", "b"]
    pairs = BroadcastPartitioner(3).partition(records)
    assert [target for target, _ in pairs] == [0, 1, 2]
    assert all(batch is records for _, batch in pairs)
    assert BroadcastPartitioner(3).partition([]) == []


def test_rebalance_round_robin_continues_across_calls() -> None:
    partitioner = RebalancePartitioner(3)
    first = partitioner.partition([0, 1, 2, 3])
    assert sorted(first) == [(0, [0, 3]), (1, [1]), (2, [2])]
    second = partitioner.partition([4, 5])  # continues at target 1
    assert sorted(second) == [(1, [4]), (2, [5])]
    assert partitioner.partition([]) == []
    assert sorted(partitioner.partition([6])) == [(0, [6])]


def test_rebalance_counts_are_balanced_and_order_is_kept() -> None:
    partitioner = RebalancePartitioner(4, start=2)
    per_target: dict[int, list[int]] = {t: [] for t in range(4)}
    value = 0
    for size in [1, 7, 1000, 3, 0, 13, 999]:
        for target, batch in partitioner.partition(list(range(value, value + size))):
            per_target[target].extend(batch)
        value += size
    counts = [len(per_target[t]) for t in range(4)]
    assert sum(counts) == value
    assert max(counts) - min(counts) <= 1
    for target, received in per_target.items():
        assert received == sorted(received)
        assert all((r + 2) % 4 == target for r in received)


def test_hash_routes_every_key_to_the_owner_of_its_key_group() -> None:
    num_targets, max_parallelism = 5, 128
    partitioner = HashPartitioner(lambda r: r[0], num_targets, max_parallelism)
    records = [(f"k{i % 300}", i) for i in range(5000)]
    for batch_start in range(0, len(records), 1000):  # cold, then warm cache
        pairs = partitioner.partition(records[batch_start : batch_start + 1000])
        assert all(batch for _, batch in pairs)
        for target, batch in pairs:
            for key, _ in batch:
                group = key_group_for(key, max_parallelism)
                assert group in key_group_range(target, num_targets, max_parallelism)
        assert (
            sorted(_flatten(pairs), key=lambda r: r[1]) == records[batch_start : batch_start + 1000]
        )


def test_hash_keeps_input_order_within_each_target() -> None:
    partitioner = HashPartitioner(lambda r: r % 50, 4, 128)
    for _ in range(2):
        for _, batch in partitioner.partition(list(range(2000))):
            assert batch == sorted(batch)


def test_hash_distribution_over_targets() -> None:
    num_targets = 4
    partitioner = HashPartitioner(lambda w: w, num_targets, DEFAULT_MAX_PARALLELISM)
    counts: Counter[int] = Counter()
    for target, batch in partitioner.partition([f"w{i}" for i in range(10_000)]):
        counts[target] += len(batch)
    assert sum(counts.values()) == 10_000
    assert len(counts) == num_targets
    assert min(counts.values()) > 0.8 * 10_000 / num_targets


def test_hash_unhashable_keys_bypass_the_cache() -> None:
    partitioner = HashPartitioner(lambda r: [r["a"], r["b"]], 3, 128)
    records = [{"a": i % 7, "b": "x"} for i in range(100)]
    pairs = partitioner.partition(records)
    for target, batch in pairs:
        for record in batch:
            key = (record["a"], record["b"])
            assert partitioner.target_for_key(key) == target
    assert partitioner._cache == {}


def test_hash_agrees_for_equal_keys_of_different_types() -> None:
    partitioner = HashPartitioner(lambda r: r, 7, 128)
    targets = {target for target, _ in partitioner.partition([1, True, 1.0])}
    assert len(targets) == 1
    fresh = HashPartitioner(lambda r: r, 7, 128)
    assert {t for t, _ in fresh.partition([True])} == targets


def test_hash_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partitioners, "HASH_CACHE_SIZE", 100)
    partitioner = HashPartitioner(lambda r: r, 4, 128)
    for start in range(0, 1000, 250):
        pairs = partitioner.partition(list(range(start, start + 250)))
        assert sorted(_flatten(pairs)) == list(range(start, start + 250))
        assert len(partitioner._cache) <= 100


def test_hash_single_target_returns_the_input() -> None:
    records = ["a", "b"]
    assert HashPartitioner(lambda r: r, 1, 128).partition(records) == [(0, records)]


def test_hash_key_fn_errors_propagate() -> None:
    partitioner = HashPartitioner(lambda r: r["missing"], 2, 128)
    partitioner.partition([{"missing": 1}])  # warm: the next batch takes the all-hits loop
    with pytest.raises(KeyError, match="missing"):
        partitioner.partition([{"missing": 1}, {"k": 1}])


def test_hash_records_of_a_batch_whose_key_fn_raised_do_not_reach_the_next_batch() -> None:
    # the buckets outlive a batch: a key function raising half-way must leave them empty
    partitioner = HashPartitioner(lambda r: r["k"], 2, 128)
    good = [{"k": i} for i in range(50)]
    partitioner.partition(good)  # warm: every key cached
    for bad in ([*good, {}], [{"k": 99}, *good, {}]):  # the all-hits and the resolving loop
        with pytest.raises(KeyError):
            partitioner.partition(bad)
        pairs = partitioner.partition([{"k": 1}])
        assert _flatten(pairs) == [{"k": 1}]


def test_hash_sub_batches_are_fresh_lists_owned_by_the_caller() -> None:
    partitioner = HashPartitioner(lambda r: r, 2, 128)
    first = partitioner.partition(list(range(100)))
    kept = {target: list(batch) for target, batch in first}
    partitioner.partition(list(range(100, 200)))  # the next batch must not touch the first
    assert {target: batch for target, batch in first} == kept


def test_hash_new_key_in_a_warm_batch_is_routed_once_and_in_order() -> None:
    partitioner = HashPartitioner(lambda r: r % 20, 3, 128)
    partitioner.partition(list(range(10)))  # caches keys 0..9 only
    pairs = partitioner.partition(list(range(200)))
    assert sorted(_flatten(pairs)) == list(range(200))
    for target, batch in pairs:
        assert batch == sorted(batch)
        assert all(partitioner.target_for_key(r % 20) == target for r in batch)
    assert len(partitioner._cache) == 20


def test_hash_rejects_more_targets_than_key_groups() -> None:
    with pytest.raises(PartitioningError, match="raise max_parallelism"):
        HashPartitioner(lambda r: r, 200, 128)


def _identity_def(record: Any) -> Any:
    return record


def test_is_identity_accepts_only_functions_that_return_their_one_argument() -> None:
    assert is_identity(lambda w: w)
    assert is_identity(_identity_def)
    for fn in (
        lambda w: w[0],
        lambda w: str(w),
        lambda *a: a,
        lambda w, x=1: w,
        lambda w, *, x=1: w,
        str,
        len,
        partitioners.stable_hash,
    ):
        assert not is_identity(fn), fn


def test_hash_with_an_identity_key_routes_as_with_any_key_fn() -> None:
    """The fast path (the record is its key, no key_fn call) routes every record where
    the general path does, from the first (resolving) batch to the warm ones."""
    records = [f"w{(i * 7919) % 1000}" for i in range(5000)]
    fast = HashPartitioner(lambda w: w, 3, 128)
    general = HashPartitioner(lambda w: w + "", 3, 128)
    assert fast._identity and not general._identity
    for start in range(0, len(records), 1000):
        batch = records[start : start + 1000]
        assert fast.partition(batch) == general.partition(batch)


def test_hash_identity_fast_path_is_taken() -> None:
    """Companion: a key_fn that counts its calls is called per record unless it is an
    identity; an identity one is never called once the cache is warm."""
    calls = 0

    def counting(record: Any) -> Any:
        nonlocal calls
        calls += 1
        return record

    batch = [f"k{i % 10}" for i in range(100)]
    general = HashPartitioner(counting, 2, 128)
    general.partition(batch)
    general.partition(batch)
    assert calls == 200  # no identity: one call per record, every batch
    fast = HashPartitioner(lambda w: w, 2, 128)
    fast.partition(batch)  # resolves the keys (calls the function), caching them
    fast.partition(batch)  # every key cached: the next batch takes the warm loop
    fast._key_fn = lambda w: pytest.fail("an identity key_fn is not called when warm")
    expected = [(t, [r for r in batch if fast.target_for_key(r) == t]) for t in range(2)]
    assert fast.partition(batch) == [(t, part) for t, part in expected if part]


def _first_with_doc(record: Any) -> Any:
    """A docstring does not change the body."""
    return record[0]


def test_fast_key_fn_turns_subscripts_by_a_constant_into_itemgetter() -> None:
    import operator

    records: list[Any] = [("a", 1), ["b", 2], "cd", {0: "x", "user": "u", -1: "y"}]
    cases: list[tuple[Callable[[Any], Any], Any]] = [
        (lambda r: r[0], 0),
        (lambda e: e["user"], "user"),
        (lambda r: r[-1], -1),
        (_first_with_doc, 0),
    ]
    for fn, const in cases:
        fast = fast_key_fn(fn)
        assert isinstance(fast, operator.itemgetter), fn
        for record in records:
            try:
                expected: Any = fn(record)
            except (LookupError, TypeError) as err:
                expected = type(err)
            try:
                got: Any = fast(record)
            except (LookupError, TypeError) as err:
                got = type(err)
            assert got == expected, (const, record)
    for fn in (
        lambda r: r,
        lambda r: r[0:1],
        lambda r: r[1.5],
        lambda r: r[True],
        lambda r: r[(0, 1)],
        lambda r: r[0][1],
        lambda r, i=0: r[i],
        lambda *r: r[0],
        str,
    ):
        assert fast_key_fn(fn) is fn, fn


def test_hash_with_an_itemgetter_key_routes_as_the_lambda() -> None:
    """Companion of fast_key_fn: the partitioner uses the itemgetter, and routes every
    record where the lambda routes it."""
    import operator

    records = [(f"w{i % 97}", i) for i in range(3000)]
    fast = HashPartitioner(lambda r: r[0], 3, 128)
    general = HashPartitioner(lambda r: r[0] + "", 3, 128)
    assert isinstance(fast._key_fn, operator.itemgetter)
    assert not isinstance(general._key_fn, operator.itemgetter)
    for start in range(0, len(records), 1000):
        batch = records[start : start + 1000]
        assert fast.partition(batch) == general.partition(batch)

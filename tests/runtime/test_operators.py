"""Operators on batches, without Spark: keyed state per key, snapshot and restore."""

from __future__ import annotations

import collections
from typing import Any

from runtime.graph import Step, StepKind
from runtime.operators import build_operator


def keyed_step(kind: StepKind, fn: Any, **args: Any) -> Step:
    return Step(0, kind.value, kind, 1, fn=fn, args=args, key_fn=lambda r: r[0])


def test_reduce_emits_running_values_per_key() -> None:
    op = build_operator(keyed_step(StepKind.REDUCE, lambda a, b: (a[0], a[1] + b[1])), 0, 128, None)
    assert op.process([("a", 1), ("b", 5), ("a", 2)]) == [("a", 1), ("b", 5), ("a", 3)]
    assert op.process([("b", 1)]) == [("b", 6)]


def test_aggregate_with_a_factory_keeps_accumulators_apart() -> None:
    op = build_operator(
        keyed_step(StepKind.AGGREGATE, lambda acc, r: [*acc, r[1]], initial=list), 0, 128, None
    )
    assert op.process([("a", 1), ("b", 2), ("a", 3)]) == [("a", [1]), ("b", [2]), ("a", [1, 3])]


def test_keyed_state_survives_snapshot_and_restore() -> None:
    step = keyed_step(StepKind.AGGREGATE, lambda c, _r: c + 1, initial=0)
    op = build_operator(step, 0, 128, None)
    op.process([("a", 0), ("a", 0), ("b", 0)])
    assert op.keyed_state is not None
    blob = op.keyed_state.snapshot()
    fresh = build_operator(step, 0, 128, None)
    assert fresh.keyed_state is not None
    fresh.keyed_state.restore([blob])
    assert fresh.process([("a", 0), ("c", 0)]) == [("a", 3), ("c", 1)]


def test_keyed_operators_with_an_identity_key_match_the_general_path() -> None:
    """key_by(lambda w: w): the record is its key (no key_fn call per record); reduce
    and aggregate emit exactly what they emit with an equivalent non-identity key."""
    words: list[object] = ["a", "b", "a", "c", "a", "b"]  # records, as operators see them

    def step(kind: StepKind, fn: Any, key_fn: Any, **args: Any) -> Step:
        return Step(0, kind.value, kind, 1, fn=fn, args=args, key_fn=key_fn)

    for kind, fn, args in (
        (StepKind.AGGREGATE, lambda c, _w: c + 1, {"initial": 0}),
        (StepKind.REDUCE, lambda a, b: a + b, {}),
    ):
        fast = build_operator(step(kind, fn, lambda w: w, **args), 0, 128, None)
        general = build_operator(step(kind, fn, lambda w: w + "", **args), 0, 128, None)
        assert fast.key_is_record and not general.key_is_record  # type: ignore[attr-defined]
        assert fast.process(words) == general.process(words)
        assert fast.process(words[:2]) == general.process(words[:2])
        assert fast.snapshot_state(1) == general.snapshot_state(1)
    agg = build_operator(
        step(StepKind.AGGREGATE, lambda c, _w: c + 1, lambda w: w, initial=0), 0, 128, None
    )
    assert agg.process(words) == [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("a", 3), ("b", 2)]


def test_keyed_operators_read_a_subscript_key_with_itemgetter() -> None:
    """key_by(lambda r: r[0]) runs as operator.itemgetter(0) (no Python frame per
    record), with the output of the lambda."""
    import operator

    op = build_operator(keyed_step(StepKind.AGGREGATE, lambda c, r: c + r[1], initial=0), 0, 128)
    assert isinstance(op.key_fn, operator.itemgetter)  # type: ignore[attr-defined]
    assert op.process([("a", 1), ("b", 5), ("a", 2)]) == [("a", 1), ("b", 5), ("a", 3)]


def test_constant_addend_recognises_only_acc_plus_a_constant() -> None:
    from runtime.operators import _MISSING, constant_addend

    def add_ten(acc: int, _r: Any) -> int:
        """A docstring does not change the body."""
        return acc + 10

    def star(acc: int, *rest: Any) -> int:
        return acc + 1

    assert constant_addend(lambda c, _w: c + 1) == 1
    assert constant_addend(lambda c, _w: c + 2.5) == 2.5
    assert constant_addend(add_ten) == 10
    for fn in (
        lambda c, w: c + w,  # the record, not a constant
        lambda c, _w: 1 + c,  # the constant first
        lambda c, _w: c - 1,
        lambda c: c + 1,  # one parameter
        star,
        len,  # not a Python function
    ):
        assert constant_addend(fn) is _MISSING, fn


def test_aggregate_adding_a_constant_matches_the_general_path_and_a_counter() -> None:
    """aggregate(0, lambda c, _w: c + 1) runs without a call per record: it emits exactly
    what the same count as a general function emits (``1 + c`` is not recognised), for an
    identity and a computed key, and its running counts are collections.Counter's."""
    import collections
    import random

    rng = random.Random(7)
    words: list[object] = [f"w{rng.randrange(50)}" for _ in range(2000)]
    counter: collections.Counter[object] = collections.Counter()
    expected = []
    for w in words:
        counter[w] += 1
        expected.append((w, counter[w]))

    def step(fn: Any, key_fn: Any) -> Step:
        return Step(0, "count", StepKind.AGGREGATE, 1, fn=fn, args={"initial": 0}, key_fn=key_fn)

    for key_fn in (lambda w: w, lambda w: w + ""):
        fast = build_operator(step(lambda c, _w: c + 1, key_fn), 0, 128, None)
        general = build_operator(step(lambda c, _w: 1 + c, key_fn), 0, 128, None)
        assert fast.addend == 1 and general.addend is not fast.addend  # type: ignore[attr-defined]
        got = fast.process(words[:700]) + fast.process(words[700:])
        assert got == general.process(words[:700]) + general.process(words[700:])
        assert got == expected
        assert fast.snapshot_state(1) == general.snapshot_state(1)


def count_step(fn: Any, initial: Any = 0, key_fn: Any = None) -> Step:
    return Step(
        0,
        "count",
        StepKind.AGGREGATE,
        1,
        fn=fn,
        args={"initial": initial},
        key_fn=key_fn or (lambda w: w),
    )


def test_int_totals_reach_keyed_state_before_every_snapshot_and_key_count() -> None:
    """An int aggregate keeps its totals in C counters between snapshots; the keyed state
    writes them back before a snapshot or a key count, so both see every record, and a
    restore goes on from them."""
    words: list[object] = [f"w{i % 7}" for i in range(300)]  # 43 a key: enough to keep the counters
    fast = build_operator(count_step(lambda c, _w: c + 1), 0, 128)
    general = build_operator(count_step(lambda c, _w: 1 + c), 0, 128)
    assert fast.totals is not None and general.totals is None  # type: ignore[attr-defined]
    assert fast.keyed_state is not None and general.keyed_state is not None
    assert fast.process(words) == general.process(words)
    assert fast.keyed_state.value_state() == {}  # the counts are in the counters yet
    assert fast.keyed_state.num_keys() == 7
    assert fast.keyed_state.value_state() == general.keyed_state.value_state()
    assert fast.process(words[:250]) == general.process(words[:250])
    blob = fast.keyed_state.snapshot()
    assert blob == general.keyed_state.snapshot()
    assert fast.totals.enabled  # type: ignore[attr-defined]
    resumed = build_operator(count_step(lambda c, _w: c + 1), 0, 128)
    assert resumed.keyed_state is not None
    resumed.keyed_state.restore([blob])
    seen = collections.Counter(words + words[:250])
    assert resumed.process(words[:3]) == [(w, seen[w] + 1) for w in words[:3]]


def test_without_the_write_back_a_snapshot_misses_the_counts(monkeypatch: Any) -> None:
    """Companion: with the write-back switched off, a snapshot loses what the counters hold."""
    from statebackend.keyed import KeyedStateBackend

    monkeypatch.setattr(KeyedStateBackend, "add_write_back", lambda self, fn: None)
    op = build_operator(count_step(lambda c, _w: c + 1), 0, 128)
    op.process(["a", "a", "b"])
    assert op.keyed_state is not None
    fresh = build_operator(count_step(lambda c, _w: c + 1), 0, 128)
    assert fresh.keyed_state is not None
    fresh.keyed_state.restore([op.keyed_state.snapshot()])
    assert fresh.process(["a"]) == [("a", 1)]  # not 3: the two counted "a" were lost


def test_int_totals_stay_exact_past_64_bits_and_over_restored_floats() -> None:
    big = 2**62
    op = build_operator(count_step(lambda c, _w: c + 4611686018427387904, initial=big), 0, 128)
    assert op.process(["k"] * 4) == [("k", big * n) for n in range(2, 6)]
    assert op.keyed_state is not None
    assert op.keyed_state.num_keys() == 1  # writes back (msgpack could not pack 2**64)
    assert op.keyed_state.value_state() == {"k": big * 5}
    # A float total in the state (written by another initial, e.g. 0.5): the same
    # additions, and the exact last total written back (not a sum less the addend).
    floats = build_operator(count_step(lambda c, _w: c + 1, initial=0.1), 0, 128)
    assert floats.totals is None  # type: ignore[attr-defined]
    floats.process(["x", "x"])
    assert floats.keyed_state is not None
    ints = build_operator(count_step(lambda c, _w: c + 1), 0, 128)
    assert ints.keyed_state is not None
    ints.keyed_state.restore([floats.keyed_state.snapshot()])
    assert ints.process(["x", "y", "x"]) == [("x", 0.1 + 1 + 1 + 1), ("y", 1), ("x", 0.1 + 4)]
    ints.keyed_state.snapshot()
    assert ints.keyed_state.value_state() == {"x": 0.1 + 1 + 1 + 1 + 1, "y": 1}


def test_running_totals_turn_off_after_an_epoch_of_few_records_a_key() -> None:
    """Many keys with few records each between snapshots: the counters would cost more
    than they save (MIN_RECORDS_PER_KEY), so the operator goes back to Python's loop, with
    the same output and state."""
    from runtime.operators import MIN_RECORDS_PER_KEY

    sparse: list[object] = [f"u{i}" for _ in range(3) for i in range(2000)]  # 3 records a key
    dense: list[object] = ["a", "b"] * MIN_RECORDS_PER_KEY
    fast = build_operator(count_step(lambda c, _w: c + 1), 0, 128)
    general = build_operator(count_step(lambda c, _w: 1 + c), 0, 128)
    assert fast.keyed_state is not None and general.keyed_state is not None
    assert fast.process(dense) == general.process(dense)
    assert fast.keyed_state.snapshot() == general.keyed_state.snapshot()
    assert fast.totals.enabled  # type: ignore[attr-defined]  # 32 records a key
    assert fast.process(sparse) == general.process(sparse)
    assert fast.keyed_state.snapshot() == general.keyed_state.snapshot()
    assert not fast.totals.enabled  # type: ignore[attr-defined]
    assert fast.process(dense + sparse) == general.process(dense + sparse)
    assert len(fast.totals) == 0  # type: ignore[attr-defined]  # the loop ran
    assert fast.keyed_state.snapshot() == general.keyed_state.snapshot()


def test_reduce_and_aggregate_under_incremental_checkpoints_match_untracked_runs() -> None:
    """With changes tracked, reduce and aggregate write the live dict (a batch of only new
    keys appended, others into the written values) after a delta of few records a key,
    and an epoch apart after one of many: every variant emits what an untracked operator
    emits, both ways are taken, and a base plus the deltas restore the live state."""
    import random

    from statebackend.keyed import KeyedStateBackend

    rng = random.Random(7)
    hot = [(f"h{rng.randrange(40)}", rng.randrange(9)) for _ in range(3000)]
    epochs = [
        [(f"n{i}", i) for i in range(500)],  # each key new: appended
        hot,  # many records a key: apart from the next epoch on
        hot[:1000],
        [(f"m{i % 700}", i) for i in range(900)] + hot[:100],  # few a key: the live dict
        hot[:500],
    ]

    def pairs(records: list[Any]) -> list[Any]:
        return records

    def words(records: list[Any]) -> list[Any]:
        return [k for k, _ in records]

    word_count = Step(
        0,
        "w",
        StepKind.AGGREGATE,
        1,
        fn=lambda c, w: c + len(w),
        args={"initial": 0},
        key_fn=lambda w: w,
    )  # the record is its key
    steps = [
        (keyed_step(StepKind.REDUCE, lambda a, b: (a[0], a[1] + b[1])), pairs),
        (keyed_step(StepKind.AGGREGATE, lambda c, r: c + r[1], initial=0), pairs),
        (keyed_step(StepKind.AGGREGATE, lambda a, r: (*a[-2:], r[1]), initial=tuple), pairs),
        (keyed_step(StepKind.AGGREGATE, lambda c, _r: c + 2, initial=0.5), pairs),  # acc + c
        (word_count, words),
    ]
    for step, shape in steps:
        tracked, plain = build_operator(step, 0, 128), build_operator(step, 0, 128)
        keyed = tracked.keyed_state
        assert keyed is not None
        keyed.track_changes()
        blobs, ways = [keyed.start_chain()], []
        for records in map(shape, epochs):
            for i in range(0, len(records), 100):
                ways.append(keyed.epoch_values() is not None)
                batch: list[object] = records[i : i + 100]
                assert tracked.process(batch) == plain.process(batch)
            blobs.append(keyed.snapshot_delta())
        assert any(ways) and not all(ways), ways
        restored = KeyedStateBackend("r", 128, keyed.key_groups, keyed.key_group_of)
        restored.restore(blobs)
        assert restored.value_state() == keyed.value_state() == plain.keyed_state.value_state()  # type: ignore[union-attr]


def test_untracked_reduce_and_aggregate_never_count_their_state() -> None:
    """Without changes tracked (no checkpoints, or the rocksdb backend, whose len() is a
    scan of the store) reduce and aggregate never take their state's length: a batch
    costs what it did before incremental checkpoints."""
    from statebackend.keyed import KeyedStateBackend

    class Uncountable(dict[Any, Any]):
        def __len__(self) -> int:
            raise AssertionError("len() of the state on the hot path")

    class Store(KeyedStateBackend):
        def value_state(self, name: str = "value") -> dict[Any, Any]:
            state = self._states.get(name)
            if state is None:
                state = self._states[name] = Uncountable()
            return state

    for step in (
        keyed_step(StepKind.REDUCE, lambda a, b: (a[0], a[1] + b[1])),
        keyed_step(StepKind.AGGREGATE, lambda c, r: c + r[1], initial=0),
        keyed_step(StepKind.AGGREGATE, lambda acc, r: (*acc, r[1]), initial=tuple),
    ):
        op = build_operator(step, 0, 128, keyed_state_factory=Store)
        assert op.process([("a", 1), ("b", 2), ("a", 3)])[-1] in (("a", 4), ("a", (1, 3)))

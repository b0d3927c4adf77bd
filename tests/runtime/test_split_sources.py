"""`SplitsSource` (runtime/split_sources.py) read by hand: each subtask reads its splits
in turn, names the split of every batch and the splits that ended, resumes exactly from a
snapshot, and a split that goes quiet is skipped (on a fake clock) until it speaks again."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from runtime.errors import GraphError
from runtime.split_sources import SplitsSource


def pair(split: int, i: int) -> tuple[int, int]:
    return (split, i)


def read_all(reader: Any, batch: int = 100) -> list[tuple[Any, list[Any], list[Any]]]:
    """``(split of the batch, batch, splits ended by it)`` until the reader ends."""
    out = []
    while (records := reader.read_batch(batch)) is not None:
        if records:
            out.append((reader.current_split(), records, reader.take_ended_splits()))
    return out


def test_a_subtask_reads_its_splits_in_turn_a_batch_each() -> None:
    source = SplitsSource(pair, [5, 3, 4, 2], batch=2)
    reads = read_all(source.create_reader(0, 2))  # splits 0 and 2
    assert [(s, r) for s, r, _ in reads] == [
        (0, [(0, 0), (0, 1)]),
        (2, [(2, 0), (2, 1)]),
        (0, [(0, 2), (0, 3)]),
        (2, [(2, 2), (2, 3)]),
        (0, [(0, 4)]),
    ]
    assert [ended for _, _, ended in reads] == [[], [], [], [2], [0]]


def test_every_record_of_every_split_is_read_once_at_any_parallelism() -> None:
    counts = [7, 0, 3, 11, 1]
    expected = sorted(pair(j, i) for j, c in enumerate(counts) for i in range(c))
    for p in (1, 2, 3, 5, 8):
        source = SplitsSource(pair, counts, batch=3)
        got = [
            r
            for s in range(p)
            for _, batch, _ in read_all(source.create_reader(s, p))
            for r in batch
        ]
        assert sorted(got) == expected, p


def test_a_restored_reader_resumes_every_split_where_the_snapshot_was() -> None:
    source = SplitsSource(pair, [6, 6], batch=2)
    first = source.create_reader(0, 1)
    before = [r for _ in range(3) for r in first.read_batch(10) or []]
    state = first.snapshot()
    fresh = source.create_reader(0, 1)
    fresh.restore(state)
    after = [r for _, batch, _ in read_all(fresh) for r in batch]
    assert sorted(before + after) == sorted(pair(j, i) for j in range(2) for i in range(6))
    assert not set(before) & set(after)


def test_a_quiet_split_is_skipped_until_its_pause_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    clock = SimpleNamespace(monotonic=lambda: now[0])
    monkeypatch.setattr("runtime.split_sources.time", clock)  # this module's clock only
    source = SplitsSource(pair, [4, 4], batch=10, pauses={0: [(2, 5.0)]})
    reader = source.create_reader(0, 1)
    assert reader.read_batch(10) == [(0, 0), (0, 1)]  # the batch ends where split 0 goes quiet
    assert reader.read_batch(10) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert reader.read_batch(10) == []  # only split 0 is left, and it is quiet
    now[0] = 104.9
    assert reader.read_batch(10) == []
    now[0] = 105.0
    assert reader.read_batch(10) == [(0, 2), (0, 3)]
    assert reader.read_batch(10) is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fn": 3}, "needs a callable fn"),
        ({"counts": []}, "counts must be a non-empty list of ints >= 0, got \\[\\]"),
        ({"counts": [2, -1]}, "counts must be"),
        ({"batch": 0}, "batch must be an int >= 1, got 0"),
    ],
)
def test_bad_settings_name_the_source(kwargs: dict[str, Any], match: str) -> None:
    settings: dict[str, Any] = {"fn": pair, "counts": [1]} | kwargs
    with pytest.raises(GraphError, match=rf"source 'src': .*{match}"):
        SplitsSource(**settings).validate("src")

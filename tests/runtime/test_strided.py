"""Strided reader positions (runtime/strided.py): snapshot encoding, and redistribution at
another parallelism emitting every index exactly once across any chain of rescales."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from runtime import strided
from runtime.strided import StridedPosition

COUNT = 100
Redistribute = Callable[[Iterable[tuple[int, Any]], int, int, int], tuple[int, list[int]]]


def read(pos: StridedPosition, batches: int, batch: int, count: int | None) -> list[int]:
    out: list[int] = []
    for _ in range(batches):
        out += pos.take(batch, count)
    return out


def run_and_snapshot(
    states: list[Any], old: int, new: int, rng: random.Random, redistribute: Redistribute
) -> tuple[list[int], list[Any]]:
    """New readers at ``new`` from ``states`` taken at ``old``; each reads a random
    number of batches; returns what they emitted and their snapshots."""
    emitted: list[int] = []
    snapshots = []
    for s in range(new):
        pos = StridedPosition(s, new)
        pos.next, pos.gaps = redistribute(enumerate(states), old, s, new)
        emitted += read(pos, rng.randrange(4), rng.randrange(1, 6), COUNT)
        snapshots.append(strided.encode(pos.next, pos.gaps))
    return emitted, snapshots


def drain(states: list[Any], old: int, redistribute: Redistribute) -> list[int]:
    """Everything the readers restored from ``states`` emit to the end (at parallelism 2)."""
    emitted: list[int] = []
    for s in range(2):
        pos = StridedPosition(s, 2)
        pos.next, pos.gaps = redistribute(enumerate(states), old, s, 2)
        while not pos.ended(COUNT):
            emitted += pos.take(7, COUNT)
    return emitted


def chain_of_rescales(seed: int, redistribute: Redistribute = strided.redistribute) -> list[int]:
    """Every index emitted (sorted) by readers at 3, then at four random parallelisms, each
    restored from the last one's snapshots, and at last drained to the end."""
    rng = random.Random(seed)
    emitted, states = run_and_snapshot([s for s in range(3)], 3, 3, rng, redistribute)
    old = 3
    for p in [rng.randrange(1, 6) for _ in range(4)]:
        more, states = run_and_snapshot(states, old, p, rng, redistribute)
        emitted += more
        old = p
    return sorted(emitted + drain(states, old, redistribute))


@pytest.mark.parametrize("seed", range(20))
def test_a_chain_of_rescales_emits_every_index_exactly_once(seed: int) -> None:
    assert chain_of_rescales(seed) == list(range(COUNT))


def forgetful(
    parts: Iterable[tuple[int, Any]], old: int, s: int, new: int
) -> tuple[int, list[int]]:
    """A redistribution that drops the old subtasks' gaps."""
    return strided.redistribute([(j, strided.decode(st)[0]) for j, st in parts], old, s, new)


def test_the_check_catches_a_redistribution_that_forgets_the_gaps() -> None:
    assert any(chain_of_rescales(seed, forgetful) != list(range(COUNT)) for seed in range(20))


def test_new_subtasks_owe_the_unemitted_indices_of_their_residue_then_their_stride() -> None:
    states = [(0, strided.encode(6, [])), (1, strided.encode(3, []))]
    # Emitted so far: 0, 2, 4 and 1; owed below the frontier 6: 3 and 5.
    assert strided.redistribute(states, 2, 0, 3) == (6, [3])
    assert strided.redistribute(states, 2, 1, 3) == (7, [])
    assert strided.redistribute(states, 2, 2, 3) == (8, [5])


def test_no_parts_start_the_stride_at_the_subtask() -> None:
    assert strided.redistribute([], 4, 2, 3) == (2, [])


@pytest.mark.parametrize(("next_index", "gaps"), [(7, []), (12, [1, 5]), (0, [])])
def test_encode_decode_round_trip(next_index: int, gaps: list[int]) -> None:
    assert strided.decode(strided.encode(next_index, gaps)) == (next_index, gaps)


def test_a_position_without_gaps_is_stored_as_a_bare_int_as_old_checkpoints_were() -> None:
    assert strided.encode(9, []) == 9
    assert strided.decode(9) == (9, [])
    assert strided.decode({"next": 9}) == (9, [])


def test_take_serves_gaps_first_then_the_stride_and_stops_at_count() -> None:
    pos = StridedPosition(1, 3)
    assert pos.take(2, None) == range(1, 7, 3)  # no gaps: no list of the indices
    pos.gaps = [2, 30, 5]
    assert list(pos.take(2, 10)) == [2, 5]  # 30 is past the count: dropped, not emitted
    assert list(pos.take(4, 10)) == [7]
    assert pos.ended(10) and not pos.ended(None)
    assert list(pos.take(4, 10)) == []

"""The superstep aligner as scripted event sequences (like the barrier aligner's): after
each step, the state and the supersteps aligned so far."""

from __future__ import annotations

import pytest

from channels.messages import SuperstepMarker
from runtime.barriers import BarrierProtocolError
from runtime.barriers.superstep import Collecting, SuperstepAligner, WaitingForGo

Step = tuple[str, int, int]  # ("go", superstep, -) or ("marker", channel, superstep)


def run(steps: list[Step], channels: tuple[int, ...] = (1, 2, 3)) -> list[object]:
    aligned: list[tuple[int, float]] = []
    aligner = SuperstepAligner(channels, lambda k, total: aligned.append((k, total)))
    seen: list[object] = []
    for kind, a, b in steps:
        if kind == "go":
            aligner.go(a)
        else:
            aligner.on_marker(a, SuperstepMarker(b, float(a)))
        seen.append((type(aligner.state).__name__, list(aligned)))
    return seen


def test_aligned_once_started_and_a_marker_came_on_every_channel() -> None:
    assert run([("go", 1, 0), ("marker", 1, 1), ("marker", 3, 1), ("marker", 2, 1)]) == [
        ("Collecting", []),
        ("Collecting", []),
        ("Collecting", []),
        ("WaitingForGo", [(1, 6.0)]),  # contributions summed: 1 + 3 + 2
    ]


def test_markers_before_the_heads_own_go_are_counted() -> None:
    """A peer heard Go(k) first and its messages and marker arrived before ours."""
    seen = run([("marker", 2, 4), ("marker", 3, 4), ("go", 4, 0), ("marker", 1, 4)])
    assert seen[-2] == ("Collecting", [])  # own marker (channel 1) still missing
    assert seen[-1] == ("WaitingForGo", [(4, 6.0)])


def test_never_aligned_before_the_head_itself_started() -> None:
    seen = run([("marker", 1, 2), ("marker", 2, 2), ("marker", 3, 2)])
    assert seen[-1] == ("WaitingForGo", [])
    assert run([("marker", 1, 2), ("marker", 2, 2), ("marker", 3, 2), ("go", 2, 0)])[-1] == (
        "WaitingForGo",
        [(2, 6.0)],
    )


def test_supersteps_follow_each_other() -> None:
    steps: list[Step] = [("go", 1, 0), *[("marker", c, 1) for c in (1, 2, 3)]]
    steps += [("go", 2, 0), *[("marker", c, 2) for c in (3, 2, 1)]]
    assert run(steps)[-1] == ("WaitingForGo", [(1, 6.0), (2, 6.0)])


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([("go", 1, 0), ("marker", 1, 1), ("marker", 1, 1)], "second marker"),
        ([("go", 1, 0), ("marker", 1, 2)], "while superstep 1 is collected"),
        ([("go", 1, 0), ("go", 2, 0)], "still collected"),
        ([("go", 1, 0), *[("marker", c, 1) for c in (1, 2, 3)], ("go", 3, 0)], "2 is next"),
        ([("marker", 9, 1)], "not a feedback channel"),
        ([("marker", 1, 1), ("marker", 2, 2)], "while superstep 1 is next"),
    ],
)
def test_events_fifo_channels_cannot_produce_raise(steps: list[Step], message: str) -> None:
    with pytest.raises(BarrierProtocolError, match=message):
        run(steps)


def test_state_objects() -> None:
    assert WaitingForGo(None).go(5) == Collecting(5, frozenset(), 0.0)
    with pytest.raises(BarrierProtocolError, match="at least one feedback channel"):
        SuperstepAligner([], lambda k, t: None)

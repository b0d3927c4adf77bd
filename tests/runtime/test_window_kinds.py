"""Window kinds (runtime/window_kinds.py): which windows a timestamp falls in, checked
against the definition over many timestamps, and the build-time checks naming the step."""

from __future__ import annotations

import random
from typing import Any

import pytest

from runtime.errors import GraphError
from runtime.window_kinds import Session, Sliding, Tumbling, TumblingProcessingTime, WindowKind

TIMESTAMPS = [0, 1, 4.5, 5, 9.999, 10, -3, -10, 10**12 + 7] + [
    random.Random(3).uniform(-1e6, 1e6) for _ in range(200)
]


@pytest.mark.parametrize("kind", [Tumbling(5), Tumbling(10, offset=3), Tumbling(0.25)])
def test_a_tumbling_window_is_the_one_aligned_window_holding_the_timestamp(kind: Tumbling) -> None:
    for ts in TIMESTAMPS:
        ((start, end),) = kind.windows(ts)
        assert start <= ts < end and end - start == kind.size, ts
        aligned = (start - kind.offset) / kind.size
        assert aligned == pytest.approx(round(aligned)), ts


@pytest.mark.parametrize("kind", [Sliding(10, 5), Sliding(10, 2, offset=1), Sliding(6, 6)])
def test_a_sliding_timestamp_is_in_size_over_slide_windows_each_holding_it(
    kind: Sliding,
) -> None:
    for ts in TIMESTAMPS[:9]:
        windows = kind.windows(ts)
        assert len(windows) == kind.size // kind.slide and len(set(windows)) == len(windows), ts
        for start, end in windows:
            assert start <= ts < end and end - start == kind.size, ts
            assert (start - kind.offset) % kind.slide == 0, ts
        # no aligned window holding ts is missing on either side
        starts = [start for start, _ in windows]
        assert min(starts) - kind.slide + kind.size <= ts < max(starts) + kind.slide, ts


def test_tumbling_windows_partition_the_timeline() -> None:
    kind = Tumbling(3, offset=1)
    assert [kind.windows(t)[0] for t in (0.5, 1, 3.9, 4)] == [(-2, 1), (1, 4), (1, 4), (4, 7)]


def test_a_session_window_opens_at_the_record_for_one_gap() -> None:
    assert Session(5).windows(12) == [(12, 17)]
    assert Session(5).merging and not Tumbling(5).merging


def test_processing_time_windows_are_tumbling_by_the_clock() -> None:
    kind = TumblingProcessingTime(60)
    assert kind.windows(1_700_000_123.5) == [(1_700_000_100, 1_700_000_160)]
    assert not kind.event_time and Tumbling(60).event_time


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), True, "5", None])
@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda v: Tumbling(v), "size"),
        (lambda v: Sliding(v, 1), "size"),
        (lambda v: Sliding(10, v), "slide"),
        (lambda v: Session(v), "gap"),
        (lambda v: TumblingProcessingTime(v), "size"),
    ],
)
def test_sizes_gaps_and_slides_must_be_finite_positive_numbers(
    make: Any, what: str, bad: Any
) -> None:
    kind: WindowKind = make(bad)
    with pytest.raises(GraphError, match=rf"step 'w': window {what} must be a number > 0, got"):
        kind.check("w")


def test_a_slide_larger_than_the_size_is_refused_with_the_fix() -> None:
    Sliding(10, 10).check("w")
    with pytest.raises(GraphError, match=r"step 'w': sliding window slide 20 is larger .*Tumbling"):
        Sliding(10, 20).check("w")

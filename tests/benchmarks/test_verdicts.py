"""The rules the benchmarks' claims follow (benchmarks/verdicts.py): each rule with a
case on each side of its boundary."""

from __future__ import annotations

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

from verdicts import (
    MIN_ROUNDS_FOR_CI,
    Difference,
    FloorVerdict,
    Interval,
    IntervalKind,
    TargetVerdict,
    against_floor,
    against_target,
    rate_difference,
    time_difference,
)


def iv(low: float, high: float, median: float | None = None) -> Interval:
    mid = (low + high) / 2 if median is None else median
    return Interval(mid, low, high, IntervalKind.CI95, MIN_ROUNDS_FOR_CI)


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0.01, 0.049, TargetVerdict.WITHIN),  # the whole interval under 5 %
        (0.01, 0.050, TargetVerdict.WITHIN),  # at the target is within it
        (0.01, 0.051, TargetVerdict.UNRESOLVED),  # just over: straddles
        (0.005, 0.126, TargetVerdict.UNRESOLVED),  # issue 41's +0.5 to +12.6 %
        (0.049, 0.09, TargetVerdict.UNRESOLVED),  # the low end just under
        (0.051, 0.09, TargetVerdict.ABOVE),  # the whole interval over 5 %
    ],
)
def test_within_a_target_only_over_the_whole_interval(
    low: float, high: float, expected: TargetVerdict
) -> None:
    assert against_target(iv(low, high), 0.05) is expected


def test_a_median_over_the_target_is_not_above_it_when_the_interval_straddles() -> None:
    # the rule the issue found broken: median +8.5 %, interval +0.5 to +12.6 %
    assert against_target(iv(0.005, 0.126, median=0.085), 0.05) is TargetVerdict.UNRESOLVED


@pytest.mark.parametrize(
    ("low", "high", "neutral", "expected"),
    [
        (0.90, 0.99, 1.0, Difference.FASTER),
        (0.90, 1.00, 1.0, Difference.UNRESOLVED),  # contains no difference
        (0.99, 1.01, 1.0, Difference.UNRESOLVED),
        (1.00, 1.10, 1.0, Difference.UNRESOLVED),
        (1.01, 1.10, 1.0, Difference.SLOWER),
        (-0.02, -0.001, 0.0, Difference.FASTER),  # a time gap against 0
        (-0.001, 0.02, 0.0, Difference.UNRESOLVED),
        (0.001, 0.02, 0.0, Difference.SLOWER),
    ],
)
def test_a_time_difference_only_where_the_interval_excludes_none(
    low: float, high: float, neutral: float, expected: Difference
) -> None:
    assert time_difference(iv(low, high), neutral) is expected


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (1.01, 1.2, Difference.FASTER),  # more records/s
        (0.99, 1.2, Difference.UNRESOLVED),
        (0.8, 0.99, Difference.SLOWER),
    ],
)
def test_a_rate_ratio_over_one_is_faster(low: float, high: float, expected: Difference) -> None:
    assert rate_difference(iv(low, high)) is expected


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (10.0, 11.0, FloorVerdict.MET),  # at the target is met
        (9.99, 11.0, FloorVerdict.UNRESOLVED),
        (9.0, 10.0, FloorVerdict.UNRESOLVED),
        (9.0, 9.99, FloorVerdict.MISSED),
    ],
)
def test_an_at_least_target_is_met_only_over_the_whole_interval(
    low: float, high: float, expected: FloorVerdict
) -> None:
    assert against_floor(iv(low, high), 10.0) is expected


def test_no_values_resolve_nothing() -> None:
    empty = Interval.of([])
    assert empty.rounds == 0 and math.isnan(empty.median)
    assert against_target(empty, 0.05) is TargetVerdict.UNRESOLVED
    assert against_floor(empty, 1.0) is FloorVerdict.UNRESOLVED
    assert time_difference(empty) is Difference.UNRESOLVED


def test_a_median_ci_is_quoted_from_six_rounds_the_iqr_below() -> None:
    five = Interval.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert five.kind is IntervalKind.IQR and (five.low, five.high) == (2.0, 4.0)
    assert "IQR, 5 rounds" in five.fmt()
    six = Interval.of([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert six.kind is IntervalKind.CI95 and (six.low, six.high) == (1.0, 6.0)
    assert "95 % CI of the median, 6 rounds" in six.fmt()


def test_an_interval_shifts_into_an_overhead_in_percent() -> None:
    overhead = Interval(1.03, 1.01, 1.06, IntervalKind.CI95, 8).shifted(-1.0, 100.0)
    assert overhead.fmt(1, " %", signed=True) == (
        "+3.0 % (95 % CI of the median, 8 rounds: +1.0 to +6.0 %)"
    )


def test_one_round_resolves_nothing_two_can() -> None:
    one = Interval.of([1.20])  # far over a 5 % overhead, but a single run
    assert against_target(one.shifted(-1.0), 0.05) is TargetVerdict.UNRESOLVED
    assert time_difference(one) is Difference.UNRESOLVED
    assert against_floor(Interval.of([0.5]), 1.0) is FloorVerdict.UNRESOLVED
    two = Interval.of([1.20, 1.22])
    assert against_target(two.shifted(-1.0), 0.05) is TargetVerdict.ABOVE
    assert time_difference(two) is Difference.SLOWER

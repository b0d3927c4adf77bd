"""The rules a benchmark's claim follows, so the docs say no more than a run showed.

A figure is the median over rounds; the interval a claim rests on is

- the distribution-free 95 % confidence interval of that median (``median_ci``) when
  there are at least ``MIN_ROUNDS_FOR_CI`` rounds (fewer leave no such interval), or
- the interquartile range otherwise, labelled as such (it says how the rounds spread,
  not where the median is).

Against a target (an overhead of at most 5 %, a p99 of at most 250 ms):
``WITHIN`` only if the whole interval is at or under the target, ``ABOVE`` only if the
whole interval is over it, ``UNRESOLVED`` where it straddles the target.

A single round shows no spread, so it resolves nothing (``MIN_ROUNDS_FOR_CLAIM``).

A difference (a time ratio against 1, a time gap against 0): ``FASTER`` / ``SLOWER``
only if the whole interval lies on one side of the neutral value, ``UNRESOLVED`` where
it contains it.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

MIN_ROUNDS_FOR_CI = 6  # the fewest values whose median has a 95 % interval (1 - 2/2**6)
MIN_ROUNDS_FOR_CLAIM = 2  # one run shows no spread: it settles nothing


def median_ci(values: Iterable[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the order statistics
    ``(v[k], v[n-k+1])`` (1-based) with the largest ``k`` for which a Binomial(n, 1/2)
    leaves at most ``(1 - level) / 2`` below ``k``. NaNs when ``values`` are too few
    (fewer than 6 for 95 %)."""
    v = sorted(values)
    n, tail, cdf, k = len(v), (1.0 - level) / 2, 0.0, 0
    while k < n and cdf + math.comb(n, k) / 2**n <= tail:
        cdf += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        return float("nan"), float("nan")
    return v[k - 1], v[n - k]


class IntervalKind(enum.Enum):
    """Which interval a claim quotes; the value is its label in the docs."""

    CI95 = "95 % CI of the median"
    IQR = "IQR"


@dataclass(frozen=True)
class Interval:
    """A median over ``rounds`` values with the interval a claim about it rests on."""

    median: float
    low: float
    high: float
    kind: IntervalKind
    rounds: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Interval:
        """The 95 % CI of the median with at least ``MIN_ROUNDS_FOR_CI`` values, else
        the IQR; NaNs for no values."""
        v = sorted(values)
        if not v:
            nan = float("nan")
            return cls(nan, nan, nan, IntervalKind.IQR, 0)
        if len(v) >= MIN_ROUNDS_FOR_CI:
            low, high = median_ci(v)
            return cls(statistics.median(v), low, high, IntervalKind.CI95, len(v))
        if len(v) == 1:
            return cls(v[0], v[0], v[0], IntervalKind.IQR, 1)
        q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive")
        return cls(statistics.median(v), q1, q3, IntervalKind.IQR, len(v))

    def shifted(self, by: float, scale: float = 1.0) -> Interval:
        """``(x + by) * scale`` of median and bounds (a ratio as an overhead in %)."""
        return Interval(
            (self.median + by) * scale,
            (self.low + by) * scale,
            (self.high + by) * scale,
            self.kind,
            self.rounds,
        )

    def label(self) -> str:
        """E.g. ``95 % CI of the median, 6 rounds``."""
        return f"{self.kind.value}, {self.rounds} round{'s' if self.rounds != 1 else ''}"

    def fmt(self, digits: int = 2, unit: str = "", signed: bool = False) -> str:
        """``median (label low to high unit)``."""
        sign = "+" if signed else ""

        def num(x: float) -> str:
            return f"{x:{sign}.{digits}f}"

        return (
            f"{num(self.median)}{unit} ({self.label()}: {num(self.low)} to {num(self.high)}{unit})"
        )


class TargetVerdict(enum.Enum):
    """How a figure stands against a target it must not exceed."""

    WITHIN = "within"
    ABOVE = "above"
    UNRESOLVED = "unresolved"


def against_target(interval: Interval, target: float) -> TargetVerdict:
    """WITHIN only if the whole interval is at or under ``target``, ABOVE only if it is
    all over it, UNRESOLVED where it straddles ``target`` (or rests on one round)."""
    if interval.rounds < MIN_ROUNDS_FOR_CLAIM:
        return TargetVerdict.UNRESOLVED
    if interval.high <= target:
        return TargetVerdict.WITHIN
    if interval.low > target:
        return TargetVerdict.ABOVE
    return TargetVerdict.UNRESOLVED


class Difference(enum.Enum):
    """How one configuration's time compares with another's."""

    FASTER = "faster"
    SLOWER = "slower"
    UNRESOLVED = "unresolved"


def time_difference(interval: Interval, neutral: float = 1.0) -> Difference:
    """For a time ratio (neutral 1) or a time gap (neutral 0) of A against B: A is
    FASTER only if the whole interval is under ``neutral``, SLOWER only if it is all
    over it, UNRESOLVED where it contains ``neutral``."""
    if interval.rounds < MIN_ROUNDS_FOR_CLAIM:
        return Difference.UNRESOLVED
    if interval.high < neutral:
        return Difference.FASTER
    if interval.low > neutral:
        return Difference.SLOWER
    return Difference.UNRESOLVED


def rate_difference(interval: Interval, neutral: float = 1.0) -> Difference:
    """For a throughput ratio (records/s of A over B): the mirror of ``time_difference``
    (a ratio over ``neutral`` is FASTER)."""
    flipped = time_difference(interval, neutral)
    return {
        Difference.FASTER: Difference.SLOWER,
        Difference.SLOWER: Difference.FASTER,
    }.get(flipped, flipped)


class FloorVerdict(enum.Enum):
    """How a figure stands against a target it must reach (at least 10x, at least 1.0x)."""

    MET = "met"
    MISSED = "missed"
    UNRESOLVED = "unresolved"


def against_floor(interval: Interval, target: float) -> FloorVerdict:
    """MET only if the whole interval is at or over ``target``, MISSED only if it is all
    under it, UNRESOLVED where it straddles ``target`` (or has no values)."""
    if interval.rounds < MIN_ROUNDS_FOR_CLAIM:
        return FloorVerdict.UNRESOLVED
    if interval.low >= target:
        return FloorVerdict.MET
    if interval.high < target:
        return FloorVerdict.MISSED
    return FloorVerdict.UNRESOLVED

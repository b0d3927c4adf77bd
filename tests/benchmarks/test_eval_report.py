"""The statistics the benchmarks' claims rest on (benchmarks/eval_report.py)."""

from __future__ import annotations

import math
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

from eval_report import Spread, median_ci


def test_median_ci_is_the_binomial_order_statistics() -> None:
    # n = 10: P(B <= 1) = 11/1024 <= 2.5 % < P(B <= 2) = 56/1024, so (v[2], v[9]).
    assert median_ci(range(1, 11)) == (2, 9)
    # n = 30: P(B <= 9) = 2.1 % <= 2.5 % < P(B <= 10) = 4.9 %, so (v[10], v[21]).
    assert median_ci(reversed(range(1, 31))) == (10, 21)


def test_median_ci_needs_six_values_at_95_percent() -> None:
    assert all(math.isnan(x) for x in median_ci([1.0, 2.0, 3.0, 4.0, 5.0]))
    low, high = median_ci([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert (low, high) == (1.0, 6.0)  # 1 - 2/64 = 96.9 % coverage


def test_median_ci_covers_the_median_at_least_as_often_as_it_says() -> None:
    rng = random.Random(7)
    trials, hits = 4000, 0
    for _ in range(trials):
        low, high = median_ci(rng.expovariate(1.0) for _ in range(15))
        hits += low <= math.log(2) <= high  # the exponential's true median
    assert 0.95 <= hits / trials <= 0.995


def test_median_ci_lies_inside_the_data_and_around_the_median() -> None:
    values = [1.04, 0.98, 1.10, 1.01, 0.99, 1.03, 1.07, 1.00, 1.02, 1.05, 0.97, 1.06]
    low, high = median_ci(values)
    assert min(values) <= low <= Spread.of(values).median <= high <= max(values)

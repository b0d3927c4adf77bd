"""The evaluation's topology (benchmarks/paper_topology.py) runs and checks itself in
every snapshot mode, with 6p tasks (chaining off) and a hot, slowed key."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

from paper_topology import TASKS_PER_P, build, check

# On the test harness (local task processes); tests marked integration run on local
# Spark (see tests/conftest.py).
pytestmark = [pytest.mark.harness]


def test_six_tasks_per_parallelism() -> None:
    assert len(build(1000, 2).plan().tasks) == 2 * TASKS_PER_P


@pytest.mark.parametrize(
    "config",
    [
        {"snapshot_mode": "exactly_once"},
        {"snapshot_mode": "unaligned"},
        {"aligned_timeout": 0.01},
        {"snapshot_mode": "synchronous"},
    ],
    ids=["exactly_once", "unaligned", "aligned_timeout", "synchronous"],
)
def test_each_mode_gives_the_checked_result(config: dict[str, object]) -> None:
    n = 20_000
    result = build(n, 1, rate=10_000, checkpoint_interval=0.1, **config).run()
    assert check(result, n), result.outputs
    assert result.checkpoints_completed > 0, result.summary()


@pytest.mark.integration  # also on local Spark
def test_the_hot_slow_key_variant_gives_the_checked_result() -> None:
    n = 20_000
    flow = build(n, 2, hot_share=4, slow_key=0, slow_seconds=0.00002, checkpoint_interval=0.1)
    result = flow.run()
    assert check(result, n), result.outputs

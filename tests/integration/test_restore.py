"""run(restore_from=...): continuing a job from a retained checkpoint, also at another
parallelism of its keyed steps, and a clear error when the checkpoint cannot fit."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from runtime import Dataflow, TaskFailedError
from runtime.sources import GeneratorSource

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("no_leaks")]


def counting(
    n: int, count_parallelism: int, source_parallelism: int = 2, **config: Any
) -> Dataflow:
    flow = Dataflow("rescale", parallelism=source_parallelism, **config)
    (
        flow.source(GeneratorSource(lambda i: i % 50, n), name="numbers")
        .key_by(lambda x: x)
        .aggregate(0, lambda c, _x: c + 1, name="count", parallelism=count_parallelism)
        .rebalance()
        .collect("out", parallelism=1)
    )
    return flow


def test_restore_keyed_state_at_another_parallelism(tmp_path: Any) -> None:
    root = str(tmp_path / "chk")
    first = counting(3_000, 2, checkpoint_interval=0.05, checkpoint_dir=root).run()
    assert max(c for _, c in first.output("out")) == 60
    resumed = counting(
        6_000, 3, checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "chk2")
    ).run(restore_from=root)
    new = [(k, c) for k, c in resumed.output("out") if c > 60]
    per_key = collections.defaultdict(list)
    for k, c in new:
        per_key[k].append(c)
    assert sorted(per_key) == list(range(50))
    assert all(sorted(v) == list(range(61, 121)) for v in per_key.values())


def test_restore_with_a_changed_source_parallelism_fails_clearly(tmp_path: Any) -> None:
    root = str(tmp_path / "chk")
    counting(2_000, 2, checkpoint_interval=0.05, checkpoint_dir=root).run()
    with pytest.raises(TaskFailedError) as info:
        counting(2_000, 2, source_parallelism=3, checkpoint_interval=0.05).run(restore_from=root)
    message = str(info.value)
    assert "numbers" in message and "parallelism" in message
    assert "restart" not in message.split(";")[0]  # fatal: no restarts were tried

"""run(restore_from=...): continuing a job from a retained checkpoint, also at another
parallelism of its keyed steps, and a clear error when the checkpoint cannot fit."""

from __future__ import annotations

import collections
import logging
from typing import Any

import pytest

from runtime import Dataflow, IncompatibleCheckpointError
from runtime.sources import GeneratorSource

# On the test harness (local task processes); tests marked integration run on local
# Spark (see tests/conftest.py).
pytestmark = [pytest.mark.harness]


class PerSubtaskSource(GeneratorSource):
    """A source whose positions are not redistributed (as a user's own may be)."""

    rescalable = False


def counting(
    n: int,
    count_parallelism: int,
    source_parallelism: int = 2,
    source: type[GeneratorSource] = GeneratorSource,
    **config: Any,
) -> Dataflow:
    flow = Dataflow("rescale", parallelism=source_parallelism, **config)
    (
        flow.source(source(lambda i: i % 50, n), name="numbers")
        .key_by(lambda x: x)
        .aggregate(0, lambda c, _x: c + 1, name="count", parallelism=count_parallelism)
        .rebalance()
        .collect("out", parallelism=1)
    )
    return flow


@pytest.mark.integration  # also on local Spark
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


def test_a_generator_source_and_the_sink_restore_at_another_parallelism(tmp_path: Any) -> None:
    root = str(tmp_path / "chk")
    counting(3_000, 2, checkpoint_interval=0.05, checkpoint_dir=root).run()
    # Every step at parallelism 3 (the source's positions and the sink's pending
    # transactions are redistributed), records 3000..5999 read exactly once.
    resumed = counting(
        6_000,
        3,
        source_parallelism=3,
        checkpoint_interval=0.05,
        checkpoint_dir=str(tmp_path / "c2"),
    ).run(restore_from=root)
    new = [c for _, c in resumed.output("out") if c > 60]
    assert sorted(new) == sorted(c for c in range(61, 121) for _ in range(50))


def test_restore_with_a_changed_source_parallelism_fails_clearly(tmp_path: Any) -> None:
    root = str(tmp_path / "chk")
    counting(2_000, 2, source=PerSubtaskSource, checkpoint_interval=0.05, checkpoint_dir=root).run()
    second = tmp_path / "chk2"
    # Refused on the driver before any task starts (so no restart is tried).
    with pytest.raises(IncompatibleCheckpointError) as info:
        counting(
            2_000, 2, source_parallelism=3, source=PerSubtaskSource, checkpoint_interval=0.05
        ).run(restore_from=root, checkpoint_dir=str(second))
    message = str(info.value)
    assert "numbers" in message and "parallelism" in message
    assert "restart" not in message.split(";")[0]
    assert not second.exists()


def tallying(n: int, step: str, **config: Any) -> Dataflow:
    """counting() changed: its keyed step named ``step`` and its sink "result" (other step
    identities: the checkpoint's pending "out" output is not committed into it)."""
    flow = Dataflow("rescale", parallelism=2, **config)
    (
        flow.source(GeneratorSource(lambda i: i % 50, n), name="numbers")
        .key_by(lambda x: x)
        .aggregate(0, lambda c, _x: c + 1, name=step, parallelism=2)
        .rebalance()
        .collect("result", parallelism=1)
    )
    return flow


def test_restore_refuses_another_jobs_state_unless_allowed(tmp_path: Any, caplog: Any) -> None:
    root = str(tmp_path / "chk")
    counting(3_000, 2, checkpoint_interval=0.05, checkpoint_dir=root).run()
    with pytest.raises(IncompatibleCheckpointError) as info:
        tallying(6_000, "tally", checkpoint_interval=0.05).run(restore_from=root)
    message = str(info.value)
    assert "state of step 'count' has no step of that name in job 'rescale'" in message
    assert "state of step 'out' has no step of that name" in message
    assert "allow_non_restored_state=True" in message
    with caplog.at_level(logging.WARNING, logger="absflow"):
        result = tallying(6_000, "tally", checkpoint_interval=0.05).run(
            restore_from=root, allow_non_restored_state=True
        )
    assert any("'count'" in r.getMessage() and "dropped" in r.getMessage() for r in caplog.records)
    # The source's offsets are restored (records 3000.. are read), the counts are not:
    # every key counts its 60 new records from 1.
    per_key = collections.defaultdict(list)
    for k, c in result.output("result"):
        per_key[k].append(c)
    assert sorted(per_key) == list(range(50))
    assert all(sorted(v) == list(range(1, 61)) for v in per_key.values())
    # A step of the same name and kind restores its state.
    same = tallying(6_000, "count", checkpoint_interval=0.05).run(
        restore_from=root, allow_non_restored_state=True
    )
    assert sorted(c for _, c in same.output("result")) == sorted(
        c for c in range(61, 121) for _ in range(50)
    )

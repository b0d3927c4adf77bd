"""Loops end to end: cyclic ABS under real SIGKILLs, the back-edge log's part in it,
exact termination, and a multiplying loop under backpressure."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from jobmanager.faults import Kill, RandomKills
from tests.integration.loops import (
    collatz,
    collatz_expected,
    multiplying,
    multiplying_expected,
)

# On the test harness (local task processes); tests marked integration run on local
# Spark (see tests/conftest.py).
pytestmark = [pytest.mark.harness]

CHK = {"checkpoint_interval": 0.1}
N = 3_000
RATE = 2_000  # records/s from the source: the loop is busy for about 1.5 s, kills land inside


def out(result: Any) -> collections.Counter[Any]:
    return collections.Counter(result.output("steps"))


def logged(result: Any) -> int:
    return sum(c.summary.backedge_records for c in result.checkpoints if not c.final)


@pytest.mark.integration  # also on local Spark
def test_collatz_is_exact_and_checkpoints_log_records_in_flight() -> None:
    result = collatz(N, rate=RATE, **CHK).run()
    assert out(result) == collatz_expected(N)
    assert logged(result) > 0, result.checkpoints  # records circulated at the snapshots
    assert result.restarts == []


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault",
    [
        Kill("loop[0]", during="backedge_log", after_checkpoint=2),  # head, log in flight
        Kill("loop[1]", after_checkpoint=3),  # a head between checkpoints
        Kill("again[1]", after_checkpoint=2),  # the body, on the feedback path
        Kill("done[0]", after_seconds=0.6),  # the exit and its sink
    ],
    ids=["head-while-logging", "head", "body", "exit"],
)
def test_a_killed_loop_task_gives_the_failure_free_output(fault: Kill) -> None:
    result = collatz(N, rate=RATE, **CHK).run(faults=[fault])
    assert len(result.restarts) == 1 and result.unfired_faults == [], result.summary()
    assert out(result) == collatz_expected(N)


@pytest.mark.slow
def test_three_kills_in_a_loop() -> None:
    faults = [
        Kill("loop[0]", during="backedge_log", after_checkpoint=2),
        Kill("again[0]", after_checkpoint=1, attempt=1),
        Kill("loop[1]", during="backedge_log", attempt=2),
    ]
    result = collatz(N, rate=RATE, **CHK).run(faults=faults)
    assert len(result.restarts) == 3, result.summary()
    assert out(result) == collatz_expected(N)


@pytest.mark.slow
def test_random_kills_in_a_loop() -> None:
    result = collatz(N, rate=RATE, **CHK).run(faults=[RandomKills(2, seed=11)])
    assert len(result.restarts) == 2, result.summary()
    assert out(result) == collatz_expected(N)


@pytest.mark.slow
def test_the_back_edge_log_matters() -> None:
    """The companion: the same kill, restored without the log, loses records."""
    fault = Kill("loop[0]", during="backedge_log", after_checkpoint=2)
    kept = collatz(N, rate=RATE, **CHK).run(faults=[fault])
    restored = kept.restarts[0].restored_checkpoint
    chk = next(c for c in kept.checkpoints if c.checkpoint_id == restored)
    assert chk.summary.backedge_records > 0, kept.checkpoints
    assert out(kept) == collatz_expected(N)
    dropped = collatz(N, rate=RATE, debug_drop_in_flight_log=True, **CHK).run(faults=[fault])
    assert len(dropped.restarts) == 1
    missing = collatz_expected(N) - out(dropped)
    assert missing, "restoring without the back-edge log should lose the records in flight"


@pytest.mark.slow
def test_at_least_once_on_a_loop_loses_nothing() -> None:
    result = collatz(N, rate=RATE, snapshot_mode="at_least_once", **CHK).run(
        faults=[Kill("loop[0]", during="backedge_log", after_checkpoint=2)]
    )
    assert len(result.restarts) == 1
    assert set(out(result)) == set(collatz_expected(N))  # duplicates allowed, no loss


@pytest.mark.slow
def test_long_circulating_records_terminate_exactly() -> None:
    # 1.8 million passes through the loop, the longest record's 278 steps: records
    # circulate for hundreds of steps across checkpoints (a bigger n circulates no longer
    # per record, only more records: 100,000 took 350 steps at six times the cost)
    n = 20_000
    result = collatz(n, checkpoint_interval=0.5).run()
    assert out(result) == collatz_expected(n)


@pytest.mark.slow
def test_a_multiplying_loop_with_a_slow_sink_does_not_deadlock() -> None:
    n = 200
    result = multiplying(
        n, channel_hwm=1, batch_size=50, spill_threshold=4096, timeout=240, **CHK
    ).run()
    assert collections.Counter(result.output("out")) == multiplying_expected(n)


@pytest.mark.slow
def test_synchronous_snapshots_on_a_loop() -> None:
    """Naiad's synchronous snapshots drain the loop before every snapshot (the sources
    halt until no record is left in flight), so the back-edge logs are empty; a kill in
    the body restores exactly. A drain waits for the longest Collatz chain (~150 hops) to
    leave the loop, so hops flush fast and the sources get a pause between checkpoints."""
    config = {
        "checkpoint_interval": 0.3,
        "min_pause_between_checkpoints": 0.3,
        "buffer_timeout": 0.002,
        "snapshot_mode": "synchronous",
    }
    # After the first completed checkpoint: on a loaded machine a drain can take seconds,
    # and a job of a few seconds may complete only one checkpoint before its final one.
    result = collatz(N, rate=RATE / 2, **config).run(faults=[Kill("again[1]", after_checkpoint=1)])
    assert len(result.restarts) == 1, result.summary()
    assert result.checkpoints_completed >= 2 and logged(result) == 0, result.checkpoints
    assert out(result) == collatz_expected(N)

"""Event time on the test harness (task processes, no Spark: the launcher is not the
point): keyed timers across a real SIGKILL fire exactly once (output
equal to a direct computation, record for record), and the companion: restoring
without the timers and watermarks (``debug_drop_event_time``) loses output."""

from __future__ import annotations

import collections
from typing import Any

import pytest

from jobmanager.faults import Kill
from runtime import Dataflow
from runtime.sources import GeneratorSource
from tests.integration.test_examples import load_example

pytestmark = [pytest.mark.harness, pytest.mark.slow]

N = 12_000
KEYS = 7
BUCKET = 1_000  # event-time buckets counted per key
REPORT_DELAY = 5_000  # a bucket is reported when the watermark passes its end + this
# Keyed state is checkpointed incrementally from its first key here (base, then deltas):
# the kills below restore process, session-window and interval-join state from chains.
CHK: dict[str, Any] = {
    "checkpoint_interval": 0.1,
    "incremental_min_keys": 0,
    "incremental_max_chain": 2,
}


def event(i: int) -> tuple[str, int]:
    """In order per source subtask, out of order by < 50 (below max_delay)."""
    return (f"k{i % KEYS}", i * 10 + (i * 7919) % 50)


def count_bucket(key: Any, record: Any, state: Any, ctx: Any) -> None:
    bucket = record[1] // BUCKET
    counts = state.map("counts")
    if bucket not in counts:
        ctx.register_event_time_timer((bucket + 1) * BUCKET + REPORT_DELAY)
    counts[bucket] = counts.get(bucket, 0) + 1


def report(key: Any, ts: float, state: Any, ctx: Any) -> list[Any]:
    bucket = int(ts - REPORT_DELAY) // BUCKET - 1
    return [(key, bucket, state.map("counts").pop(bucket))]


def bucket_counts(**config: Any) -> Dataflow:
    flow = Dataflow("bucket_counts", parallelism=2, **config)
    (
        flow.source(GeneratorSource(event, N, rate=4_000), name="events")
        .assign_timestamps(lambda e: e[1], max_delay=100, name="timestamps")
        .key_by(lambda e: e[0])
        .process(count_bucket, on_timer=report, name="buckets")
        .collect("out")
    )
    return flow


def expected() -> collections.Counter[Any]:
    c: collections.Counter[tuple[str, int]] = collections.Counter()
    for i in range(N):
        key, ts = event(i)
        c[(key, ts // BUCKET)] += 1
    return collections.Counter((k, b, n) for (k, b), n in c.items())


def test_timers_fire_exactly_once_across_a_kill_of_the_timer_task() -> None:
    result = bucket_counts(**CHK).run(faults=[Kill("buckets[1]", after_checkpoint=2)])
    assert len(result.restarts) == 1, result.summary()
    assert result.restarts[0].restored_checkpoint is not None
    assert collections.Counter(result.output("out")) == expected()


def test_companion_restoring_without_timers_loses_reports() -> None:
    result = bucket_counts(debug_drop_event_time=True, **CHK).run(
        faults=[Kill("buckets[1]", after_checkpoint=2)]
    )
    assert len(result.restarts) == 1, result.summary()
    got = collections.Counter(result.output("out"))
    assert got != expected()
    assert sum(got.values()) < sum(expected().values())  # pending reports were lost


def test_sessions_example_survives_a_kill_of_a_window_task() -> None:
    """examples/sessions.py: a kill of a session-window task gives the failure-free run's
    output record for record (sessions and late clicks), and both match the direct
    sessionization."""
    sessions = load_example("sessions")
    clicks = 24_000
    reference = sessions.build(clicks, 2, 8_000, **CHK).run()
    killed = sessions.build(clicks, 2, 8_000, **CHK).run(
        faults=[Kill("sessions[1]", after_checkpoint=2)]
    )
    assert len(killed.restarts) == 1, killed.summary()
    assert killed.restarts[0].restored_checkpoint is not None
    for name in ("per_session", "late"):
        assert collections.Counter(killed.output(name)) == collections.Counter(
            reference.output(name)
        ), name
    assert sessions.check(clicks, killed.output("per_session"), killed.output("late")) == []


def test_orders_payments_example_survives_a_kill_of_a_join_task() -> None:
    """examples/orders_payments.py: a kill of an interval-join task gives the failure-free
    run's output record for record, equal to the direct computation."""
    example = load_example("orders_payments")
    orders = 12_000
    reference = example.build(orders, 2, 4_000, **CHK).run()
    killed = example.build(orders, 2, 4_000, **CHK).run(
        faults=[Kill("paid[0]", after_checkpoint=2)]
    )
    assert len(killed.restarts) == 1, killed.summary()
    assert killed.restarts[0].restored_checkpoint is not None
    joined = collections.Counter(killed.output("joined"))
    assert joined == collections.Counter(reference.output("joined"))
    assert joined == example.expected(orders)

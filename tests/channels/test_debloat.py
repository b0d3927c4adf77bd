"""BatchSizer: batches sized so that a channel's queue drains within the target."""

from __future__ import annotations

import pytest

from channels.debloat import BatchSizer


def feed(
    sizer: BatchSizer,
    rate: float,
    seconds: float,
    start: float = 0.0,
    backpressured: bool = True,
    waiting: float = 0.5,
) -> float:
    """Send at ``rate`` records/s in the sizer's current batches; returns the end time.
    Backpressured: the receiver drains at ``rate`` and every send waits on the full queue,
    ``waiting`` of the time (the channel's blocked time grows); otherwise the sender
    itself goes at ``rate``."""
    # The channel's blocked time is cumulative and never above the time elapsed: starting
    # each call at ``start`` keeps it growing across calls.
    now, blocked = start, start
    sizer.on_batch(0, now, blocked)
    while now < start + seconds:
        size = sizer.batch_size
        now += size / rate
        if backpressured:
            blocked += waiting * size / rate
        sizer.on_batch(size, now, blocked)
    return now


def test_a_fast_channel_keeps_full_batches() -> None:
    sizer = BatchSizer(max_batch=1000, slots=17, target=0.1)
    feed(sizer, rate=1_000_000, seconds=1.0)
    assert sizer.batch_size == 1000
    assert sizer.throughput == pytest.approx(1_000_000, rel=0.01)


def test_a_slow_channel_queues_at_most_the_target_time() -> None:
    sizer = BatchSizer(max_batch=1000, slots=17, target=0.1)
    feed(sizer, rate=20_000, seconds=2.0)
    # 17 queued batches drain within 0.1 s at 20k records/s: 117 records each
    assert sizer.batch_size == 117
    assert sizer.slots * sizer.batch_size / 20_000 <= 0.1


def test_the_size_follows_the_throughput_both_ways() -> None:
    sizer = BatchSizer(max_batch=1000, slots=9, target=0.1)
    end = feed(sizer, rate=9_000, seconds=2.0)
    assert sizer.batch_size == 100
    feed(sizer, rate=900_000, seconds=2.0, start=end)
    assert sizer.batch_size == 1000


def test_a_slow_sender_that_never_waits_keeps_full_batches() -> None:
    # A throttled source, or a task held up by its own alignment: the receiver keeps up,
    # the queue is short. Sizing from this rate would shrink the batches for nothing,
    # and smaller batches cost more per record: the spiral down to min_batch.
    sizer = BatchSizer(max_batch=1000, slots=17, target=0.1)
    feed(sizer, rate=5_000, seconds=3.0, backpressured=False)
    assert sizer.batch_size == 1000


def test_a_sender_that_waits_only_moments_keeps_full_batches() -> None:
    # A receiver that keeps up but stalls briefly (aligning on a barrier, taking its
    # snapshot) makes the sender wait a moment now and then: the rate is the sender's own.
    # Counting such windows shrank these channels' batches behind every checkpoint.
    sizer = BatchSizer(max_batch=1000, slots=17, target=0.1, min_blocked_share=0.25)
    feed(sizer, rate=20_000, seconds=2.0, waiting=0.2)
    assert sizer.batch_size == 1000
    assert sizer.throughput == 0.0  # never measured
    feed(sizer, rate=20_000, seconds=2.0, start=2.0, waiting=0.3)  # over a quarter: measured
    assert sizer.batch_size == 117


def test_batches_grow_back_when_the_backpressure_ends() -> None:
    sizer = BatchSizer(max_batch=1000, slots=17, target=0.1)
    end = feed(sizer, rate=10_000, seconds=2.0)
    assert sizer.batch_size == 58  # 10k/s x 0.1 s / 17 slots
    feed(sizer, rate=10_000, seconds=0.35, start=end, backpressured=False)
    assert 58 < sizer.batch_size < 1000  # doubling per window, not at once
    feed(sizer, rate=10_000, seconds=2.0, start=end + 0.35, backpressured=False)
    assert sizer.batch_size == 1000


def test_a_dip_does_not_shrink_the_batches_but_a_lasting_slowdown_does() -> None:
    # A receiver aligning on a barrier (or descheduled) drains nothing for a window: that
    # is no measure of its speed. Sizing from it shrank the batches behind every
    # checkpoint; at 0.1 s intervals they never grew back and the job ran 3x slower.
    sizer = BatchSizer(max_batch=1000, slots=9, target=0.05)
    end = feed(sizer, rate=90_000, seconds=1.0)
    assert sizer.batch_size == 500  # 90k/s x 0.05 s / 9 slots
    end = feed(sizer, rate=2_000, seconds=0.15, start=end)  # one slow window
    assert sizer.batch_size == 500
    feed(sizer, rate=9_000, seconds=2.0, start=end)  # slow for longer than memory windows
    assert sizer.batch_size == 50


def test_never_below_the_minimum_and_only_per_window() -> None:
    sizer = BatchSizer(max_batch=1000, slots=17, target=0.1, min_batch=16)
    feed(sizer, rate=10, seconds=5.0)
    assert sizer.batch_size == 16
    fresh = BatchSizer(max_batch=1000, slots=17, target=0.1)
    fresh.on_batch(0, 0.0, 0.0)
    assert fresh.on_batch(5, 0.05, 0.01) == 1000  # the window (0.1 s) has not closed yet


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target": 0.0},
        {"slots": 0},
        {"memory": 0},
        {"min_batch": 0},
        {"min_batch": 2000},
        {"min_blocked_share": 1.0},
        {"min_blocked_share": -0.1},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    settings = {"max_batch": 1000, "slots": 17, "target": 0.1, **kwargs}
    with pytest.raises(ValueError, match="BatchSizer needs"):
        BatchSizer(**settings)  # type: ignore[arg-type]

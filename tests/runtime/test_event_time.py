"""The timestamp assigner (``runtime.event_time``) on its own, with a scripted clock:
watermarks per split, idleness, the timestamp check, and its state across a restore."""

from __future__ import annotations

from typing import Any

import pytest

from channels.messages import Watermark
from runtime.api.dataflow import Dataflow
from runtime.event_time import TimestampAssigner, check_timestamps
from runtime.sources import CollectionSource
from runtime.timestamps import TimestampError


def ts(record: Any) -> Any:
    return record[1]


def assigner(
    idle_timeout: float | None = None, max_delay: float = 2, drop_event_time: bool = False
) -> Any:
    flow = Dataflow("a")
    flow.source(CollectionSource([]), name="src").assign_timestamps(
        ts, max_delay=max_delay, idle_timeout=idle_timeout, name="ts"
    ).collect("out")
    step = next(s for s in flow.plan().steps if s.name == "ts")
    from runtime.operators import build_operator

    return build_operator(step, 0, 128, debug_drop_event_time=drop_event_time)


def test_the_assigner_keeps_a_watermark_per_split_and_goes_idle() -> None:
    op = assigner(idle_timeout=1.0)
    now = [0.0]
    split = ["p0"]
    ended: list[Any] = []
    op.clock, op.split_of = (lambda: now[0]), (lambda: split[0])
    op.ended_splits = lambda: [ended.pop()] if ended else []
    op.process([("a", 10), ("a", 30)])
    assert op.poll() == Watermark(28)
    split[0] = "p1"
    op.process([("a", 12)])  # a slow split holds the watermark back (never backwards)
    assert op.poll() is None
    op.process([("a", 20)])
    split[0] = "p0"
    op.process([("a", 40)])
    assert op.poll() is None  # min(40, 20) - 2 = 18 < 28
    ended.append("p1")  # the slow split ended: it no longer holds the watermark back
    assert op.poll() == Watermark(38)
    now[0] = 5.0  # nothing read for idle_timeout: the subtask is idle
    assert op.poll() == Watermark(38, idle=True)
    assert op.poll() is None  # told once
    op.process([("a", 41)])  # resumes: holds the watermark again
    assert op.poll() == Watermark(39)


def test_a_non_number_timestamp_at_the_source_names_the_step() -> None:
    from runtime.timestamps import TimestampError

    with pytest.raises(TimestampError, match=r"step 'ts': the timestamp function returned '7'"):
        assigner().process([("a", 1), ("a", "7")])


@pytest.mark.parametrize(
    ("batch", "top"),
    [([("a", 3), ("a", 9), ("a", 1)], 9), ([("a", 2), ("a", 2.5)], 2.5), ([("a", -1.0)], -1.0)],
)
def test_a_batchs_largest_timestamp_is_taken_in_one_pass(batch: list[Any], top: float) -> None:
    assert check_timestamps("ts", batch, ts) == top


@pytest.mark.parametrize(
    ("batch", "bad"),
    [
        ([("a", 1), ("b", None)], "None (NoneType) for record ('b', None)"),
        ([("a", "x"), ("b", "y")], "'x' (str) for record ('a', 'x')"),  # comparable, no numbers
        ([("a", 0), ("b", True)], "True (bool) for record ('b', True)"),  # the largest is a bool
    ],
)
def test_a_timestamp_that_is_no_number_names_the_step_and_the_record(
    batch: list[Any], bad: str
) -> None:
    with pytest.raises(TimestampError, match=r"step 'ts': the timestamp function returned "):
        check_timestamps("ts", batch, ts)
    with pytest.raises(TimestampError) as info:
        check_timestamps("ts", batch, ts)
    assert bad in str(info.value)


def test_records_pass_through_unchanged_and_an_empty_batch_moves_nothing() -> None:
    op = assigner()
    assert isinstance(op, TimestampAssigner)
    batch = [("a", 5), ("b", 3)]
    assert op.process(batch) is batch
    assert op.process([]) == []
    assert op.poll() == Watermark(3)  # 5 - max_delay 2


def test_the_watermark_survives_a_restore_as_a_floor() -> None:
    op = assigner()
    op.process([("a", 50)])
    assert op.poll() == Watermark(48)
    state = op.snapshot_state(1)
    restored = assigner()
    restored.restore_state(state)
    assert restored.watermark == 48
    restored.process([("a", 20)])  # replayed, older records: the watermark never goes back
    assert restored.poll() is None
    restored.process([("a", 60)])
    assert restored.poll() == Watermark(58)


def test_the_debug_switch_restores_without_the_watermark() -> None:
    """The companion of the restore test: with event time dropped the restored assigner
    starts over, so replayed records move its watermark again."""
    op = assigner()
    op.process([("a", 50)])
    op.poll()
    dropped = assigner(drop_event_time=True)
    dropped.restore_state(op.snapshot_state(1))
    dropped.process([("a", 20)])
    assert dropped.poll() == Watermark(18)

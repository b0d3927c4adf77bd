"""The one metrics schema (``statebackend.metrics``): round trips, old metadata, unknown
keys, bad values, coercion, shares and the checkpoint summary."""

from __future__ import annotations

import json
import zlib

import pytest

from statebackend.metadata import CheckpointMetadata
from statebackend.metrics import (
    AckMetrics,
    CheckpointSummary,
    TaskMetrics,
    decode,
    encode,
    summarize,
)


def test_records_round_trip_through_encode_and_decode() -> None:
    task = TaskMetrics(records_in=10, bytes_out=99, backpressure_seconds=0.5, watermark=3.0)
    assert decode(TaskMetrics, json.loads(json.dumps(task.encode()))) == task
    ack = AckMetrics(alignment_ms=2.5, channel_state_bytes=7)
    assert decode(AckMetrics, encode(ack)) == ack


def test_missing_fields_take_defaults_and_unknown_keys_are_kept() -> None:
    old = {"sync_ms": 1.5, "savepoint": True}  # an older writer; a key of a newer one
    ack = decode(AckMetrics, old)
    assert ack.sync_ms == 1.5 and ack.alignment_ms == 0.0
    assert ack.extra == {"savepoint": True}
    assert ack.encode()["savepoint"] is True


def test_a_value_of_the_wrong_type_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"TaskMetrics.records_in: 'many' is not a int"):
        decode(TaskMetrics, {"records_in": "many"})


def test_a_writer_with_a_key_the_schema_lacks_fails() -> None:
    # The checkpointer builds AckMetrics(**figures): a misspelt key cannot slip through.
    with pytest.raises(TypeError):
        AckMetrics(**{"alignment_msec": 1.0})  # type: ignore[arg-type]


def test_shares_of_the_uptime() -> None:
    m = TaskMetrics(uptime_seconds=10.0, idle_seconds=2.0, backpressure_seconds=3.0)
    assert m.backpressure_share == pytest.approx(0.3)
    assert m.busy_share == pytest.approx(0.5)
    assert TaskMetrics().busy_share == 0.0


def test_summarize_sums_and_maxes_the_acks() -> None:
    s = summarize(
        {"a": AckMetrics(alignment_ms=1.0, state_bytes=10), "b": AckMetrics(alignment_ms=3.0)},
        "exactly_once",
        12.3456,
    )
    assert (s.tasks, s.max_alignment_ms, s.mean_alignment_ms) == (2, 3.0, 2.0)
    assert (s.state_bytes, s.mode, s.duration_ms) == (10, "exactly_once", 12.346)


def test_metadata_written_before_the_schema_still_reads() -> None:
    # The _metadata of an older absflow: free-form metric maps, some keys missing.
    body = {
        "checkpoint_id": 4,
        "job": "wc",
        "attempt": 0,
        "final": False,
        "trigger_time": 1.0,
        "completed_time": 2.0,
        "duration_ms": 5.0,
        "max_parallelism": 128,
        "tasks": {},
        "task_metrics": {"count[0]": {"start_delay_ms": 0.4, "alignment_ms": 2.0}},
        "metrics": {"tasks": 1, "max_alignment_ms": 2.0, "duration_ms": 5.0},
    }
    crc = zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    meta = CheckpointMetadata.from_json(json.dumps({**body, "crc32": crc}))
    assert meta.task_metrics["count[0]"].alignment_ms == 2.0
    assert meta.metrics == CheckpointSummary(tasks=1, max_alignment_ms=2.0, duration_ms=5.0)


def test_a_checkpoint_splits_into_queueing_alignment_and_write_at_its_last_task() -> None:
    acks = {
        # written last: 300 + 50 + 10 + 40 = 400 ms after the trigger
        "sink[0]": AckMetrics(start_delay_ms=300.0, alignment_ms=50.0, sync_ms=10.0, async_ms=40.0),
        # longest alignment, but done earlier (20 + 200 + 5 + 5 = 230)
        "count[1]": AckMetrics(start_delay_ms=20.0, alignment_ms=200.0, sync_ms=5.0, async_ms=5.0),
        "source[0]": AckMetrics(start_delay_ms=2.0, sync_ms=1.0, async_ms=1.0),
    }
    s = summarize(acks, "exactly_once", 410.0)
    assert (s.critical_task, s.queueing_ms, s.alignment_ms, s.write_ms) == (
        "sink[0]",
        300.0,
        50.0,
        50.0,
    )
    assert s.queueing_ms + s.alignment_ms + s.write_ms <= s.duration_ms
    assert s.max_alignment_ms == 200.0  # the most blocked task is a separate figure


def test_values_of_another_plain_type_are_coerced_and_none_means_the_default() -> None:
    m = decode(
        TaskMetrics,
        {
            "records_in": 7.0,  # a JSON reader's float for an int field
            "uptime_seconds": 3,  # an int for a float field
            "watermark_idle": 1,
            "backpressure_seconds": None,  # a figure with a default: the default
            "watermark": None,  # an optional figure stays None
        },
    )
    assert (m.records_in, type(m.records_in)) == (7, int)
    assert (m.uptime_seconds, type(m.uptime_seconds)) == (3.0, float)
    assert m.watermark_idle is True and m.backpressure_seconds == 0.0 and m.watermark is None
    assert decode(AckMetrics, {"drained_sent": "12"}).drained_sent == 12  # int | None: an int
    assert decode(AckMetrics, None) == AckMetrics()


def test_shares_are_capped_at_the_whole_uptime() -> None:
    m = TaskMetrics(uptime_seconds=2.0, backpressure_seconds=5.0, idle_seconds=1.0)
    assert m.backpressure_share == 1.0 and m.busy_share == 0.0


def test_the_summary_of_no_acks_is_empty_and_full_state_falls_back_to_what_was_written() -> None:
    empty = summarize({}, "at_least_once", 1.0)
    assert (empty.tasks, empty.mean_alignment_ms, empty.critical_task) == (0, 0.0, "")
    s = summarize(
        {
            "a[0]": AckMetrics(state_bytes=10, full_state_bytes=100, keys=3),  # incremental
            "a[1]": AckMetrics(state_bytes=20, keys=4, channel_state_bytes=5),  # a full one
        },
        "unaligned",
        2.0,
    )
    assert (s.state_bytes, s.full_state_bytes, s.keys, s.channel_state_bytes) == (30, 120, 7, 5)

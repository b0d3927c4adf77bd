"""The checkpoint schema: one encode/decode pair per type, round-tripped the way it travels."""

from __future__ import annotations

import dataclasses
import json
import zlib

import pytest

from runtime import control as P
from statebackend import (
    CheckpointMetadata,
    CorruptCheckpointError,
    OperatorLayout,
    StepState,
    TaskStateHandle,
)
from statebackend.metrics import AckMetrics, CheckpointSummary

HANDLE = TaskStateHandle(
    "count[1].state",
    1234,
    0xDEADBEEF,
    {"count": OperatorLayout(1, 2, (64, 128)), "out": OperatorLayout(1, 2)},
)


def metadata() -> CheckpointMetadata:
    return CheckpointMetadata(
        checkpoint_id=3,
        job="wordcount",
        attempt=1,
        final=False,
        trigger_time=1_700_000_000.25,
        completed_time=1_700_000_000.75,
        duration_ms=500.0,
        max_parallelism=128,
        tasks={"count[1]": HANDLE},
        task_metrics={"count[1]": AckMetrics(sync_ms=0.5, keys=10)},
        metrics=CheckpointSummary(tasks=1, state_bytes=1234),
        steps=(StepState("count", "aggregate", 2, True), StepState("out", "sink", 2, False)),
    )


def test_task_state_handle_round_trips_through_an_ack() -> None:
    ack = P.Ack(2, 0, 3, HANDLE, AckMetrics(sync_ms=1.0))
    decoded = P.decode(P.encode(ack))
    assert isinstance(decoded, P.Ack) and decoded.state == HANDLE


def test_metadata_round_trips_through_json() -> None:
    text = metadata().to_json()
    assert CheckpointMetadata.from_json(text) == metadata()
    body = json.loads(text)  # readable JSON, the crc32 beside the body
    assert body["tasks"]["count[1]"]["operators"]["count"]["key_groups"] == [64, 128]
    assert isinstance(body["crc32"], int)


def test_the_text_is_canonical_as_written() -> None:
    # The crc is of one dump of the body: a reader loads and dumps it again to check it,
    # so the two must give the same bytes (str keys, tuples as lists, floats exactly).
    inline = TaskStateHandle("", 3, 7, {"count": OperatorLayout(0, 2, (0, 64))}, inline=b"\x00ab")
    full = dataclasses.replace(
        metadata(),
        tasks={"count[0]": inline, "count[1]": HANDLE},
        task_metrics={"count[0]": AckMetrics(alignment_ms=0.1 + 0.2, watermark=1e300)},
        duration_ms=1 / 3,
        steps=(StepState("count", "aggregate", 2, True, "a/b", redistribute=True),),
        savepoint=True,
    )
    text = full.to_json()
    assert CheckpointMetadata.from_json(text).to_json() == text
    assert CheckpointMetadata.from_json(text) == full


def test_a_changed_byte_fails_the_checksum() -> None:
    text = metadata().to_json().replace("wordcount", "wordcounT")
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        CheckpointMetadata.from_json(text, "chk-3/_metadata")


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"file": "x.state", "size": 1}, "crc32"),
        ({"file": "x.state", "size": 1, "crc32": 2, "operators": {"op": {"subtask": 0}}}, "layout"),
    ],
)
def test_a_malformed_handle_is_named(bad: dict[str, object], expected: str) -> None:
    with pytest.raises(CorruptCheckpointError, match=expected):
        TaskStateHandle.decode(bad)


def test_a_missing_field_is_named() -> None:
    body = json.loads(metadata().to_json())
    del body["crc32"], body["job"]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    text = json.dumps({**body, "crc32": zlib.crc32(canonical)})
    with pytest.raises(CorruptCheckpointError, match="lacks the field 'job'"):
        CheckpointMetadata.from_json(text)

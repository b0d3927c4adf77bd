"""Round trips of every data-plane message, compression, and error messages."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from channels.messages import (
    FLAG_LZ4,
    FLAG_TEXT,
    HEADER,
    KIND_BARRIER,
    KIND_CANCEL,
    KIND_DATA,
    KIND_END_OF_INPUT,
    KIND_SUPERSTEP,
    KIND_WATERMARK,
    TEXT_PREFIX,
    Barrier,
    CancelBarrier,
    EndOfInput,
    Event,
    MalformedFrameError,
    SuperstepMarker,
    Watermark,
    count_records,
    decode_event,
    decode_header,
    decode_records,
    encode_data,
    encode_event,
)


@pytest.mark.parametrize(
    "records",
    [
        [],
        ["a", "b", "c"],
        [None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, float("inf")],
        ["ünïcödé ✓", "日本語", "emoji 🚀", ""],
        [b"\x00\xff raw bytes", b""],
        [("word", 1), ("other", 2)],
        [{"k": 1, "nested": {"x": (1, 2, 3)}}],
        [{("tuple", "key"): 1, (1, 2): "v"}],
        [(("deep", ("er",)), {"a": ((1,),)})],
    ],
    ids=["empty", "str", "scalars", "unicode", "bytes", "tuples", "dicts", "tuple-keys", "nested"],
)
def test_data_round_trip(records: list[Any]) -> None:
    frame = encode_data(7, records)
    assert decode_header(frame) == (7, KIND_DATA)
    decoded = decode_records(frame)
    assert type(decoded) is list
    assert decoded == records


def test_lists_inside_records_arrive_as_tuples() -> None:
    decoded = decode_records(encode_data(0, [["a", 1], {"l": [1, [2]]}]))
    assert decoded == [("a", 1), {"l": (1, (2,))}]
    assert type(decoded[0]) is tuple


def test_decode_accepts_memoryview() -> None:
    frame = encode_data(3, ["x", "y"])
    assert decode_header(memoryview(frame)) == (3, KIND_DATA)
    assert decode_records(memoryview(frame)) == ["x", "y"]


def test_large_batch_is_compressed_and_round_trips() -> None:
    records = [f"word-{i % 100}" for i in range(20_000)]
    frame = encode_data(1, records, compress_min_bytes=1024)
    assert frame[4] == KIND_DATA | FLAG_LZ4 | FLAG_TEXT
    assert decode_header(frame) == (1, KIND_DATA)
    assert len(frame) < len(encode_data(1, records, compress_min_bytes=0)) // 2
    assert decode_records(frame) == records


@pytest.mark.parametrize("threshold", [0, -1, 10**9])
def test_compression_disabled(threshold: int) -> None:
    records = ["x" * 100] * 1000
    frame = encode_data(1, records, compress_min_bytes=threshold)
    assert frame[4] == KIND_DATA | FLAG_TEXT
    assert decode_records(frame) == records


def test_compression_threshold_is_inclusive() -> None:
    records = ["x" * 100] * 10
    size = len(encode_data(0, records, compress_min_bytes=0)) - HEADER.size
    assert encode_data(0, records, compress_min_bytes=size)[4] & FLAG_LZ4
    assert not encode_data(0, records, compress_min_bytes=size + 1)[4] & FLAG_LZ4


@pytest.mark.parametrize(
    "records",
    [
        ["a"],
        [""],
        ["", ""],
        ["a", "", "b", ""],
        ["ünïcödé ✓", "日本語", "emoji 🚀"],
        ["x" * 70_000],
    ],
    ids=["one", "one-empty", "two-empty", "some-empty", "unicode", "long"],
)
def test_a_batch_of_strings_goes_as_text(records: list[str]) -> None:
    frame = encode_data(5, records, compress_min_bytes=0)
    assert frame[4] == KIND_DATA | FLAG_TEXT
    assert decode_header(frame) == (5, KIND_DATA)
    assert decode_records(frame) == records
    assert count_records(frame) == len(records)
    # no larger than msgpack's frame of the same batch by more than the prefix
    assert len(frame) <= len(HEADER.pack(5, 0) + msgpack.packb(records)) + TEXT_PREFIX.size


class Word(str):
    pass


@pytest.mark.parametrize(
    "records",
    [
        ["a\0b", "c"],  # a NUL inside a record: the separator would split it
        ["\0"],
        ["a", 1],  # not all strings
        [1, "a"],
        [b"bytes", "str"],
        [("a", 1)],
    ],
    ids=["nul", "only-nul", "str-int", "int-str", "bytes", "tuple"],
)
def test_other_batches_go_as_msgpack(records: list[Any]) -> None:
    frame = encode_data(1, records, compress_min_bytes=0)
    assert frame[4] == KIND_DATA
    assert decode_records(frame) == [tuple(r) if type(r) is tuple else r for r in records]
    assert count_records(frame) == len(records)


def test_str_subclasses_arrive_as_str_as_with_msgpack() -> None:
    decoded = decode_records(encode_data(0, [Word("a"), "b"]))
    assert decoded == ["a", "b"] and type(decoded[0]) is str


def test_text_frames_that_do_not_add_up_are_malformed() -> None:
    frame = encode_data(0, ["abc", "def"], compress_min_bytes=0)
    body = frame[HEADER.size + TEXT_PREFIX.size :]
    for bad in (
        frame[:-1],  # truncated inside the last record
        frame + b"\0x",  # one more record than the prefix says
        HEADER.pack(0, KIND_DATA | FLAG_TEXT) + TEXT_PREFIX.pack(3, len(body)) + body,
        HEADER.pack(0, KIND_DATA | FLAG_TEXT) + TEXT_PREFIX.pack(2, 2) + b"\xff\xfe",
        HEADER.pack(0, KIND_DATA | FLAG_TEXT) + b"\x01",
    ):
        with pytest.raises(MalformedFrameError, match="does not decode"):
            decode_records(bad)
        with pytest.raises(MalformedFrameError, match="does not decode"):
            count_records(bad)


def test_channel_id_range() -> None:
    frame = encode_data(2**32 - 1, ["a"])
    assert decode_header(frame) == (2**32 - 1, KIND_DATA)


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        (Barrier(1, 1234.5), KIND_BARRIER),
        (Barrier(2**40, 0.0, final=True), KIND_BARRIER),
        (Barrier(5, 1.0, final=True, savepoint=True), KIND_BARRIER),
        (EndOfInput(), KIND_END_OF_INPUT),
        (CancelBarrier(17), KIND_CANCEL),
        (Watermark(1_700_000_000_123), KIND_WATERMARK),
        (Watermark(12.5, idle=True), KIND_WATERMARK),
        (Watermark(float("inf")), KIND_WATERMARK),
        (Watermark(float("-inf"), idle=True), KIND_WATERMARK),
        (SuperstepMarker(7, 0.25), KIND_SUPERSTEP),
        (SuperstepMarker(1), KIND_SUPERSTEP),
    ],
)
def test_event_round_trip(event: Event, kind: int) -> None:
    frame = encode_event(9, event)
    assert decode_header(frame) == (9, kind)
    decoded = decode_event(frame)
    assert decoded == event
    assert type(decoded.final if isinstance(decoded, Barrier) else True) is bool
    assert type(decoded.idle if isinstance(decoded, Watermark) else True) is bool


def test_decode_records_rejects_event_frame() -> None:
    with pytest.raises(MalformedFrameError, match="not a data frame"):
        decode_records(encode_event(0, EndOfInput()))


def test_decode_event_rejects_data_frame() -> None:
    with pytest.raises(MalformedFrameError, match="not a control event"):
        decode_event(encode_data(0, ["a"]))


def test_truncated_frames_are_malformed() -> None:
    with pytest.raises(MalformedFrameError, match="shorter than the header"):
        decode_records(b"\x00\x00")
    with pytest.raises(MalformedFrameError, match="does not decode"):
        decode_records(encode_data(0, ["abc", "def"])[:-2])
    with pytest.raises(MalformedFrameError, match="does not decode"):
        decode_records(HEADER.pack(0, KIND_DATA | FLAG_LZ4) + b"\xff\xff\xff\x7fjunk")


@pytest.mark.parametrize("n", [0, 1, 15, 16, 70_000])
@pytest.mark.parametrize("compress_min_bytes", [0, 1])
def test_count_records_reads_the_array_header(n: int, compress_min_bytes: int) -> None:
    frame = encode_data(2, list(range(n)), compress_min_bytes)
    assert count_records(frame) == n == len(decode_records(frame))


def test_count_records_refuses_events_and_garbage() -> None:
    with pytest.raises(MalformedFrameError):
        count_records(encode_event(1, EndOfInput()))
    with pytest.raises(MalformedFrameError):
        count_records(b"\x01\x00\x00\x00\x00\xc1")

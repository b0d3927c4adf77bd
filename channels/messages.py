"""Data-plane wire format: record batches and in-band control events.

Every message is exactly one ZeroMQ frame::

    +----------------+-----------+----------------------------+
    | channel id u32 | kind byte | payload                    |
    +----------------+-----------+----------------------------+
      little endian    low 4 bits: KIND_*, bit 4: FLAG_LZ4, bit 5: FLAG_TEXT

* ``KIND_DATA``: payload is a msgpack array of records; with ``FLAG_TEXT`` (a batch
  of strings none of which holds a NUL) ``TEXT_PREFIX`` (u32 record count, u32 text
  bytes) and the strings joined by NUL, UTF-8: no per-record type tag to write or
  dispatch on, and the receiver splits the batch in one call. Either is lz4-block
  compressed (with the uncompressed size stored in front) when ``FLAG_LZ4`` is set.
* ``KIND_BARRIER``: payload is msgpack ``[checkpoint_id, timestamp, final]``.
* ``KIND_END_OF_INPUT``: empty payload.
* ``KIND_CANCEL``: payload is msgpack ``checkpoint_id``.
* ``KIND_WATERMARK``: payload is msgpack ``[timestamp, idle]``: no record with a
  timestamp <= ``timestamp`` follows on this channel (unless late); ``idle`` says the
  sender holds no watermark back until it sends a watermark with ``idle`` false.
* ``KIND_SUPERSTEP``: payload is msgpack ``[superstep, contribution]``: the sender has
  sent everything of that superstep of an iteration (``runtime.iterations``) on this
  channel; ``contribution`` is its share of the superstep's in-band global sum.

Records crossing tasks must be msgpack types (None, bool, int, float, str,
bytes, list/tuple, dict). The decoder uses ``use_list=False``: every sequence
inside a record arrives as a **tuple** (so tuple keys in dicts survive, and
records are hashable where their parts are); the outer batch is a ``list``.

Threading: all functions are pure and safe to call from any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import lz4.block
import msgpack

from channels.errors import AbsflowError, RecordSerializationError

HEADER: Final = struct.Struct("<IB")
"""(channel id u32, kind byte): the 5 bytes in front of every payload."""

KIND_DATA: Final = 0
KIND_BARRIER: Final = 1
KIND_END_OF_INPUT: Final = 2
KIND_CANCEL: Final = 3
KIND_WATERMARK: Final = 4
KIND_SUPERSTEP: Final = 5

KIND_MASK: Final = 0x0F
FLAG_LZ4: Final = 0x10
FLAG_TEXT: Final = 0x20
TEXT_PREFIX: Final = struct.Struct("<II")
"""In front of a text batch: (records, bytes of the NUL-joined UTF-8 text that follows)."""
_NUL: Final = "\0"
_text_prefix_pack = TEXT_PREFIX.pack
_text_prefix_unpack_from = TEXT_PREFIX.unpack_from
_TEXT_PREFIX_SIZE: Final = TEXT_PREFIX.size

_HEADER_SIZE: Final = HEADER.size
_header_pack = HEADER.pack
_header_unpack_from = HEADER.unpack_from
_packb: Callable[..., bytes] = msgpack.packb
_unpackb: Callable[..., Any] = msgpack.unpackb
_lz4_compress: Callable[..., bytes] = lz4.block.compress
_lz4_decompress: Callable[..., bytes] = lz4.block.decompress


class MalformedFrameError(AbsflowError, ValueError):
    """A frame is too short, has an unknown kind, or a payload that does not decode."""


@dataclass(frozen=True, slots=True)
class Barrier:
    """Checkpoint barrier; ``final`` marks the last checkpoint before shutdown, and
    ``savepoint`` one kept as a savepoint (the tasks write it self-contained: whole)."""

    checkpoint_id: int
    timestamp: float
    final: bool = False
    savepoint: bool = False


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The sender will send nothing more on this channel."""


@dataclass(frozen=True, slots=True)
class CancelBarrier:
    """Checkpoint ``checkpoint_id`` was aborted upstream; stop aligning for it."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class Watermark:
    """Event time on this channel has reached ``timestamp`` (a number of the job's event
    time unit; ``float('inf')`` once the channel's input has ended). ``idle``: the sender
    is idle and stops holding back its receivers' watermark until its next non-idle one."""

    timestamp: float
    idle: bool = False


@dataclass(frozen=True, slots=True)
class SuperstepMarker:
    """The sender has sent everything of ``superstep`` of an iteration on this channel
    (FIFO: every message of that superstep is ahead of it); ``contribution`` is the
    sender's share of the superstep's in-band global sum (PageRank: dangling rank)."""

    superstep: int
    contribution: float = 0.0


Event = Barrier | EndOfInput | CancelBarrier | Watermark | SuperstepMarker


def encode_data(channel: int, records: list[Any], compress_min_bytes: int = 65536) -> bytes:
    """Encode a batch of records as one data frame.

    A batch of strings (``str`` or a subclass; they arrive as ``str``, as msgpack's would)
    none of which holds a NUL is sent as text (``FLAG_TEXT``), any other as msgpack. The
    payload is lz4-compressed when it is at least ``compress_min_bytes`` long; 0 or a
    negative value disables compression.

    Raises:
        RecordSerializationError: a record is not a msgpack type; the message
            names its position and type.
    """
    kind = KIND_DATA
    payload: bytes | None = None
    try:  # str.join type-checks in C and stops at the first record that is not a str
        text = _NUL.join(records)
    except TypeError:
        pass
    else:
        # As many NULs as separators: no record holds one (nor is the batch empty).
        if text.count(_NUL) == len(records) - 1:
            try:
                body = text.encode()
                payload = _text_prefix_pack(len(records), len(body)) + body
                kind = KIND_DATA | FLAG_TEXT
            except UnicodeEncodeError:  # a lone surrogate: msgpack names the record
                pass
    if payload is None:
        try:
            payload = _packb(records, use_bin_type=True)
        except (TypeError, OverflowError, ValueError) as err:
            raise RecordSerializationError.of_batch(records, err) from err
    if 0 < compress_min_bytes <= len(payload):
        return _header_pack(channel, kind | FLAG_LZ4) + _lz4_compress(payload, store_size=True)
    return _header_pack(channel, kind) + payload


def encode_event(channel: int, event: Event) -> bytes:
    """Encode a control event as one frame."""
    if isinstance(event, Barrier):
        body = (event.checkpoint_id, event.timestamp, event.final, event.savepoint)
        return _header_pack(channel, KIND_BARRIER) + _packb(body, use_bin_type=True)
    if isinstance(event, EndOfInput):
        return _header_pack(channel, KIND_END_OF_INPUT)
    if isinstance(event, CancelBarrier):
        return _header_pack(channel, KIND_CANCEL) + _packb(event.checkpoint_id)
    if isinstance(event, Watermark):
        mark = (event.timestamp, event.idle)
        return _header_pack(channel, KIND_WATERMARK) + _packb(mark, use_bin_type=True)
    if isinstance(event, SuperstepMarker):
        return encode_superstep(channel, event.superstep, event.contribution)
    raise TypeError(f"not a data-plane event: {event!r}")


NO_CHANNEL: Final = -1
"""The channel `header_of` gives a frame too short for a header (no task reads it)."""


def header_of(frame: bytes | memoryview) -> tuple[int, int]:
    """``(channel id, kind byte)`` of a frame as it arrived from a gate, flags included;
    ``(NO_CHANNEL, 0)`` for one shorter than the header (garbage: the input side drops it)."""
    try:
        return _header_unpack_from(frame)
    except struct.error:
        return NO_CHANNEL, 0


def decode_header(frame: bytes | memoryview) -> tuple[int, int]:
    """Return ``(channel id, kind)`` of a frame; the kind is without flags."""
    channel, kind = _header_unpack_from(frame)
    return channel, kind & KIND_MASK


def decode_records(frame: bytes | memoryview) -> list[Any]:
    """Decode a data frame into its batch of records.

    Returns a fresh ``list`` owned by the caller. Sequences inside records are
    tuples (msgpack has one array type), dict keys may be tuples.

    Raises:
        MalformedFrameError: the frame is not a data frame or does not decode.
    """
    if len(frame) < _HEADER_SIZE:
        raise MalformedFrameError(f"frame of {len(frame)} bytes is shorter than the header")
    kind = frame[4]
    if kind & KIND_MASK != KIND_DATA:
        raise MalformedFrameError(f"frame kind byte {kind:#04x} is not a data frame")
    view = memoryview(frame)[_HEADER_SIZE:]
    try:
        payload = _lz4_decompress(view) if kind & FLAG_LZ4 else view
        if kind & FLAG_TEXT:
            return _decode_text(payload)
        records = _unpackb(payload, use_list=False, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, lz4.block.LZ4BlockError) as err:
        raise MalformedFrameError(
            f"data frame of {len(frame)} bytes does not decode: {err}"
        ) from err
    return list(records)


def _decode_text(payload: bytes | memoryview) -> list[str]:
    """The records of a text batch's payload (prefix and text).

    Raises:
        ValueError: the payload is shorter or longer than its prefix says, holds other
            than that many records, or is not UTF-8.
    """
    if len(payload) < _TEXT_PREFIX_SIZE:
        raise ValueError(f"a text batch of {len(payload)} bytes has no prefix")
    count, size = _text_prefix_unpack_from(payload)
    if len(payload) - _TEXT_PREFIX_SIZE != size:
        raise ValueError(
            f"a text batch of {size} bytes came with {len(payload) - _TEXT_PREFIX_SIZE}"
        )
    records = str(memoryview(payload)[_TEXT_PREFIX_SIZE:], "utf-8").split(_NUL)
    if len(records) != count:
        raise ValueError(f"a text batch of {count} records holds {len(records)}")
    return records


def count_records(frame: bytes | memoryview) -> int:
    """How many records a data frame holds: from its msgpack array header (the records
    themselves are not decoded), or for a text batch by splitting it (which checks the
    count its prefix states).

    Raises:
        MalformedFrameError: the frame is not a data frame or does not decode.
    """
    if len(frame) < _HEADER_SIZE or frame[4] & KIND_MASK != KIND_DATA:
        raise MalformedFrameError(f"frame of {len(frame)} bytes is not a data frame")
    view = memoryview(frame)[_HEADER_SIZE:]
    try:
        payload = _lz4_decompress(view) if frame[4] & FLAG_LZ4 else view
        if frame[4] & FLAG_TEXT:
            return len(_decode_text(payload))
        unpacker = msgpack.Unpacker()
        unpacker.feed(payload)
        count: int = unpacker.read_array_header()
    except (ValueError, msgpack.UnpackException, lz4.block.LZ4BlockError) as err:
        raise MalformedFrameError(
            f"data frame of {len(frame)} bytes does not decode: {err}"
        ) from err
    return count


def decode_event(frame: bytes | memoryview) -> Event:
    """Decode a control frame (barrier, end-of-input, cancel, watermark or superstep marker).

    Raises:
        MalformedFrameError: the frame is a data frame, has an unknown kind, or its body
        does not decode to the event's fields (garbage: events are rare, so checked).
    """
    if len(frame) < _HEADER_SIZE:
        raise MalformedFrameError(f"frame of {len(frame)} bytes is shorter than the header")
    kind = frame[4] & KIND_MASK
    view = memoryview(frame)[_HEADER_SIZE:]
    try:
        event = _decode_event_body(kind, view)
    except (ValueError, TypeError, msgpack.UnpackException) as err:
        raise MalformedFrameError(f"event frame of kind {kind} does not decode: {err}") from err
    if event is None:
        raise MalformedFrameError(f"frame kind {kind} is not a control event")
    return event


def _decode_event_body(kind: int, view: memoryview) -> Event | None:
    if kind == KIND_BARRIER:
        checkpoint_id, timestamp, final, savepoint = _unpackb(view, use_list=False)
        _check_types(checkpoint_id, int, timestamp, (int, float), final, bool, savepoint, bool)
        return Barrier(checkpoint_id, timestamp, final, savepoint)
    if kind == KIND_END_OF_INPUT:
        return EndOfInput()
    if kind == KIND_CANCEL:
        checkpoint_id = _unpackb(view)
        _check_types(checkpoint_id, int)
        return CancelBarrier(checkpoint_id)
    if kind == KIND_WATERMARK:
        timestamp, idle = _unpackb(view, use_list=False)
        _check_types(timestamp, (int, float), idle, bool)
        return Watermark(timestamp, idle)
    if kind == KIND_SUPERSTEP:
        superstep, contribution = _unpackb(view, use_list=False)
        _check_types(superstep, int, contribution, (int, float))
        return SuperstepMarker(superstep, float(contribution))
    return None


def _check_types(*pairs: Any) -> None:
    """``value, type, value, type, ...``: TypeError for a value of another type."""
    for value, kind in zip(pairs[::2], pairs[1::2], strict=True):
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"{value!r} is not {kind}")


def encode_superstep(channel: int, superstep: int, contribution: float) -> bytes:
    """The marker that closes ``superstep`` of an iteration on one channel."""
    return _header_pack(channel, KIND_SUPERSTEP) + _packb((superstep, contribution))


def decode_superstep(frame: bytes | memoryview) -> tuple[int, float]:
    """``(superstep, contribution)`` of a superstep marker.

    Raises:
        MalformedFrameError: the frame is not a superstep marker.
    """
    if len(frame) < _HEADER_SIZE or frame[4] & KIND_MASK != KIND_SUPERSTEP:
        raise MalformedFrameError(f"frame of {len(frame)} bytes is not a superstep marker")
    superstep, contribution = _unpackb(memoryview(frame)[_HEADER_SIZE:], use_list=False)
    return int(superstep), float(contribution)

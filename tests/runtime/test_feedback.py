"""The feedback side of a loop head (runtime/feedback.py): every frame waiting on the
feedback gate is drained without blocking, and delivered in arrival order within a
budget, also after the queue spilled to disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from channels.messages import (
    KIND_BARRIER,
    KIND_DATA,
    Barrier,
    decode_records,
    encode_data,
    encode_event,
)
from runtime.feedback import FeedbackQueue


class FakeGate:
    """A feedback gate holding ``frames``; hands out at most ``max_frames`` per call."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames
        self.calls = 0

    @property
    def endpoint(self) -> str:
        return "fake://feedback"

    def recv_frames(self, max_frames: int) -> list[bytes]:
        self.calls += 1
        out, self.frames = self.frames[:max_frames], self.frames[max_frames:]
        return out


def queue_of(
    frames: list[bytes], tmp_path: Path, threshold: int = 1 << 20
) -> tuple[FeedbackQueue, FakeGate, list[tuple[int, int, Any]]]:
    got: list[tuple[int, int, Any]] = []

    def dispatch(channel: int, kind: int, frame: bytes | memoryview) -> None:
        body = decode_records(frame) if kind == KIND_DATA else "event"
        got.append((channel, kind, body))

    gate = FakeGate(frames)
    return FeedbackQueue(gate, dispatch, lambda: str(tmp_path), threshold), gate, got


def test_drain_takes_every_waiting_frame_and_process_keeps_arrival_order(tmp_path: Path) -> None:
    frames = [encode_data(8 + i % 2, [i]) for i in range(600)]
    queue, gate, got = queue_of(frames, tmp_path)
    assert queue.drain() == 600 and len(queue) == 600
    assert gate.frames == [] and gate.calls == 4  # 256 + 256 + 88, then an empty read
    assert queue.drain() == 0
    assert queue.process(budget=100) == 100 and len(queue) == 500
    while queue.process():
        pass
    assert [body for _, _, body in got] == [[i] for i in range(600)]
    assert [channel for channel, _, _ in got] == [8 + i % 2 for i in range(600)]
    queue.close()


def test_events_are_delivered_with_their_kind_behind_the_records(tmp_path: Path) -> None:
    frames = [encode_data(9, ["a"]), encode_event(9, Barrier(3, 1.0)), encode_data(9, ["b"])]
    queue, _, got = queue_of(frames, tmp_path)
    queue.drain()
    assert queue.process() == 3
    assert got == [(9, KIND_DATA, ["a"]), (9, KIND_BARRIER, "event"), (9, KIND_DATA, ["b"])]
    queue.close()


def test_past_the_threshold_frames_spill_and_come_back_in_order(tmp_path: Path) -> None:
    frames = [encode_data(8, [i, "x" * 50]) for i in range(200)]
    queue, _, got = queue_of(frames, tmp_path, threshold=1_000)
    queue.drain()
    assert queue.spilled_bytes > 0 and any(tmp_path.iterdir())
    queue.process(budget=150)
    queue.drain()  # nothing new: a second drain changes nothing
    queue.process(budget=150)
    assert [body[0] for _, _, body in got] == list(range(200))
    queue.close()
    assert not any(tmp_path.iterdir())

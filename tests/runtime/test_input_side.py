"""A task's input side (runtime/input_side.py): which side of a step each input channel
feeds, the typed elements it decodes in channel order, and the frames it drops."""

from __future__ import annotations

from typing import Any

from channels.messages import Barrier, EndOfInput, SuperstepMarker, Watermark, header_of
from runtime.input_side import InputSide, input_sides
from tests.runtime.test_event_time_task import merge_plan
from tests.runtime.test_task import data, event


def test_input_sides_follow_the_logical_edges() -> None:
    plan = merge_plan()
    spec = next(t for t in plan.tasks if t.task_id == "merge[0]")
    assert input_sides(plan, spec) == {spec.inputs[0]: 0, spec.inputs[1]: 1}


class Recorder:
    def __init__(self) -> None:
        self.got: list[Any] = []

    def on_batch(self, channel: int, side: int, batch: list[Any], frame: bytes) -> None:
        self.got.append(("batch", channel, side, batch))

    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        self.got.append(("barrier", channel, barrier.checkpoint_id))

    def on_cancel(self, channel: int, cancel: Any) -> None:
        self.got.append(("cancel", channel))

    def on_end_of_input(self, channel: int) -> None:
        self.got.append(("end", channel))

    def on_watermark(self, watermark: float) -> None:
        self.got.append(("watermark", watermark))

    def on_idle(self) -> None:
        self.got.append(("idle",))

    def on_superstep(self, channel: int, marker: SuperstepMarker) -> None:
        self.got.append(("superstep", channel, marker.superstep, marker.contribution))


def test_the_input_side_hands_typed_elements_in_channel_order() -> None:
    target = Recorder()
    side = InputSide(target, {3: 0, 4: 1}, [3, 4])
    for frame in [
        data(4, "x"),
        event(3, Watermark(10)),
        event(4, Barrier(7, 0.0)),
        event(4, Watermark(20)),
        event(4, SuperstepMarker(2, 0.5)),
        event(3, EndOfInput()),
    ]:
        side.dispatch(frame[0], frame[4] & 0x0F, frame)
    assert target.got == [
        ("batch", 4, 1, ["x"]),
        ("barrier", 4, 7),
        ("watermark", 10),
        ("superstep", 4, 2, 0.5),
        ("watermark", 20),  # channel 3 ended: channel 4 alone
        ("end", 3),
    ]


def test_the_input_side_drops_and_counts_frames_that_are_not_the_jobs() -> None:
    """Garbage (a stranger's, without secure_channels) never raises through the task loop:
    a channel the task does not read, a payload that does not decode, a frame too short
    for a header (``header_of`` gives it NO_CHANNEL)."""
    target = Recorder()
    side = InputSide(target, {3: 0}, [3])
    good = data(3, "x")
    garbage = [
        data(9, "y"),  # well-formed, but not an input channel of this task
        good[:5] + b"\xc1\xc1",  # a data header, then bytes msgpack never writes
        event(3, Barrier(7, 0.0))[:6],  # a barrier cut short
        b"\x01",
    ]
    for frame in garbage:
        channel, kind = header_of(frame)
        side.dispatch(channel, kind & 0x0F, frame)
    side.dispatch(3, 0, good)
    assert side.malformed_frames == len(garbage)
    assert target.got == [("batch", 3, 0, ["x"])]

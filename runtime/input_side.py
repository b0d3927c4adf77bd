"""The input side of a task: decodes each delivered frame once into a typed element.

Frames reach a task through its gate, the blocked-channel buffers (``runtime.inputs``),
the feedback queue of a loop head (``runtime.feedback``), the unaligned-checkpoint queue
(``runtime.overtaking``) or the replay of a restored in-flight log; each of those routes
frames by their header only and hands them here, in channel FIFO order, via
:meth:`InputSide.dispatch`. This is the one place that decodes payloads and turns them
into what the task acts on:

* a **data batch** with its **side** (which logical input edge of the task's head step
  the channel belongs to: a join's left or right input, a union's n-th input);
* a **barrier**, a **cancel** marker, an **end of input** (per channel);
* a **superstep marker** of an iteration (``runtime.superstep``);
* a **watermark**: folded into the task's input watermark (`WatermarkValve`); the task
  hears of it only when that advances (or when every live input went idle).

Per batch, never per record: one decode, one dict lookup for the side.
A frame that is not the job's (a channel the task does not read, a payload that does not
decode: garbage from a stranger's socket, possible without secure_channels) is dropped
here, counted (``malformed_frames``) and logged (the 1st, 2nd, 4th, 8th, ...): it never
ends the task, which a restart would not fix while the stranger keeps sending.
Threading: task-loop thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from channels.messages import (
    KIND_BARRIER,
    KIND_CANCEL,
    KIND_DATA,
    KIND_END_OF_INPUT,
    KIND_SUPERSTEP,
    KIND_WATERMARK,
    Barrier,
    CancelBarrier,
    MalformedFrameError,
    SuperstepMarker,
    Watermark,
    decode_event,
    decode_records,
)
from runtime.plan import JobPlan, TaskSpec
from runtime.watermarks import WatermarkValve

log = logging.getLogger("absflow.task")


class InputElements(Protocol):
    """What a task does with the typed elements of its input side."""

    def on_batch(self, channel: int, side: int, batch: list[Any], frame: bytes) -> None: ...

    def on_barrier(self, channel: int, barrier: Barrier) -> None: ...

    def on_cancel(self, channel: int, cancel: CancelBarrier) -> None: ...

    def on_end_of_input(self, channel: int) -> None: ...

    def on_superstep(self, channel: int, marker: SuperstepMarker) -> None:
        """The marker of an iteration's superstep came on ``channel`` (`runtime.superstep`)."""

    def on_watermark(self, watermark: float) -> None:
        """The task's input watermark advanced to ``watermark``."""

    def on_idle(self) -> None:
        """Every live input channel is idle: downstream should not wait for this task."""


def input_sides(plan: JobPlan, spec: TaskSpec) -> dict[int, int]:
    """Channel id -> index of its logical edge among the head step's inputs.

    Two edges from the same step into one head step (``s.union(s)``) share the first
    index: their records are indistinguishable anyway.
    """
    head = plan.chain_steps(spec)[0]
    sources = [edge.source for edge in head.inputs]
    sides: dict[int, int] = {}
    for channel in spec.inputs:
        source_step = plan.channels[channel].source_step
        sides[channel] = sources.index(source_step) if source_step in sources else 0
    return sides


class InputSide:
    """Decodes frames and delivers typed elements to ``target``; owns the input watermark."""

    def __init__(
        self, target: InputElements, sides: Mapping[int, int], watermark_channels: list[int]
    ) -> None:
        self._target = target
        self._sides = dict(sides)
        self.valve = WatermarkValve(watermark_channels)
        self._idle_told = False
        self.malformed_frames = 0

    @property
    def watermark(self) -> float:
        """The task's current input watermark."""
        return self.valve.current

    def side_of(self, channel: int) -> int:
        return self._sides.get(channel, 0)

    def dispatch(self, channel: int, kind: int, frame: bytes) -> None:
        """Deliver one frame (``kind`` without flags) of an unblocked channel."""
        target = self._target
        side = self._sides.get(channel)
        try:
            if side is None:
                raise MalformedFrameError(f"channel {channel} is not an input of this task")
            if kind == KIND_DATA:
                batch = decode_records(frame)
            else:
                event = decode_event(frame)
        except MalformedFrameError as err:
            self._drop(channel, err)
            return
        if kind == KIND_DATA:
            target.on_batch(channel, side, batch, frame)
            return
        if kind == KIND_BARRIER:
            assert isinstance(event, Barrier)
            target.on_barrier(channel, event)
        elif kind == KIND_CANCEL:
            assert isinstance(event, CancelBarrier)
            target.on_cancel(channel, event)
        elif kind == KIND_END_OF_INPUT:
            advanced = self.valve.on_end_of_input(channel)
            if advanced is not None:  # before the end of input goes on downstream
                target.on_watermark(advanced)
            target.on_end_of_input(channel)
        elif kind == KIND_WATERMARK:
            assert isinstance(event, Watermark)
            self._on_watermark(channel, event)
        elif kind == KIND_SUPERSTEP:
            assert isinstance(event, SuperstepMarker)
            target.on_superstep(channel, event)
        else:  # decode_event raised already; kept for a new kind added without a branch
            raise MalformedFrameError(f"frame kind {kind} has no input-side element")

    def _drop(self, channel: int, err: MalformedFrameError) -> None:
        self.malformed_frames += 1
        n = self.malformed_frames
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th, ...: a flood does not flood the log
            log.warning(
                "dropped a frame that is not the job's (%s); %d dropped so far. Something "
                "other than the job's tasks sends to this task's gates: turn on "
                "secure_channels to refuse it.",
                err,
                n,
            )

    def _on_watermark(self, channel: int, event: Watermark) -> None:
        valve, target = self.valve, self._target
        advanced = valve.on_watermark(channel, event.timestamp, event.idle)
        if advanced is not None:
            self._idle_told = False
            target.on_watermark(advanced)
        if valve.all_idle:
            if not self._idle_told:
                self._idle_told = True
                target.on_idle()
        elif self._idle_told:
            self._idle_told = False
            target.on_watermark(valve.current)  # active again: tell downstream

"""The input side of a task under unaligned checkpoints: barriers overtake queued input.

Frames are read from the input gate into a local FIFO (a `SpillBuffer`: in memory, then
lz4 on the task's scratch disk) and handed on from there (to ``BlockedChannels.on_frame``,
i.e. processed). Barriers of unaligned checkpoints act when they are *read*, not when
their turn to be processed comes:

* the first barrier(n) read, from the priority gate (where the upstream sends it ahead
  of its queued records) or in band, snapshots the task at once; every data frame then
  queued here (read, not yet processed) is in flight with respect to that snapshot:
  it is logged as channel state (``log_queued``, called by the checkpointer when the
  log opens), and still processed afterwards;
* from then on, data frames read on channels whose barrier(n) has not come in band
  are logged too; barrier(n) in band ends its channel's log (the handler's
  ``Recording``), and when every channel's has come the snapshot is complete;
* while a checkpoint records, the gate is read as fast as frames come and one queued
  frame at most is processed per turn, so the channel state is complete once the
  upstream's queued output has been *read*: a slow task's checkpoint does not wait
  until its backlog has been processed. Otherwise frames are read only while fewer
  than ``QUEUE_FRAMES`` wait, so backpressure still reaches the upstream.

Final barriers (the final checkpoint aligns), end of input and cancel markers keep
their place in the queue and are handled when processed, except a cancel of the
checkpoint being recorded (declined upstream: its barrier will not come in band).

Threading: task-loop thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from channels.messages import (
    KIND_BARRIER,
    KIND_CANCEL,
    KIND_DATA,
    KIND_MASK,
    Barrier,
    CancelBarrier,
    MalformedFrameError,
    count_records,
    decode_event,
    header_of,
)
from runtime.barriers import UnalignedHandler
from runtime.task_io import Gate
from statebackend.spill import SpillBuffer

QUEUE_FRAMES: Final = 64
"""Frames read ahead of processing while no checkpoint records."""
DRAIN_FRAMES: Final = 4096
"""Frames read per turn while a checkpoint records its channel state."""
PROCESS_SECONDS: Final = 0.02
"""Processing time per turn before the gates are read again."""


class OvertakingInput:
    """Reads a task's data and priority gates; see the module docstring."""

    def __init__(
        self,
        gate: Gate,
        priority: Gate,
        handler: UnalignedHandler,
        log: Callable[[bytes, int], None],
        deliver: Callable[[bytes], None],
        spill_dir: Callable[[], str],
        spill_threshold: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``log(frame, records)`` adds a frame to the open channel-state log;
        ``deliver(frame)`` processes a frame (in order, per channel)."""
        self._gate, self._priority, self._handler = gate, priority, handler
        self._log, self._deliver = log, deliver
        self._clock = clock
        self._queue = SpillBuffer(spill_dir, spill_threshold)

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def recording(self) -> bool:
        return self._handler.logging_checkpoint is not None

    # -- reading ---------------------------------------------------------------------------
    def read(self) -> int:
        """Read what waits on the gates (see the module docstring); returns the number of
        frames read. Never blocks."""
        for frame in self._priority.recv_frames(256):
            channel, _kind = header_of(frame)
            try:
                event = decode_event(frame)
            except MalformedFrameError:  # not the job's: nothing to overtake with
                continue
            if isinstance(event, Barrier):
                self._handler.on_priority_barrier(channel, event)
        read = 0
        while True:
            wanted = DRAIN_FRAMES - read if self.recording else QUEUE_FRAMES - len(self)
            if wanted <= 0:
                return read
            frames = self._gate.recv_frames(min(wanted, 256))
            if not frames:
                return read
            read += len(frames)
            for frame in frames:
                self._on_frame(frame)

    def _on_frame(self, frame: bytes) -> None:
        try:
            self._route(frame)
        except MalformedFrameError:  # not the job's: the input side drops and counts it
            self._queue.append(frame)

    def _route(self, frame: bytes) -> None:
        channel, kind = header_of(frame)
        kind &= KIND_MASK
        if kind == KIND_DATA:
            if channel in self._handler.logging_channels:
                self._log(frame, count_records(frame))
        elif kind == KIND_BARRIER:
            event = decode_event(frame)
            if isinstance(event, Barrier) and not event.final:
                self._handler.on_barrier(channel, event)
                return
        elif kind == KIND_CANCEL:  # the recording checkpoint was declined upstream
            cancel = decode_event(frame)
            handler = self._handler
            if isinstance(cancel, CancelBarrier) and (
                cancel.checkpoint_id == handler.logging_checkpoint
            ):
                handler.on_cancel(channel, cancel)
                return
        self._queue.append(frame)

    def log_queued(self) -> None:
        """A snapshot was just taken: every queued data frame is in flight with respect
        to it (read before, processed after), so it goes into the channel-state log."""
        self._queue.rotate(self._log_if_data)

    def _log_if_data(self, frame: bytes) -> None:
        if header_of(frame)[1] & KIND_MASK == KIND_DATA:
            try:
                records = count_records(frame)
            except MalformedFrameError:  # not the job's: the input side drops it
                return
            self._log(frame, records)

    # -- processing ------------------------------------------------------------------------
    def process(self) -> int:
        """Process queued frames, oldest first: one while a checkpoint records, else up
        to ``QUEUE_FRAMES`` or ``PROCESS_SECONDS``; returns how many."""
        queue = self._queue
        if not queue:
            return 0
        budget = 1 if self.recording else QUEUE_FRAMES
        deadline = self._clock() + PROCESS_SECONDS
        done = 0
        while queue and done < budget:
            self._deliver(queue.popleft())
            done += 1
            if self._clock() >= deadline:
                break
        return done

    @property
    def spilled_bytes(self) -> int:
        return self._queue.spilled_bytes

    def close(self) -> None:
        self._queue.close()

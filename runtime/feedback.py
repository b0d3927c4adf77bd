"""The feedback side of a loop head: back-edge frames are always read, never blocked.

A task with back-edge inputs reads them on a gate of their own (the *feedback gate*)
and moves every frame waiting there into a `FeedbackQueue` at every turn of its loop
and whenever one of its sends is blocked (``drain``). So the loop body can always
hand records back to the head, and a loop whose body multiplies records cannot
deadlock under backpressure: a bounded feedback channel plus a blocked head is what
made Flink's streaming iterations time out (docs/loops.md). The queue is a
`statebackend.spill.SpillBuffer`: frames past ``spill_threshold`` bytes go to the
task's scratch dir (lz4), so memory stays bounded while the regular inputs get
backpressure (the head processes feedback first and reads no regular input while
feedback is queued).

Frames of one back-edge channel stay in arrival order (the queue is one FIFO).
Threading: task-loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable

from channels.messages import KIND_MASK, header_of
from runtime.inputs import Dispatch
from runtime.task_io import Gate
from statebackend.spill import SpillBuffer

_HEADER_UNPACK = header_of  # garbage too short for a header goes on, to be dropped


class FeedbackQueue:
    """Back-edge frames read from the feedback gate, waiting to be processed."""

    def __init__(
        self, gate: Gate, dispatch: Dispatch, spill_dir: Callable[[], str], spill_threshold: int
    ) -> None:
        self._gate = gate
        self._dispatch = dispatch
        self._queue = SpillBuffer(spill_dir, spill_threshold)  # no I/O before it spills

    def drain(self) -> int:
        """Move every frame waiting on the feedback gate into the queue; never blocks."""
        moved = 0
        while True:
            frames = self._gate.recv_frames(256)
            if not frames:
                return moved
            append = self._queue.append
            for frame in frames:
                append(frame)
            moved += len(frames)

    def __len__(self) -> int:
        return len(self._queue)

    def process(self, budget: int = 64) -> int:
        """Deliver up to ``budget`` queued frames, oldest first; returns how many."""
        queue = self._queue
        done = 0
        while queue and done < budget:
            frame = queue.popleft()
            channel, kind = _HEADER_UNPACK(frame)
            self._dispatch(channel, kind & KIND_MASK, frame)
            done += 1
        return done

    @property
    def spilled_bytes(self) -> int:
        return self._queue.spilled_bytes

    def close(self) -> None:
        self._queue.close()

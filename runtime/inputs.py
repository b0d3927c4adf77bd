"""The blocked channels of a task's input side: buffered while blocked, replayed after.

While a channel is blocked for alignment, its frames wait, in order, in a
`statebackend.spill.SpillBuffer` (in memory, spilling to the task's temp dir past
``spill_threshold`` bytes). Once it is unblocked its buffer is replayed before any
newer frame of that channel: frames arriving meanwhile are appended behind it.

Which channels are blocked is the barrier handler's to say (``blocked``, e.g.
``BarrierAligner.blocked_channels``); this class keeps no set of its own. ``block``
is the handler's `CheckpointActions.block` passed through: it only starts a buffer.

Threading: task-loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable

from channels.messages import KIND_MASK, header_of
from statebackend.spill import SpillBuffer

Dispatch = Callable[[int, int, bytes], None]
"""Deliver one frame: ``dispatch(channel, kind, frame)`` (kind without flags)."""

_HEADER_UNPACK = header_of  # garbage too short for a header goes on, to be dropped


class BlockedChannels:
    """Frames of blocked (and still replaying) channels, per channel, in arrival order."""

    def __init__(
        self,
        dispatch: Dispatch,
        blocked: Callable[[], frozenset[int]],
        spill_dir: Callable[[], str],
        spill_threshold: int,
    ) -> None:
        self._dispatch = dispatch
        self._blocked = blocked
        self._spill_dir = spill_dir
        self._threshold = spill_threshold
        self._buffers: dict[int, SpillBuffer] = {}
        self.spilled_total = 0
        """Bytes spilled by buffers already replayed and closed (a metric)."""

    def block(self, channel: int) -> None:
        """Buffer ``channel``'s frames from now on (the handler has blocked it)."""
        if channel not in self._buffers:
            self._buffers[channel] = SpillBuffer(self._spill_dir, self._threshold)

    def on_frame(self, frame: bytes) -> None:
        """A frame from the gate: buffer it behind older frames of its channel, or deliver it."""
        channel, kind = _HEADER_UNPACK(frame)
        buf = self._buffers.get(channel)
        if buf is not None:  # blocked, or older frames of this channel still wait for replay
            buf.append(frame)
            return
        self._dispatch(channel, kind & KIND_MASK, frame)

    @property
    def replaying(self) -> bool:
        """Whether an unblocked channel still has buffered frames to replay."""
        if not self._buffers:
            return False
        blocked = self._blocked()
        return any(channel not in blocked for channel in self._buffers)

    @property
    def spilled_bytes(self) -> int:
        """Bytes the current buffers have spilled to disk."""
        return sum(buf.spilled_bytes for buf in self._buffers.values())

    @property
    def buffered_total(self) -> int:
        """Frames waiting in every channel's buffer (a metric: the input queue)."""
        return sum(len(buf) for buf in self._buffers.values())

    def buffered(self, channel: int) -> int:
        """Frames waiting in ``channel``'s buffer."""
        buf = self._buffers.get(channel)
        return 0 if buf is None else len(buf)

    def replay(self, budget: int = 64) -> None:
        """Deliver up to ``budget`` buffered frames of unblocked channels, oldest first.

        A replayed barrier may block its channel again: replay of that channel stops
        there, and its remaining frames wait for the next unblock.
        """
        for channel in list(self._buffers):
            buf = self._buffers.get(channel)
            while buf is not None and buf and budget > 0 and channel not in self._blocked():
                frame = buf.popleft()
                budget -= 1
                self._dispatch(channel, _HEADER_UNPACK(frame)[1] & KIND_MASK, frame)
                buf = self._buffers.get(channel)
            if buf is not None and not buf and channel not in self._blocked():
                self.spilled_total += buf.spilled_bytes
                buf.close()
                del self._buffers[channel]

    def close(self) -> None:
        """Drop every buffer and its spill file."""
        for buf in self._buffers.values():
            buf.close()
        self._buffers.clear()

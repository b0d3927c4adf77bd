"""Bounded in-flight data per channel: Flink's buffer debloating, for our batches.

A barrier waits behind every record queued ahead of it on a channel: the sender's
high-water mark, the receiver's, and the kernel's socket buffers. With fixed batches that
queue holds ``slots x batch_size`` records whatever the channel's speed, so on a slow
(backpressured) channel an aligned barrier waits seconds at every hop. `BatchSizer`
sizes each channel's batches from its measured throughput so that what the channel can
queue drains within ``target`` seconds::

    batch = clamp(throughput x target / slots, min_batch, max_batch)

Throughput is measured where the sender sees it, and only while it means the receiver's
drain rate: records sent per second over windows of at least ``window`` seconds in which
the channel was backpressured: the sender waited on a full queue for at least
``min_blocked_share`` of the window. In such a window the queue is full, the sender goes
at the receiver's pace, and that pace is what a barrier behind the queue waits for. A
window without backpressure says the receiver keeps up, so the queue is short whatever
the batch: the batch grows back (doubles, up to ``max_batch``). So does a window in which
the sender waited only a moment: its rate is the sender's own, a lower bound of the
receiver's; the moment is a receiver that stalled briefly (aligning on a barrier, taking
its snapshot), and counting it shrank the batches of channels whose receivers keep up
behind every checkpoint, and left the job more frames to carry.
The rate used is the highest of the last ``memory`` backpressured windows: a receiver
that stops draining for a moment (aligning its inputs on a barrier, descheduled, taking
its snapshot) is not slow, and sizing from that dip would shrink the batches behind every
checkpoint; a receiver that stays slow for ``memory`` windows is.
Measuring every window instead (idle time, a sender held up by its own alignment, a
throttled source) would take a slow *sender* for a slow *receiver* and shrink batches
that never queue; smaller batches cost more per record, the measured rate falls further,
and the sizes spiral down to ``min_batch`` (seen as a 25x slower job); so would sizing
from the dips. The size only ever changes between two batches. The kernel's share is
bounded separately, by the socket buffer sizes (``JobConfig.socket_buffer``).

Per batch, not per record: `on_batch` is called once per data frame sent. Threading:
one sizer per output channel, on the task-loop thread.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class BatchSizer:
    """The batch size of one output channel, re-computed once per measuring window."""

    max_batch: int
    slots: int
    """Batches the channel can queue (both high-water marks, plus the one being built)."""
    target: float
    """Seconds the queued records may take to drain (``max_inflight_time``)."""
    min_batch: int = 16
    window: float = 0.1
    memory: int = 5
    min_blocked_share: float = 0.25
    """A window is backpressured when the sender waited on the full queue at least this
    share of it."""
    batch_size: int = 0
    throughput: float = 0.0
    """The receiver's drain rate, records per second: the highest of the last ``memory``
    backpressured windows; 0 until the first one closed."""
    _rates: deque[float] = field(default_factory=deque)
    _window_start: float = -1.0
    _window_records: int = 0
    _window_blocked: float = 0.0

    def __post_init__(self) -> None:
        if (
            self.target <= 0
            or self.slots < 1
            or self.memory < 1
            or not 1 <= self.min_batch <= self.max_batch
            or not 0 <= self.min_blocked_share < 1
        ):
            raise ValueError(
                f"BatchSizer needs target > 0, slots >= 1, memory >= 1, "
                f"1 <= min_batch <= max_batch and 0 <= min_blocked_share < 1, got "
                f"target={self.target}, slots={self.slots}, memory={self.memory}, "
                f"min_batch={self.min_batch}, max_batch={self.max_batch}, "
                f"min_blocked_share={self.min_blocked_share}"
            )
        self.batch_size = self.max_batch

    def on_batch(self, records: int, now: float, blocked: float = 0.0) -> int:
        """``records`` were sent at ``now`` (monotonic seconds); ``blocked`` is the
        channel's time blocked on a full queue so far (cumulative seconds). Returns the
        batch size to use from now on."""
        if self._window_start < 0:
            self._window_start, self._window_blocked = now, blocked
            return self.batch_size
        self._window_records += records
        elapsed = now - self._window_start
        if elapsed < self.window:
            return self.batch_size
        waited = blocked - self._window_blocked
        if waited > 0 and waited >= self.min_blocked_share * elapsed:  # the receiver's pace
            self._rates.append(self._window_records / elapsed)
            if len(self._rates) > self.memory:
                self._rates.popleft()
            self.throughput = max(self._rates)
            size = int(self.throughput * self.target / self.slots)
        else:  # the receiver keeps up: the queue is short, grow back
            size = 2 * self.batch_size
        self._window_start, self._window_records, self._window_blocked = now, 0, blocked
        self.batch_size = max(self.min_batch, min(self.max_batch, size))
        return self.batch_size

"""Unaligned barrier handling (Chandy-Lamport; Flink's unaligned checkpoints), and
aligned checkpoints that turn unaligned after a timeout.

``unaligned``: on the first barrier(n) the task snapshots at once and forwards
barrier(n); nothing is blocked. Every record that then arrives on an input whose
barrier(n) has not come yet was sent before the upstream's snapshot and processed
after ours: it is logged as *channel state* until that input's barrier(n) arrives.
When every input delivered barrier(n) (or ended) the log is complete, part of the
snapshot (``channel_state_logged``), and the task acks. A restore replays the
channel state before any new input, so each record counts exactly once.

The final checkpoint (after which upstream sends only end of input) always aligns.

``aligned_timeout``: a checkpoint starts aligned (inputs that delivered barrier(n)
are blocked, as in `BarrierAligner`); when the alignment has taken longer than the
timeout the task snapshots at once, forwards barrier(n), unblocks, and logs the
inputs still without barrier(n) as above.

States: `Idle`, `AligningWithTimeout`, `Recording`; one object at a
time, its event methods return the next state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from channels.messages import Barrier, CancelBarrier
from runtime.barriers.backedges import BackEdgeLogger
from runtime.barriers.protocol import (
    BarrierProtocolError,
    CheckpointActions,
    HandlerInputs,
    HandlerViews,
    channel_set,
)
from runtime.control import CheckpointFailureReason


@dataclass(frozen=True, slots=True)
class Idle:
    """No checkpoint is being aligned or recorded."""


@dataclass(frozen=True, slots=True)
class AligningWithTimeout:
    """Checkpoint ``barrier.checkpoint_id`` aligns (with a timeout): its barrier came from
    the ``blocked`` channels."""

    barrier: Barrier
    started_at: float
    blocked: frozenset[int]


@dataclass(frozen=True, slots=True)
class Recording:
    """Checkpoint ``checkpoint_id`` was snapshotted and forwarded; records of the
    ``waiting`` channels (no barrier(n) yet) are logged as its channel state."""

    checkpoint_id: int
    waiting: frozenset[int]


UnalignedState = Idle | AligningWithTimeout | Recording


class UnalignedHandler(HandlerViews):
    """``unaligned`` (``aligned_timeout=None``, or 0) and ``aligned_timeout`` barrier
    handling for a task with regular inputs only (loops are rejected at build time).

    The task calls ``tick()`` between batches, so an alignment times out even when no
    event arrives.
    """

    def __init__(
        self,
        channels: Iterable[int],
        actions: CheckpointActions,
        clock: Callable[[], float] = time.monotonic,
        aligned_timeout: float | None = None,
    ) -> None:
        live = channel_set(channels)
        self._inputs = HandlerInputs(actions, clock, live, BackEdgeLogger((), actions))
        self._timeout = aligned_timeout or None
        self._state: UnalignedState = Idle()
        self.timed_out = 0  # checkpoints that switched from aligned to unaligned here

    # -- what the task reads ---------------------------------------------------------------
    @property
    def state(self) -> UnalignedState:
        return self._state

    @property
    def blocked_channels(self) -> frozenset[int]:
        return self._state.blocked if isinstance(self._state, AligningWithTimeout) else frozenset()

    @property
    def logging_channels(self) -> frozenset[int]:
        """Channels whose records are channel state of the checkpoint being recorded."""
        return self._state.waiting if isinstance(self._state, Recording) else frozenset()

    @property
    def logging_checkpoint(self) -> int | None:
        return self._state.checkpoint_id if isinstance(self._state, Recording) else None

    @property
    def back_edges_live(self) -> frozenset[int]:
        return frozenset()

    # -- events ----------------------------------------------------------------------------
    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        self._check_readable(channel, barrier)
        n = barrier.checkpoint_id
        state = self._state
        if isinstance(state, Recording) and n == state.checkpoint_id:
            if channel not in state.waiting:
                raise BarrierProtocolError(
                    f"{barrier!r} arrived twice on channel {channel}: FIFO channels deliver "
                    "one barrier per checkpoint"
                )
            self._record(state.checkpoint_id, state.waiting - {channel})
            return
        if n <= self._inputs.latest:
            return  # stale: an aborted or finished checkpoint
        if isinstance(state, Recording | AligningWithTimeout) and n > self._current:
            self._abort_current(CheckpointFailureReason.SUBSUMED)
        self._begin_or_align(channel, barrier)

    def on_priority_barrier(self, channel: int, barrier: Barrier) -> None:
        """barrier(n) overtook ``channel``'s queued records (the priority path): the first
        barrier(n) snapshots at once, and ``channel`` stays logged until barrier(n) arrives
        in band behind its records. Later copies, and copies of older checkpoints, are
        ignored (the in-band copy decides)."""
        n = barrier.checkpoint_id
        if channel not in self._inputs.live or barrier.final or n <= self._current:
            return
        if self._timeout is not None:
            raise BarrierProtocolError(
                f"{barrier!r} overtook channel {channel}, but this task aligns first "
                "(aligned_timeout): only unaligned checkpoints send overtaking barriers"
            )
        if isinstance(self._state, Recording):
            self._abort_current(CheckpointFailureReason.SUBSUMED)
        self._inputs.trigger(barrier, self._inputs.clock())
        self._record(n, self._inputs.live)

    def on_cancel(self, channel: int, cancel: CancelBarrier) -> None:
        self._check_readable(channel, cancel)
        n = cancel.checkpoint_id
        if isinstance(self._state, Recording | AligningWithTimeout):
            if n < self._current:
                return
            if n > self._current:
                self._abort_current(CheckpointFailureReason.SUBSUMED)
            else:
                self._abort_current(CheckpointFailureReason.DECLINED)
                return
        if n > self._inputs.latest:
            self._inputs.abort(n, CheckpointFailureReason.DECLINED)

    def on_end_of_input(self, channel: int) -> None:
        self._check_readable(channel, "end of input")
        self._inputs.live -= {channel}
        state = self._state
        if isinstance(state, Recording):
            self._record(state.checkpoint_id, state.waiting - {channel})
        elif isinstance(state, AligningWithTimeout) and state.blocked >= self._inputs.live:
            self._trigger_aligned(state)
        if not self._inputs.live:
            self._inputs.actions.end_of_all_inputs()

    def abort(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        """Control-plane abort (e.g. the job manager expired the checkpoint)."""
        if (
            isinstance(self._state, Recording | AligningWithTimeout)
            and checkpoint_id == self._current
        ):
            self._abort_current(reason)
        elif checkpoint_id > self._inputs.latest and not isinstance(
            self._state, AligningWithTimeout
        ):
            self._inputs.abort(checkpoint_id, reason)

    def tick(self) -> None:
        """Switch an alignment that took longer than ``aligned_timeout`` to unaligned."""
        state = self._state
        if (
            isinstance(state, AligningWithTimeout)
            and self._timeout is not None
            and not state.barrier.final
            and self._inputs.clock() - state.started_at >= self._timeout
        ):
            self._switch_to_unaligned(state)

    # -- transitions -----------------------------------------------------------------------
    @property
    def _current(self) -> int:
        state = self._state
        if isinstance(state, Recording):
            return state.checkpoint_id
        if isinstance(state, AligningWithTimeout):
            return state.barrier.checkpoint_id
        return self._inputs.latest

    def _begin_or_align(self, channel: int, barrier: Barrier) -> None:
        state = self._state
        # The final checkpoint always aligns: records processed after it would have no
        # later checkpoint to commit their output (upstream sends only end of input).
        if self._timeout is None and not barrier.final:  # unaligned: snapshot at once
            self._inputs.trigger(barrier, self._inputs.clock())
            self._record(barrier.checkpoint_id, self._inputs.live - {channel})
            return
        if not isinstance(state, AligningWithTimeout):
            state = AligningWithTimeout(barrier, self._inputs.clock(), frozenset())
        aligned = state.blocked | {channel}
        if aligned >= self._inputs.live:
            self._trigger_aligned(replace(state, blocked=aligned - {channel}))
            return
        self._inputs.actions.block(channel)
        self._state = replace(state, blocked=aligned)
        self.tick()

    def _trigger_aligned(self, state: AligningWithTimeout) -> None:
        self._inputs.trigger(state.barrier, state.started_at)
        if state.blocked:
            self._inputs.actions.unblock_all()
        self._record(state.barrier.checkpoint_id, frozenset())

    def _switch_to_unaligned(self, state: AligningWithTimeout) -> None:
        self.timed_out += 1
        self._inputs.trigger(state.barrier, state.started_at)
        self._inputs.actions.unblock_all()
        self._record(state.barrier.checkpoint_id, self._inputs.live - state.blocked)

    def _record(self, checkpoint_id: int, waiting: frozenset[int]) -> None:
        if waiting:
            self._state = Recording(checkpoint_id, waiting)
            return
        self._state = Idle()
        self._inputs.actions.channel_state_logged(checkpoint_id)

    def _abort_current(self, reason: CheckpointFailureReason) -> None:
        state = self._state
        self._state = Idle()
        if isinstance(state, AligningWithTimeout):
            self._inputs.abort(state.barrier.checkpoint_id, reason)
            if state.blocked:
                self._inputs.actions.unblock_all()
        elif isinstance(state, Recording):
            self._inputs.abort(state.checkpoint_id, reason)

    def _check_readable(self, channel: int, event: object) -> None:
        self._inputs.check_live(channel, event)
        if channel in self.blocked_channels:
            raise BarrierProtocolError(
                f"{event} arrived on channel {channel}, which is blocked: the task must "
                "buffer a blocked channel's input until unblock_all()"
            )

    def __repr__(self) -> str:
        return (
            f"UnalignedHandler(state={self._state!r}, live={sorted(self._inputs.live)}, "
            f"latest={self._inputs.latest}, timeout={self._timeout})"
        )

"""Barrier handling: the ABS state machines on a task's input side.

A task feeds every in-band control event it reads from its input channels
(barrier, cancel barrier, end of input) and every control-plane abort into one
handler, which decides; the task acts through `CheckpointActions`.

* `BarrierAligner` (``exactly_once``): ABS alignment, Carbone et al. 2015,
  algorithm 1. On barrier(n) from channel c: block c; when barrier(n) has come
  from every live input: snapshot, forward barrier(n), unblock all.
* `BarrierTracker` (``at_least_once``): the same bookkeeping without blocking;
  records after a barrier may enter the snapshot, so replay can duplicate them.

The states follow Flink's ``BarrierHandlerState``: the aligner holds exactly one
state object (`WaitingForBarrier` or `Aligning`) whose event methods return the
next state.

Contracts the handlers rely on (a violation raises `BarrierProtocolError`):

* channels are FIFO: each channel delivers at most one barrier per checkpoint,
  barrier ids on a channel strictly increase, and nothing follows end of input;
* after ``block(c)`` the task delivers nothing from ``c`` until ``unblock_all()``.

Threading: task-loop thread only; the handlers call back into the task
synchronously, from inside the ``on_*`` / ``abort`` call that caused the action.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol

from channels.control import CheckpointFailureReason
from channels.errors import AbsflowError
from channels.messages import Barrier, CancelBarrier

logger = logging.getLogger(__name__)

NO_CHECKPOINT = -1
"""`latest_checkpoint_id` before any checkpoint was triggered or aborted."""


class BarrierProtocolError(AbsflowError, RuntimeError):
    """The task fed a barrier handler an event its FIFO input channels cannot produce.

    This is a bug in the task loop or the channel layer (reading a blocked or
    ended channel, a channel id the handler was not built with), never in user code.
    """


class CheckpointActions(Protocol):
    """What a barrier handler asks of its task. Implemented by the task.

    Calls come in protocol order: for one checkpoint, ``block`` calls, then
    ``trigger_checkpoint`` or ``abort_checkpoint``, then ``unblock_all`` if
    anything was blocked; ``end_of_all_inputs`` comes last, once.
    """

    def block(self, channel: int) -> None:
        """Stop delivering ``channel``: buffer its input, in order, until ``unblock_all``."""

    def unblock_all(self) -> None:
        """Deliver every blocked channel again, replaying its buffer before newer input."""

    def trigger_checkpoint(self, barrier: Barrier, alignment_started_at: float) -> None:
        """Snapshot state, then forward ``barrier`` on all outputs, then ack.

        ``alignment_started_at`` is the handler's clock when the checkpoint's
        first barrier arrived (alignment time = now - alignment_started_at).
        """

    def abort_checkpoint(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        """Forward ``CancelBarrier(checkpoint_id)`` on all outputs and report the decline."""

    def end_of_all_inputs(self) -> None:
        """Every input channel has ended (called after any trigger it caused)."""


class BarrierHandler(Protocol):
    """The interface the task loop drives; `BarrierAligner` and `BarrierTracker` have it."""

    def on_barrier(self, channel: int, barrier: Barrier) -> None: ...
    def on_cancel(self, channel: int, cancel: CancelBarrier) -> None: ...
    def on_end_of_input(self, channel: int) -> None: ...
    def abort(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None: ...

    @property
    def blocked_channels(self) -> frozenset[int]: ...
    @property
    def live_channels(self) -> frozenset[int]: ...
    @property
    def latest_checkpoint_id(self) -> int: ...


@dataclass(slots=True)
class _Inputs:
    """What a handler knows besides its checkpoint state: the input channels and the task."""

    actions: CheckpointActions
    clock: Callable[[], float]
    live: frozenset[int]
    """Channels that have not ended."""
    latest: int = NO_CHECKPOINT
    """Highest checkpoint id triggered or aborted here; its barriers, and older ones, are stale."""
    all_channels: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        self.all_channels = self.live

    def check_live(self, channel: int, event: object) -> None:
        if channel in self.live:
            return
        if channel in self.all_channels:
            raise BarrierProtocolError(
                f"{event} arrived on channel {channel} after its end of input: "
                "a FIFO channel delivers nothing after end of input"
            )
        raise BarrierProtocolError(
            f"{event} arrived on unknown channel {channel}; the handler's input "
            f"channels are {sorted(self.all_channels)}"
        )

    def trigger(self, barrier: Barrier, started_at: float) -> None:
        logger.debug("checkpoint %d aligned, triggering", barrier.checkpoint_id)
        self.actions.trigger_checkpoint(barrier, started_at)
        self.latest = max(self.latest, barrier.checkpoint_id)

    def abort(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        logger.debug("checkpoint %d aborted: %s", checkpoint_id, reason.message)
        self.actions.abort_checkpoint(checkpoint_id, reason)
        self.latest = max(self.latest, checkpoint_id)


def _channel_set(channels: Iterable[int]) -> frozenset[int]:
    listed = list(channels)
    live = frozenset(listed)
    if not live:
        raise ValueError("a barrier handler needs at least one input channel; sources have none")
    if len(live) != len(listed):
        raise ValueError(f"input channel ids must be distinct, got {listed}")
    return live


# --- exactly-once: alignment ---------------------------------------------------------
#
# The aligner drops stale events (checkpoint id <= latest) before asking the
# state, so the states only see checkpoints newer than anything finished here.


@dataclass(frozen=True, slots=True)
class WaitingForBarrier:
    """Idle: no checkpoint is being aligned and no channel is blocked."""

    def barrier_received(self, inputs: _Inputs, channel: int, barrier: Barrier) -> AlignerState:
        alignment = Aligning(barrier, started_at=inputs.clock(), blocked=frozenset())
        return alignment.barrier_received(inputs, channel, barrier)

    def cancel_received(self, inputs: _Inputs, cancel: CancelBarrier) -> AlignerState:
        # Record the abort so the checkpoint's barriers from other channels are ignored.
        inputs.abort(cancel.checkpoint_id, CheckpointFailureReason.DECLINED)
        return self

    def end_of_input(self, inputs: _Inputs) -> AlignerState:
        return self

    def abort(
        self, inputs: _Inputs, checkpoint_id: int, reason: CheckpointFailureReason
    ) -> AlignerState:
        inputs.abort(checkpoint_id, reason)
        return self


@dataclass(frozen=True, slots=True)
class Aligning:
    """Checkpoint ``barrier.checkpoint_id`` is being aligned.

    Its barrier has come from the ``blocked`` channels (never empty); they stay
    blocked until the checkpoint is triggered or aborted.
    """

    barrier: Barrier
    started_at: float
    blocked: frozenset[int]

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id

    def barrier_received(self, inputs: _Inputs, channel: int, barrier: Barrier) -> AlignerState:
        if barrier.checkpoint_id < self.checkpoint_id:
            # Some channel skipped that checkpoint, so it can never be aligned here.
            return self
        if barrier.checkpoint_id > self.checkpoint_id:
            subsumed = self._abort(inputs, CheckpointFailureReason.SUBSUMED)
            return subsumed.barrier_received(inputs, channel, barrier)
        aligned = self.blocked | {channel}
        if aligned >= inputs.live:
            # The last barrier is not blocked: nothing more is read from its
            # channel before the snapshot is taken.
            return self._trigger(inputs)
        inputs.actions.block(channel)
        return replace(self, blocked=aligned)

    def cancel_received(self, inputs: _Inputs, cancel: CancelBarrier) -> AlignerState:
        if cancel.checkpoint_id < self.checkpoint_id:
            return self
        if cancel.checkpoint_id > self.checkpoint_id:
            # The cancelling channel has passed our checkpoint without its barrier.
            subsumed = self._abort(inputs, CheckpointFailureReason.SUBSUMED)
            return subsumed.cancel_received(inputs, cancel)
        return self._abort(inputs, CheckpointFailureReason.DECLINED)

    def end_of_input(self, inputs: _Inputs) -> AlignerState:
        # Ended inputs count as aligned.
        if self.blocked >= inputs.live:
            return self._trigger(inputs)
        return self

    def abort(
        self, inputs: _Inputs, checkpoint_id: int, reason: CheckpointFailureReason
    ) -> AlignerState:
        if checkpoint_id == self.checkpoint_id:
            return self._abort(inputs, reason)
        # An older id never started here. A newer one is not ours to abort: our
        # checkpoint can still complete, and if the newer one's barriers come
        # later they align and the job manager drops the late ack.
        return self

    def _trigger(self, inputs: _Inputs) -> WaitingForBarrier:
        inputs.trigger(self.barrier, self.started_at)
        return self._unblock(inputs)

    def _abort(self, inputs: _Inputs, reason: CheckpointFailureReason) -> WaitingForBarrier:
        inputs.abort(self.checkpoint_id, reason)
        return self._unblock(inputs)

    def _unblock(self, inputs: _Inputs) -> WaitingForBarrier:
        if self.blocked:  # empty only when the first barrier completed the alignment
            inputs.actions.unblock_all()
        return WaitingForBarrier()


AlignerState = WaitingForBarrier | Aligning


class BarrierAligner:
    """Exactly-once barrier handling: aligns every checkpoint before triggering it.

    Barrier ids delivered to the aligner need not be contiguous; a barrier or
    cancel with an id <= `latest_checkpoint_id` is ignored.
    """

    def __init__(
        self,
        channels: Iterable[int],
        actions: CheckpointActions,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inputs = _Inputs(actions, clock, _channel_set(channels))
        self._state: AlignerState = WaitingForBarrier()

    @property
    def state(self) -> AlignerState:
        return self._state

    @property
    def blocked_channels(self) -> frozenset[int]:
        return self._state.blocked if isinstance(self._state, Aligning) else frozenset()

    @property
    def live_channels(self) -> frozenset[int]:
        return self._inputs.live

    @property
    def latest_checkpoint_id(self) -> int:
        return self._inputs.latest

    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        self._check_readable(channel, barrier)
        if barrier.checkpoint_id <= self._inputs.latest:
            return
        self._state = self._state.barrier_received(self._inputs, channel, barrier)

    def on_cancel(self, channel: int, cancel: CancelBarrier) -> None:
        self._check_readable(channel, cancel)
        if cancel.checkpoint_id <= self._inputs.latest:
            return
        self._state = self._state.cancel_received(self._inputs, cancel)

    def on_end_of_input(self, channel: int) -> None:
        self._check_readable(channel, "end of input")
        self._inputs.live -= {channel}
        self._state = self._state.end_of_input(self._inputs)
        if not self._inputs.live:
            self._inputs.actions.end_of_all_inputs()

    def abort(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        """Control-plane abort (e.g. the job manager expired the checkpoint).

        Aborts the checkpoint being aligned if it is ``checkpoint_id``; while
        idle, aborts a checkpoint not seen yet so its barriers will be ignored.
        """
        if checkpoint_id <= self._inputs.latest:
            return
        self._state = self._state.abort(self._inputs, checkpoint_id, reason)

    def _check_readable(self, channel: int, event: object) -> None:
        self._inputs.check_live(channel, event)
        if channel in self.blocked_channels:
            assert isinstance(self._state, Aligning)
            raise BarrierProtocolError(
                f"{event} arrived on channel {channel}, which is blocked for checkpoint "
                f"{self._state.checkpoint_id}: the task must buffer a blocked channel's "
                "input until unblock_all() (FIFO channels deliver one barrier per checkpoint)"
            )

    def __repr__(self) -> str:
        return (
            f"BarrierAligner(state={self._state!r}, live={sorted(self._inputs.live)}, "
            f"latest={self._inputs.latest})"
        )


# --- at-least-once: tracking ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PendingBarriers:
    """A checkpoint whose barrier has come from the ``arrived`` channels, not yet from all."""

    barrier: Barrier
    first_arrival: float
    arrived: frozenset[int]


class BarrierTracker:
    """At-least-once barrier handling: counts barriers, never blocks.

    Several checkpoints may be pending at once; checkpoint n triggers when its
    barrier has come from every live channel. Triggering or aborting n drops
    every older pending checkpoint (aborted as `CheckpointFailureReason.SUBSUMED`).
    """

    def __init__(
        self,
        channels: Iterable[int],
        actions: CheckpointActions,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inputs = _Inputs(actions, clock, _channel_set(channels))
        # By checkpoint id; every id > latest, inserted in increasing id order.
        self._pending: dict[int, PendingBarriers] = {}

    @property
    def pending_checkpoints(self) -> Mapping[int, PendingBarriers]:
        return MappingProxyType(dict(self._pending))

    @property
    def blocked_channels(self) -> frozenset[int]:
        return frozenset()

    @property
    def live_channels(self) -> frozenset[int]:
        return self._inputs.live

    @property
    def latest_checkpoint_id(self) -> int:
        return self._inputs.latest

    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        self._inputs.check_live(channel, barrier)
        checkpoint_id = barrier.checkpoint_id
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            if not self._is_new(checkpoint_id):
                return  # finished here, or skipped by a channel that has passed it
            pending = PendingBarriers(barrier, self._inputs.clock(), frozenset())
        elif channel in pending.arrived:
            raise BarrierProtocolError(
                f"{barrier!r} arrived twice on channel {channel}: FIFO channels deliver "
                "one barrier per checkpoint"
            )
        self._pending[checkpoint_id] = replace(pending, arrived=pending.arrived | {channel})
        self._trigger_complete()

    def on_cancel(self, channel: int, cancel: CancelBarrier) -> None:
        self._inputs.check_live(channel, cancel)
        self.abort(cancel.checkpoint_id, CheckpointFailureReason.DECLINED)

    def on_end_of_input(self, channel: int) -> None:
        self._inputs.check_live(channel, "end of input")
        self._inputs.live -= {channel}
        self._trigger_complete()
        if not self._inputs.live:
            self._inputs.actions.end_of_all_inputs()

    def abort(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        """Abort a pending or not yet seen checkpoint; ignore finished or skipped ones."""
        if checkpoint_id in self._pending or self._is_new(checkpoint_id):
            self._drop_older_than(checkpoint_id)
            self._pending.pop(checkpoint_id, None)
            self._inputs.abort(checkpoint_id, reason)

    def _is_new(self, checkpoint_id: int) -> bool:
        return checkpoint_id > max(self._pending, default=self._inputs.latest)

    def _trigger_complete(self) -> None:
        for checkpoint_id, pending in list(self._pending.items()):
            if pending.arrived >= self._inputs.live:  # ended inputs count as arrived
                self._drop_older_than(checkpoint_id)
                del self._pending[checkpoint_id]
                self._inputs.trigger(pending.barrier, pending.first_arrival)

    def _drop_older_than(self, checkpoint_id: int) -> None:
        for older in [pending_id for pending_id in self._pending if pending_id < checkpoint_id]:
            del self._pending[older]
            self._inputs.abort(older, CheckpointFailureReason.SUBSUMED)

    def __repr__(self) -> str:
        return (
            f"BarrierTracker(pending={sorted(self._pending)}, live={sorted(self._inputs.live)}, "
            f"latest={self._inputs.latest})"
        )

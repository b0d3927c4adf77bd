"""Exactly-once barrier handling: ABS alignment (Carbone et al. 2015, algorithm 1).

On barrier(n) from channel c: block c; when barrier(n) has come from every live
regular input: snapshot, forward barrier(n), unblock all. The states follow
Flink's ``BarrierHandlerState``: the aligner holds exactly one state object
(`WaitingForBarrier` or `Aligning`) whose event methods return the next state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from channels.messages import Barrier, CancelBarrier
from runtime.barriers.backedges import BackEdgeInputs, BackEdgeLogger
from runtime.barriers.protocol import (
    BarrierProtocolError,
    CheckpointActions,
    HandlerInputs,
    channel_set,
)
from runtime.control import CheckpointFailureReason

# The aligner drops stale events (checkpoint id <= latest) before asking the
# state, so the states only see checkpoints newer than anything finished here.


@dataclass(frozen=True, slots=True)
class WaitingForBarrier:
    """Idle: no checkpoint is being aligned and no channel is blocked."""

    def barrier_received(
        self, inputs: HandlerInputs, channel: int, barrier: Barrier
    ) -> AlignerState:
        alignment = Aligning(barrier, started_at=inputs.clock(), blocked=frozenset())
        return alignment.barrier_received(inputs, channel, barrier)

    def cancel_received(self, inputs: HandlerInputs, cancel: CancelBarrier) -> AlignerState:
        # Record the abort so the checkpoint's barriers from other channels are ignored.
        inputs.abort(cancel.checkpoint_id, CheckpointFailureReason.DECLINED)
        return self

    def end_of_input(self, inputs: HandlerInputs) -> AlignerState:
        return self

    def abort(
        self, inputs: HandlerInputs, checkpoint_id: int, reason: CheckpointFailureReason
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

    def barrier_received(
        self, inputs: HandlerInputs, channel: int, barrier: Barrier
    ) -> AlignerState:
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

    def cancel_received(self, inputs: HandlerInputs, cancel: CancelBarrier) -> AlignerState:
        if cancel.checkpoint_id < self.checkpoint_id:
            return self
        if cancel.checkpoint_id > self.checkpoint_id:
            # The cancelling channel has passed our checkpoint without its barrier.
            subsumed = self._abort(inputs, CheckpointFailureReason.SUBSUMED)
            return subsumed.cancel_received(inputs, cancel)
        return self._abort(inputs, CheckpointFailureReason.DECLINED)

    def end_of_input(self, inputs: HandlerInputs) -> AlignerState:
        # Ended inputs count as aligned.
        if self.blocked >= inputs.live:
            return self._trigger(inputs)
        return self

    def abort(
        self, inputs: HandlerInputs, checkpoint_id: int, reason: CheckpointFailureReason
    ) -> AlignerState:
        if checkpoint_id == self.checkpoint_id:
            return self._abort(inputs, reason)
        # An older id never started here. A newer one is not ours to abort: our
        # checkpoint can still complete, and if the newer one's barriers come
        # later they align and the job manager drops the late ack.
        return self

    def _trigger(self, inputs: HandlerInputs) -> WaitingForBarrier:
        inputs.trigger(self.barrier, self.started_at)
        return self._unblock(inputs)

    def _abort(self, inputs: HandlerInputs, reason: CheckpointFailureReason) -> WaitingForBarrier:
        inputs.abort(self.checkpoint_id, reason)
        return self._unblock(inputs)

    def _unblock(self, inputs: HandlerInputs) -> WaitingForBarrier:
        if self.blocked:  # empty only when the first barrier completed the alignment
            inputs.actions.unblock_all()
        return WaitingForBarrier()


AlignerState = WaitingForBarrier | Aligning


class BarrierAligner(BackEdgeInputs):
    """Exactly-once barrier handling: aligns every checkpoint before triggering it.

    Barrier ids delivered to the aligner need not be contiguous; a barrier or
    cancel with an id <= `latest_checkpoint_id` is ignored.
    """

    def __init__(
        self,
        channels: Iterable[int],
        actions: CheckpointActions,
        clock: Callable[[], float] = time.monotonic,
        back_edges: Iterable[int] = (),
    ) -> None:
        """``channels``: the regular inputs (aligned); ``back_edges``: back-edge inputs
        (never blocked, logged after each trigger until the barrier comes back)."""
        back = list(back_edges)
        live = channel_set(channels, back)
        self._logger = BackEdgeLogger(back, actions)
        self._inputs = HandlerInputs(actions, clock, live, self._logger)
        self._state: AlignerState = WaitingForBarrier()

    @property
    def state(self) -> AlignerState:
        return self._state

    @property
    def blocked_channels(self) -> frozenset[int]:
        return self._state.blocked if isinstance(self._state, Aligning) else frozenset()

    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        if self._on_back_edge_event(channel, barrier):
            return
        self._check_readable(channel, barrier)
        if barrier.checkpoint_id <= self._inputs.latest:
            return
        self._state = self._state.barrier_received(self._inputs, channel, barrier)

    def on_cancel(self, channel: int, cancel: CancelBarrier) -> None:
        if self._on_back_edge_event(channel, cancel):
            return
        self._check_readable(channel, cancel)
        if cancel.checkpoint_id <= self._inputs.latest:
            return
        self._state = self._state.cancel_received(self._inputs, cancel)

    def on_end_of_input(self, channel: int) -> None:
        if self._on_back_edge_event(channel, None):
            return
        self._check_readable(channel, "end of input")
        self._inputs.live -= {channel}
        self._state = self._state.end_of_input(self._inputs)
        if not self._inputs.live:
            self._inputs.actions.end_of_all_inputs()

    def tick(self) -> None:
        """Nothing happens with time here."""

    def abort(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        """Control-plane abort (e.g. the job manager expired the checkpoint).

        Aborts the checkpoint being aligned if it is ``checkpoint_id``; while
        idle, aborts a checkpoint not seen yet so its barriers will be ignored; a
        checkpoint past alignment whose back-edges are still logged stops logging.
        """
        self._inputs.abort_logging(checkpoint_id, reason)
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

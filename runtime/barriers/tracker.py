"""At-least-once barrier handling: barriers are counted, nothing is blocked, so records
after a barrier may enter the snapshot and a replay can duplicate them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from channels.messages import Barrier, CancelBarrier
from runtime.barriers.backedges import BackEdgeInputs, BackEdgeLogger
from runtime.barriers.protocol import (
    BarrierProtocolError,
    CheckpointActions,
    HandlerInputs,
    channel_set,
)
from runtime.control import CheckpointFailureReason


@dataclass(frozen=True, slots=True)
class PendingBarriers:
    """A checkpoint whose barrier has come from the ``arrived`` channels, not yet from all."""

    barrier: Barrier
    first_arrival: float
    arrived: frozenset[int]


class BarrierTracker(BackEdgeInputs):
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
        back_edges: Iterable[int] = (),
    ) -> None:
        back = list(back_edges)
        live = channel_set(channels, back)
        self._logger = BackEdgeLogger(back, actions)
        self._inputs = HandlerInputs(actions, clock, live, self._logger)
        # By checkpoint id; every id > latest, inserted in increasing id order.
        self._pending: dict[int, PendingBarriers] = {}

    @property
    def pending_checkpoints(self) -> Mapping[int, PendingBarriers]:
        return MappingProxyType(dict(self._pending))

    @property
    def blocked_channels(self) -> frozenset[int]:
        return frozenset()

    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        if self._on_back_edge_event(channel, barrier):
            return
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
        if self._on_back_edge_event(channel, cancel):
            return
        self._inputs.check_live(channel, cancel)
        self.abort(cancel.checkpoint_id, CheckpointFailureReason.DECLINED)

    def on_end_of_input(self, channel: int) -> None:
        if self._on_back_edge_event(channel, None):
            return
        self._inputs.check_live(channel, "end of input")
        self._inputs.live -= {channel}
        self._trigger_complete()
        if not self._inputs.live:
            self._inputs.actions.end_of_all_inputs()

    def tick(self) -> None:
        """Nothing happens with time here."""

    def abort(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        """Abort a pending or not yet seen checkpoint, or one whose back-edges are still
        logged; ignore finished or skipped ones."""
        self._inputs.abort_logging(checkpoint_id, reason)
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

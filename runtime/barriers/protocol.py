"""What every barrier handler shares: the task's side (`CheckpointActions`), the
handler's interface (`BarrierHandler`), its input bookkeeping, and the protocol error."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from channels.errors import AbsflowError
from channels.messages import Barrier, CancelBarrier
from runtime.control import CheckpointFailureReason

logger = logging.getLogger("runtime.barriers")

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
        """Every regular input channel has ended (called after any trigger it caused).

        Back-edge channels end later (their end of input comes around the loop after
        this task forwarded its own); the handler's ``back_edges_live`` tells when.
        """

    def channel_state_logged(self, checkpoint_id: int) -> None:
        """Unaligned checkpoints: barrier(checkpoint_id) arrived on every input (or it
        ended) after the snapshot: the records logged meanwhile on inputs without it
        (the channel state) complete the snapshot; the task may write and ack it.
        Called only after ``trigger_checkpoint`` of that checkpoint."""

    def back_edges_logged(self, checkpoint_id: int) -> None:
        """Barrier(checkpoint_id) came back on every back-edge channel: the back-edge log
        of the checkpoint is complete (part of the snapshot); the task may ack it.
        Called only for checkpoints this task triggered, after ``trigger_checkpoint``."""


class BarrierHandler(Protocol):
    """The interface the task loop drives; `BarrierAligner` and `BarrierTracker` have it."""

    def on_barrier(self, channel: int, barrier: Barrier) -> None: ...
    def on_cancel(self, channel: int, cancel: CancelBarrier) -> None: ...
    def on_end_of_input(self, channel: int) -> None: ...
    def abort(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None: ...
    def tick(self) -> None:
        """Between batches: act on time (an aligned checkpoint's timeout)."""

    @property
    def blocked_channels(self) -> frozenset[int]: ...
    @property
    def live_channels(self) -> frozenset[int]: ...
    @property
    def latest_checkpoint_id(self) -> int: ...
    @property
    def logging_channels(self) -> frozenset[int]: ...
    @property
    def back_edges_live(self) -> frozenset[int]: ...
    @property
    def logging_checkpoint(self) -> int | None: ...


class BackEdges(Protocol):
    """A handler's back-edge side (`runtime.barriers.backedges.BackEdgeLogger`)."""

    channels: frozenset[int]
    live: frozenset[int]

    @property
    def logging_channels(self) -> frozenset[int]: ...
    @property
    def logging_checkpoint(self) -> int | None: ...
    def start(self, checkpoint_id: int) -> None: ...
    def stop(self, checkpoint_id: int) -> None: ...
    def abort_older(
        self, checkpoint_id: int, abort: Callable[[int, CheckpointFailureReason], None]
    ) -> None: ...
    def on_barrier(self, channel: int, barrier: Barrier) -> None: ...
    def on_end_of_input(self, channel: int) -> None: ...


@dataclass(slots=True)
class HandlerInputs:
    """What a handler knows besides its checkpoint state: the input channels and the task."""

    actions: CheckpointActions
    clock: Callable[[], float]
    live: frozenset[int]
    """Regular channels that have not ended."""
    back_edges: BackEdges
    latest: int = NO_CHECKPOINT
    """Highest checkpoint id triggered or aborted here; its barriers, and older ones, are stale."""
    all_channels: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        self.all_channels = self.live

    def check_live(self, channel: int, event: object) -> None:
        if channel in self.live:
            return
        if channel in self.all_channels or channel in self.back_edges.channels:
            raise BarrierProtocolError(
                f"{event} arrived on channel {channel} after its end of input: "
                "a FIFO channel delivers nothing after end of input"
            )
        raise BarrierProtocolError(
            f"{event} arrived on unknown channel {channel}; the handler's input "
            f"channels are {sorted(self.all_channels | self.back_edges.channels)}"
        )

    def trigger(self, barrier: Barrier, started_at: float) -> None:
        logger.debug("checkpoint %d aligned, triggering", barrier.checkpoint_id)
        # A newer checkpoint subsumes one whose back-edge barriers are still out.
        self.back_edges.abort_older(barrier.checkpoint_id, self.abort)
        self.actions.trigger_checkpoint(barrier, started_at)
        self.latest = max(self.latest, barrier.checkpoint_id)
        self.back_edges.start(barrier.checkpoint_id)

    def abort(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        logger.debug("checkpoint %d aborted: %s", checkpoint_id, reason.message)
        self.back_edges.stop(checkpoint_id)
        self.actions.abort_checkpoint(checkpoint_id, reason)
        self.latest = max(self.latest, checkpoint_id)

    def abort_logging(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        """Control-plane abort of a checkpoint that is past alignment, still logging."""
        if self.back_edges.logging_checkpoint == checkpoint_id:
            self.abort(checkpoint_id, reason)


class HandlerViews:
    """What every handler reports from its `HandlerInputs` (the task reads these)."""

    _inputs: HandlerInputs

    @property
    def live_channels(self) -> frozenset[int]:
        """Regular input channels that have not ended."""
        return self._inputs.live

    @property
    def latest_checkpoint_id(self) -> int:
        return self._inputs.latest


def channel_set(channels: Iterable[int], back_edges: Iterable[int] = ()) -> frozenset[int]:
    listed = list(channels)
    live = frozenset(listed)
    if not live:
        raise BarrierProtocolError(
            "a barrier handler needs at least one regular input channel; sources have none"
        )
    back = list(back_edges)
    if len(live) != len(listed) or len(set(back)) != len(back) or live & set(back):
        raise BarrierProtocolError(
            f"input channel ids must be distinct, got {listed} and back-edges {back}"
        )
    return live

"""Cyclic ABS (Carbone et al. 2015, algorithm 2): the back-edge side of a task's inputs.

A task with back-edge inputs aligns on its regular inputs only. Once checkpoint n
is triggered (snapshot taken, barrier forwarded) its `BackEdgeLogger` is
`LoggingBackEdges`: every record arriving on a back-edge channel is logged, and
processed as usual, until barrier(n) comes back on each back-edge channel; that
barrier is consumed, not forwarded. The log, the records in flight around the loop
at the snapshot, completes the task's part of checkpoint n. Back-edges are never
blocked.

A barrier can come back *before* the task triggered its checkpoint when the loop body
does not align: in a superstep iteration the heads feed each other directly, and a
head that snapshotted first forwards its barrier to one that has not yet (its own
barrier from the source still on the way, or held until its update ends: tail
checkpoints, `runtime.superstep`). Such an early barrier is remembered, and its channel
is not waited for when the checkpoint triggers here (nothing on it is in flight around
the snapshot). A loop whose body aligns all heads' barriers (a streaming loop) never
sends one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from channels.messages import Barrier, CancelBarrier
from runtime.barriers.protocol import (
    BarrierProtocolError,
    CheckpointActions,
    HandlerInputs,
    HandlerViews,
)
from runtime.control import CheckpointFailureReason


@dataclass(frozen=True, slots=True)
class NotLogging:
    """No checkpoint is waiting for its barriers to come back on the back-edges."""


@dataclass(frozen=True, slots=True)
class LoggingBackEdges:
    """Checkpoint ``checkpoint_id`` was triggered here; records arriving on the
    ``waiting`` back-edge channels are in flight around the loop at the snapshot and
    are logged until barrier(``checkpoint_id``) comes back on each of them."""

    checkpoint_id: int
    waiting: frozenset[int]


LoggerState = NotLogging | LoggingBackEdges


class BackEdgeLogger:
    """Which back-edge channels a task logs, and when its back-edge log is complete.

    Owned by a barrier handler (it calls ``start``/``stop``); the task reads
    ``logging_channels`` on its data path. Barrier ids on a back-edge channel strictly
    increase; a barrier of a checkpoint that is not being logged (aborted, or
    subsumed) is consumed and ignored.
    """

    def __init__(self, channels: Iterable[int], actions: CheckpointActions) -> None:
        self.channels = frozenset(channels)
        self.live = self.channels
        self._actions = actions
        self._state: LoggerState = NotLogging()
        self._seen = 0  # the newest checkpoint started or stopped here
        self._early: dict[int, frozenset[int]] = {}  # newer checkpoints' barriers, by channel

    @property
    def state(self) -> LoggerState:
        return self._state

    @property
    def logging_channels(self) -> frozenset[int]:
        state = self._state
        return state.waiting if isinstance(state, LoggingBackEdges) else frozenset()

    @property
    def logging_checkpoint(self) -> int | None:
        state = self._state
        return state.checkpoint_id if isinstance(state, LoggingBackEdges) else None

    def start(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was just triggered (snapshot taken, barrier sent)."""
        if not self.channels:
            return
        early = self._forget_early(checkpoint_id)
        self._state = LoggingBackEdges(checkpoint_id, self.live - early)
        self._complete_if_done()

    def _forget_early(self, checkpoint_id: int) -> frozenset[int]:
        """Checkpoint ``checkpoint_id`` starts or stops here: the channels its barrier came
        back on early; those of older checkpoints are forgotten."""
        self._seen = max(self._seen, checkpoint_id)
        early = self._early.pop(checkpoint_id, frozenset())
        self._early = {n: c for n, c in self._early.items() if n > checkpoint_id}
        return early

    def stop(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted: stop logging it (the task drops the log)."""
        self._forget_early(checkpoint_id)
        if self.logging_checkpoint == checkpoint_id:
            self._state = NotLogging()

    def abort_older(
        self, checkpoint_id: int, abort: Callable[[int, CheckpointFailureReason], None]
    ) -> None:
        """Checkpoint ``checkpoint_id`` is about to trigger: an older one still logged is
        subsumed (``abort`` it)."""
        logging = self.logging_checkpoint
        if logging is not None and logging < checkpoint_id:
            abort(logging, CheckpointFailureReason.SUBSUMED)

    def on_barrier(self, channel: int, barrier: Barrier) -> None:
        state = self._state
        if isinstance(state, LoggingBackEdges) and barrier.checkpoint_id == state.checkpoint_id:
            if channel not in state.waiting:
                raise BarrierProtocolError(
                    f"{barrier!r} came back twice on back-edge channel {channel}: FIFO "
                    "channels deliver one barrier per checkpoint"
                )
            self._state = replace(state, waiting=state.waiting - {channel})
            self._complete_if_done()
        elif isinstance(state, LoggingBackEdges) and barrier.checkpoint_id > state.checkpoint_id:
            raise BarrierProtocolError(
                f"{barrier!r} came back on back-edge channel {channel} while checkpoint "
                f"{state.checkpoint_id} is logged: this task never forwarded it"
            )
        elif barrier.checkpoint_id > self._seen:  # not triggered here yet: see the module
            early = self._early.get(barrier.checkpoint_id, frozenset())
            if channel in early:
                raise BarrierProtocolError(
                    f"{barrier!r} came back twice on back-edge channel {channel}: FIFO "
                    "channels deliver one barrier per checkpoint"
                )
            self._early[barrier.checkpoint_id] = early | {channel}
        # else: the barrier of an aborted or subsumed checkpoint, consumed here

    def on_end_of_input(self, channel: int) -> None:
        self.live -= {channel}
        state = self._state
        if isinstance(state, LoggingBackEdges) and channel in state.waiting:
            self._state = replace(state, waiting=state.waiting - {channel})
            self._complete_if_done()

    def _complete_if_done(self) -> None:
        state = self._state
        if isinstance(state, LoggingBackEdges) and not state.waiting:
            self._state = NotLogging()
            self._actions.back_edges_logged(state.checkpoint_id)

    def __repr__(self) -> str:
        return f"BackEdgeLogger(state={self._state!r}, live={sorted(self.live)})"


class BackEdgeInputs(HandlerViews):
    """What both handlers do with back-edge channels: hand their events to the logger."""

    _inputs: HandlerInputs
    _logger: BackEdgeLogger

    @property
    def logging_channels(self) -> frozenset[int]:
        """Back-edge channels whose records the task logs now (see BackEdgeLogger)."""
        return self._inputs.back_edges.logging_channels

    @property
    def logging_checkpoint(self) -> int | None:
        """The checkpoint whose back-edges are logged now, if any."""
        return self._inputs.back_edges.logging_checkpoint

    @property
    def back_edges_live(self) -> frozenset[int]:
        """Back-edge channels that have not ended."""
        return self._inputs.back_edges.live

    @property
    def back_edges(self) -> BackEdgeLogger:
        return self._logger

    def _on_back_edge_event(self, channel: int, event: Barrier | CancelBarrier | None) -> bool:
        """Handle an event of a back-edge channel; False if ``channel`` is regular."""
        back = self._inputs.back_edges
        if channel not in back.channels:
            return False
        if channel not in back.live:
            raise BarrierProtocolError(
                f"{event or 'end of input'} arrived on back-edge channel {channel} after its "
                "end of input: a FIFO channel delivers nothing after end of input"
            )
        if event is None:
            back.on_end_of_input(channel)
        elif isinstance(event, Barrier):
            back.on_barrier(channel, event)
        elif back.logging_checkpoint == event.checkpoint_id:
            # Someone in the loop declined the checkpoint we are logging.
            self._inputs.abort(event.checkpoint_id, CheckpointFailureReason.DECLINED)
        return True

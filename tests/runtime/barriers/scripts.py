"""Scripted event sequences for the barrier handlers (after Flink's AlignedCheckpointsTest):
the recording task, the clock and the script runner the tests of ``runtime.barriers`` share.

A script is a table of steps ``(channel, event, blocked after, actions of this step)``,
or ``(channel, event, blocked after, logged after, actions of this step)`` where the
handler logs channels (back-edges, unaligned channel state). Step i runs at clock time
``float(i)``, so ``Trigger(n, at=i)`` says the alignment of n started at step i; the
event ``TICK`` is the task's between-batches call. After every step the runner checks
the blocked (and logged) channels and that the recorded actions so far are exactly the
concatenation of the expected ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from channels.messages import Barrier, CancelBarrier
from runtime.barriers import (
    BarrierAligner,
    BarrierHandler,
    BarrierTracker,
    CheckpointActions,
)
from runtime.control import CheckpointFailureReason

# --- recorded actions ----------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    channel: int


@dataclass(frozen=True)
class UnblockAll:
    pass


@dataclass(frozen=True)
class Trigger:
    checkpoint_id: int
    at: float
    final: bool = False


@dataclass(frozen=True)
class Abort:
    checkpoint_id: int
    reason: CheckpointFailureReason


@dataclass(frozen=True)
class EndOfAllInputs:
    pass


@dataclass(frozen=True)
class BackEdgesLogged:
    checkpoint_id: int


@dataclass(frozen=True)
class ChannelStateLogged:
    checkpoint_id: int


Action = (
    Block | UnblockAll | Trigger | Abort | EndOfAllInputs | BackEdgesLogged | ChannelStateLogged
)


@dataclass
class RecordingActions:
    """A task that records what the handler asks of it."""

    calls: list[Action] = field(default_factory=list)

    def block(self, channel: int) -> None:
        self.calls.append(Block(channel))

    def unblock_all(self) -> None:
        self.calls.append(UnblockAll())

    def trigger_checkpoint(self, barrier: Barrier, alignment_started_at: float) -> None:
        self.calls.append(Trigger(barrier.checkpoint_id, alignment_started_at, barrier.final))

    def abort_checkpoint(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        self.calls.append(Abort(checkpoint_id, reason))

    def end_of_all_inputs(self) -> None:
        self.calls.append(EndOfAllInputs())

    def back_edges_logged(self, checkpoint_id: int) -> None:
        self.calls.append(BackEdgesLogged(checkpoint_id))

    def channel_state_logged(self, checkpoint_id: int) -> None:
        self.calls.append(ChannelStateLogged(checkpoint_id))


_: type[CheckpointActions] = RecordingActions  # the fake satisfies the protocol (mypy)


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


# --- scripts -------------------------------------------------------------------------

EOI = "EOI"
TICK = "TICK"
Event = Barrier | CancelBarrier | str | tuple[str, int, CheckpointFailureReason]
Step = tuple[int | None, Event, set[int], list[Action]]
LoggedStep = tuple[int | None, Event, set[int], set[int], list[Action]]
H = TypeVar("H", bound=BarrierHandler)
HandlerFactory = Callable[[Iterable[int], CheckpointActions, Callable[[], float]], BarrierHandler]


def barrier(checkpoint_id: int, final: bool = False) -> Barrier:
    return Barrier(checkpoint_id, timestamp=1_000.0 + checkpoint_id, final=final)


def cancel(checkpoint_id: int) -> CancelBarrier:
    return CancelBarrier(checkpoint_id)


def abort(
    checkpoint_id: int, reason: CheckpointFailureReason = CheckpointFailureReason.EXPIRED
) -> Event:
    return ("ABORT", checkpoint_id, reason)


def feed(handler: BarrierHandler, channel: int | None, event: Event) -> None:
    if isinstance(event, Barrier):
        assert channel is not None
        handler.on_barrier(channel, event)
    elif isinstance(event, CancelBarrier):
        assert channel is not None
        handler.on_cancel(channel, event)
    elif event == EOI:
        assert channel is not None
        handler.on_end_of_input(channel)
    else:
        assert isinstance(event, tuple) and event[0] == "ABORT"
        handler.abort(event[1], event[2])


def run_steps(
    make: Callable[[RecordingActions, FakeClock], H], steps: Sequence[Step | LoggedStep]
) -> tuple[H, RecordingActions]:
    """Run ``steps`` on the handler ``make(actions, clock)`` builds, checking each step."""
    actions, clock = RecordingActions(), FakeClock()
    handler = make(actions, clock)
    expected: list[Action] = []
    for index, (channel, event, blocked, *logged, new_actions) in enumerate(steps):
        clock.now = float(index)
        if event == TICK:
            handler.tick()
        else:
            feed(handler, channel, event)
        expected += new_actions
        where = f"after step {index} ({channel}, {event})"
        assert actions.calls == expected, where
        assert handler.blocked_channels == frozenset(blocked), where
        if logged:
            assert handler.logging_channels == frozenset(logged[0]), where
    return handler, actions


def run_script(
    factory: HandlerFactory, channels: Sequence[int], steps: Sequence[Step]
) -> tuple[BarrierHandler, RecordingActions]:
    return run_steps(lambda actions, clock: factory(channels, actions, clock), steps)


def aligner(
    channels: Iterable[int], actions: CheckpointActions, clock: Callable[[], float]
) -> BarrierAligner:
    return BarrierAligner(channels, actions, clock)


def tracker(
    channels: Iterable[int], actions: CheckpointActions, clock: Callable[[], float]
) -> BarrierTracker:
    return BarrierTracker(channels, actions, clock)


SUBSUMED, DECLINED, EXPIRED = (
    CheckpointFailureReason.SUBSUMED,
    CheckpointFailureReason.DECLINED,
    CheckpointFailureReason.EXPIRED,
)

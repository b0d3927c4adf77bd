"""Scripted event sequences for the barrier handlers (after Flink's AlignedCheckpointsTest).

A script is a table of steps ``(channel, event, blocked after, actions of this step)``.
Step i runs at clock time ``float(i)``, so ``Trigger(n, at=i)`` says the
alignment of n started at step i. After every step the runner checks the
blocked channels and that the recorded actions so far are exactly the
concatenation of the expected ones.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import pytest

from channels.messages import Barrier, CancelBarrier
from runtime.barriers import (
    NO_CHECKPOINT,
    AlignerState,
    Aligning,
    BarrierAligner,
    BarrierHandler,
    BarrierProtocolError,
    BarrierTracker,
    CheckpointActions,
    WaitingForBarrier,
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
Event = Barrier | CancelBarrier | str | tuple[str, int, CheckpointFailureReason]
Step = tuple[int | None, Event, set[int], list[Action]]
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


def run_script(
    factory: HandlerFactory, channels: Sequence[int], steps: Sequence[Step]
) -> tuple[BarrierHandler, RecordingActions]:
    actions, clock = RecordingActions(), FakeClock()
    handler = factory(channels, actions, clock)
    expected: list[Action] = []
    for index, (channel, event, blocked, new_actions) in enumerate(steps):
        clock.now = float(index)
        feed(handler, channel, event)
        expected += new_actions
        where = f"after step {index} ({channel}, {event})"
        assert actions.calls == expected, where
        assert handler.blocked_channels == frozenset(blocked), where
    return handler, actions


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

# --- aligner: alignment --------------------------------------------------------------


@pytest.mark.parametrize("order", list(itertools.permutations([0, 1, 2])))
def test_every_barrier_order_triggers_once_after_the_last(order: tuple[int, int, int]) -> None:
    first, second, last = order
    steps: list[Step] = [
        (first, barrier(1), {first}, [Block(first)]),
        (second, barrier(1), {first, second}, [Block(second)]),
        # Every other channel is blocked; the last barrier triggers at once, unblocked.
        (last, barrier(1), set(), [Trigger(1, at=0.0), UnblockAll()]),
    ]
    handler, _ = run_script(aligner, [0, 1, 2], steps)
    assert handler.latest_checkpoint_id == 1


def test_consecutive_checkpoints_align_independently() -> None:
    steps: list[Step] = [
        (0, barrier(1), {0}, [Block(0)]),
        (1, barrier(1), set(), [Trigger(1, at=0.0), UnblockAll()]),
        (1, barrier(2), {1}, [Block(1)]),
        (0, barrier(2), set(), [Trigger(2, at=2.0), UnblockAll()]),
    ]
    run_script(aligner, [0, 1], steps)


def test_state_is_one_explicit_object() -> None:
    handler = BarrierAligner([0, 1], RecordingActions(), FakeClock(now=7.0))
    assert handler.latest_checkpoint_id == NO_CHECKPOINT
    states: list[AlignerState] = [handler.state]
    handler.on_barrier(1, barrier(3))
    states.append(handler.state)
    handler.on_barrier(0, barrier(3))
    states.append(handler.state)
    assert states == [
        WaitingForBarrier(),
        Aligning(barrier(3), started_at=7.0, blocked=frozenset({1})),
        WaitingForBarrier(),
    ]
    assert handler.latest_checkpoint_id == 3


def test_single_input_triggers_on_first_barrier_without_blocking() -> None:
    steps: list[Step] = [
        (0, barrier(1), set(), [Trigger(1, at=0.0)]),
        (0, barrier(2), set(), [Trigger(2, at=1.0)]),
        (0, EOI, set(), [EndOfAllInputs()]),
    ]
    run_script(aligner, [0], steps)


def test_single_live_input_left_after_others_ended_triggers_without_blocking() -> None:
    steps: list[Step] = [
        (1, EOI, set(), []),
        (0, barrier(1), set(), [Trigger(1, at=1.0)]),
    ]
    run_script(aligner, [0, 1], steps)


def test_alignment_start_is_clock_at_first_barrier() -> None:
    actions, clock = RecordingActions(), FakeClock(now=100.0)
    handler = BarrierAligner([0, 1, 2], actions, clock)
    handler.on_barrier(2, barrier(1))
    clock.now = 105.0
    handler.on_barrier(0, barrier(1))
    clock.now = 112.5
    handler.on_barrier(1, barrier(1))
    assert actions.calls == [Block(2), Block(0), Trigger(1, at=100.0), UnblockAll()]


def test_final_barrier_is_aligned_like_any_other() -> None:
    steps: list[Step] = [
        (0, barrier(4, final=True), {0}, [Block(0)]),
        (1, barrier(4, final=True), set(), [Trigger(4, at=0.0, final=True), UnblockAll()]),
        (0, EOI, set(), []),
        (1, EOI, set(), [EndOfAllInputs()]),
    ]
    run_script(aligner, [0, 1], steps)


# --- aligner: ended inputs -----------------------------------------------------------


def test_input_ended_before_alignment_is_not_waited_for() -> None:
    steps: list[Step] = [
        (2, EOI, set(), []),
        (0, barrier(1), {0}, [Block(0)]),
        (1, barrier(1), set(), [Trigger(1, at=1.0), UnblockAll()]),
    ]
    handler, _ = run_script(aligner, [0, 1, 2], steps)
    assert handler.live_channels == {0, 1}


def test_input_ending_during_alignment_completes_it() -> None:
    steps: list[Step] = [
        (0, barrier(1), {0}, [Block(0)]),
        (1, barrier(1), {0, 1}, [Block(1)]),
        (2, EOI, set(), [Trigger(1, at=0.0), UnblockAll()]),
    ]
    run_script(aligner, [0, 1, 2], steps)


def test_input_ending_during_alignment_leaves_others_to_wait_for() -> None:
    steps: list[Step] = [
        (0, barrier(1), {0}, [Block(0)]),
        (1, EOI, {0}, []),
        (2, barrier(1), set(), [Trigger(1, at=0.0), UnblockAll()]),
        (2, barrier(2), {2}, [Block(2)]),  # channel 1 has ended: never blocked again
        (0, barrier(2), set(), [Trigger(2, at=3.0), UnblockAll()]),
    ]
    run_script(aligner, [0, 1, 2], steps)


def test_end_of_all_inputs_is_signalled_once_after_the_last() -> None:
    steps: list[Step] = [
        (0, barrier(1), {0}, [Block(0)]),
        (1, barrier(1), set(), [Trigger(1, at=0.0), UnblockAll()]),
        (1, EOI, set(), []),
        (0, EOI, set(), [EndOfAllInputs()]),
    ]
    handler, _ = run_script(aligner, [0, 1], steps)
    assert handler.live_channels == frozenset()


# --- aligner: cancel, subsumption, stale barriers, control-plane abort ---------------


def test_cancel_while_aligning_declines_and_unblocks() -> None:
    steps: list[Step] = [
        (0, barrier(1), {0}, [Block(0)]),
        (1, cancel(1), set(), [Abort(1, DECLINED), UnblockAll()]),
        (2, barrier(1), set(), []),  # the declined checkpoint's late barrier
        (0, barrier(2), {0}, [Block(0)]),
        (1, barrier(2), {0, 1}, [Block(1)]),
        (2, barrier(2), set(), [Trigger(2, at=3.0), UnblockAll()]),
    ]
    handler, _ = run_script(aligner, [0, 1, 2], steps)
    assert handler.latest_checkpoint_id == 2


def test_cancel_while_idle_declines_once_and_ignores_its_barriers() -> None:
    steps: list[Step] = [
        (0, cancel(1), set(), [Abort(1, DECLINED)]),
        (1, barrier(1), set(), []),
        (2, cancel(1), set(), []),
        (2, barrier(1), set(), []),
    ]
    handler, _ = run_script(aligner, [0, 1, 2], steps)
    assert handler.latest_checkpoint_id == 1


def test_cancel_of_newer_checkpoint_subsumes_the_alignment() -> None:
    # Channel 1 cancels 2 without having delivered barrier 1: 1 can never align.
    steps: list[Step] = [
        (0, barrier(1), {0}, [Block(0)]),
        (1, cancel(2), set(), [Abort(1, SUBSUMED), UnblockAll(), Abort(2, DECLINED)]),
    ]
    handler, _ = run_script(aligner, [0, 1], steps)
    assert handler.latest_checkpoint_id == 2


def test_stale_cancel_is_ignored() -> None:
    steps: list[Step] = [
        (0, barrier(2), {0}, [Block(0)]),
        (1, cancel(1), {0}, []),
        (1, barrier(2), set(), [Trigger(2, at=0.0), UnblockAll()]),
        (0, cancel(2), set(), []),
    ]
    run_script(aligner, [0, 1], steps)


def test_newer_barrier_subsumes_the_alignment() -> None:
    steps: list[Step] = [
        (0, barrier(1), {0}, [Block(0)]),
        (1, barrier(1), {0, 1}, [Block(1)]),
        (2, barrier(2), {2}, [Abort(1, SUBSUMED), UnblockAll(), Block(2)]),
        (0, barrier(2), {0, 2}, [Block(0)]),
        (1, barrier(2), set(), [Trigger(2, at=2.0), UnblockAll()]),
    ]
    handler, _ = run_script(aligner, [0, 1, 2], steps)
    assert handler.latest_checkpoint_id == 2


def test_stale_barriers_are_ignored() -> None:
    steps: list[Step] = [
        (0, barrier(2), {0}, [Block(0)]),
        (1, barrier(1), {0}, []),  # older than the one aligning: channel 0 skipped it
        (1, barrier(2), set(), [Trigger(2, at=0.0), UnblockAll()]),
        (0, cancel(5), set(), [Abort(5, DECLINED)]),
        (1, barrier(3), set(), []),  # older than the aborted 5
        (1, barrier(5), set(), []),  # of the aborted 5
        (1, barrier(6), {1}, [Block(1)]),
    ]
    run_script(aligner, [0, 1], steps)


def test_control_plane_abort_while_aligning() -> None:
    steps: list[Step] = [
        (0, barrier(1), {0}, [Block(0)]),
        (1, barrier(1), {0, 1}, [Block(1)]),
        (None, abort(1, EXPIRED), set(), [Abort(1, EXPIRED), UnblockAll()]),
        (2, barrier(1), set(), []),
        (None, abort(1, EXPIRED), set(), []),  # twice: ignored
    ]
    handler, _ = run_script(aligner, [0, 1, 2], steps)
    assert handler.latest_checkpoint_id == 1
    assert isinstance(handler, BarrierAligner)
    assert isinstance(handler.state, WaitingForBarrier)


def test_control_plane_abort_while_idle_ignores_its_barriers_later() -> None:
    steps: list[Step] = [
        (
            None,
            abort(3, CheckpointFailureReason.TASK_FAILURE),
            set(),
            [Abort(3, CheckpointFailureReason.TASK_FAILURE)],
        ),
        (0, barrier(3), set(), []),
        (1, barrier(3), set(), []),
        (0, barrier(4), {0}, [Block(0)]),
    ]
    run_script(aligner, [0, 1], steps)


def test_control_plane_abort_of_another_checkpoint_leaves_the_alignment() -> None:
    steps: list[Step] = [
        (None, abort(2), set(), [Abort(2, EXPIRED)]),
        (0, barrier(4), {0}, [Block(0)]),
        (None, abort(1), {0}, []),  # already finished here
        (None, abort(3), {0}, []),  # older than the one aligning: never started here
        (None, abort(5), {0}, []),  # newer: 4 can still complete
        (1, barrier(4), set(), [Trigger(4, at=1.0), UnblockAll()]),
    ]
    run_script(aligner, [0, 1], steps)


# --- aligner: protocol violations ----------------------------------------------------


def test_second_barrier_on_a_blocked_channel_is_a_protocol_error() -> None:
    handler = BarrierAligner([0, 1], RecordingActions(), FakeClock())
    handler.on_barrier(0, barrier(1))
    with pytest.raises(BarrierProtocolError, match="channel 0, which is blocked for checkpoint 1"):
        handler.on_barrier(0, barrier(1))
    with pytest.raises(BarrierProtocolError, match="blocked"):
        handler.on_barrier(0, barrier(2))
    with pytest.raises(BarrierProtocolError, match="blocked"):
        handler.on_end_of_input(0)


@pytest.mark.parametrize("factory", [aligner, tracker])
def test_events_on_ended_or_unknown_channels_are_protocol_errors(
    factory: HandlerFactory,
) -> None:
    handler = factory([0, 1], RecordingActions(), FakeClock())
    handler.on_end_of_input(1)
    with pytest.raises(BarrierProtocolError, match="after its end of input"):
        handler.on_barrier(1, barrier(1))
    with pytest.raises(BarrierProtocolError, match="after its end of input"):
        handler.on_cancel(1, cancel(1))
    with pytest.raises(BarrierProtocolError, match="after its end of input"):
        handler.on_end_of_input(1)
    with pytest.raises(BarrierProtocolError, match=r"unknown channel 7.*\[0, 1\]"):
        handler.on_barrier(7, barrier(1))


@pytest.mark.parametrize("factory", [aligner, tracker])
def test_handler_needs_distinct_input_channels(factory: HandlerFactory) -> None:
    with pytest.raises(BarrierProtocolError, match="at least one regular input channel"):
        factory([], RecordingActions(), FakeClock())
    with pytest.raises(BarrierProtocolError, match="distinct"):
        factory([0, 0], RecordingActions(), FakeClock())


# --- tracker (at-least-once) ---------------------------------------------------------


@pytest.mark.parametrize("order", list(itertools.permutations([0, 1, 2])))
def test_tracker_never_blocks_and_triggers_once_after_the_last(
    order: tuple[int, int, int],
) -> None:
    first, second, last = order
    steps: list[Step] = [
        (first, barrier(1), set(), []),
        (second, barrier(1), set(), []),
        (last, barrier(1), set(), [Trigger(1, at=0.0)]),
    ]
    handler, _ = run_script(tracker, [0, 1, 2], steps)
    assert handler.latest_checkpoint_id == 1


def test_tracker_keeps_several_checkpoints_pending() -> None:
    steps: list[Step] = [
        (0, barrier(1), set(), []),
        (0, barrier(2), set(), []),
        (1, barrier(1), set(), [Trigger(1, at=0.0)]),
        (1, barrier(2), set(), [Trigger(2, at=1.0)]),
    ]
    run_script(tracker, [0, 1], steps)


def test_tracker_trigger_subsumes_older_pending_checkpoints() -> None:
    # Channels 1 and 2 skipped checkpoint 1 (their upstream never emitted it).
    steps: list[Step] = [
        (0, barrier(1), set(), []),
        (0, barrier(2), set(), []),
        (1, barrier(2), set(), []),
        (2, barrier(2), set(), [Abort(1, SUBSUMED), Trigger(2, at=1.0)]),
    ]
    handler, _ = run_script(tracker, [0, 1, 2], steps)
    assert isinstance(handler, BarrierTracker)
    assert dict(handler.pending_checkpoints) == {}


def test_tracker_ignores_barrier_of_a_checkpoint_a_channel_skipped() -> None:
    steps: list[Step] = [
        (0, barrier(2), set(), []),
        (1, barrier(1), set(), []),  # 1 can never complete: channel 0 passed it
        (1, barrier(2), set(), [Trigger(2, at=0.0)]),
    ]
    run_script(tracker, [0, 1], steps)


def test_tracker_cancel_drops_the_pending_checkpoint() -> None:
    steps: list[Step] = [
        (0, barrier(1), set(), []),
        (1, cancel(1), set(), [Abort(1, DECLINED)]),
        (2, barrier(1), set(), []),
        (1, cancel(2), set(), [Abort(2, DECLINED)]),  # not seen yet: declined once
        (0, barrier(2), set(), []),
        (2, cancel(2), set(), []),
    ]
    handler, _ = run_script(tracker, [0, 1, 2], steps)
    assert handler.latest_checkpoint_id == 2


def test_tracker_control_plane_abort() -> None:
    steps: list[Step] = [
        (0, barrier(1), set(), []),
        (0, barrier(2), set(), []),
        (None, abort(2), set(), [Abort(1, SUBSUMED), Abort(2, EXPIRED)]),
        (1, barrier(1), set(), []),
        (1, barrier(2), set(), []),
        (None, abort(2), set(), []),
    ]
    run_script(tracker, [0, 1], steps)


def test_tracker_counts_ended_inputs_as_arrived() -> None:
    steps: list[Step] = [
        (0, barrier(1), set(), []),
        (0, barrier(2), set(), []),
        (1, barrier(1), set(), []),
        (2, EOI, set(), [Trigger(1, at=0.0)]),
        (1, EOI, set(), [Trigger(2, at=1.0)]),
        (0, EOI, set(), [EndOfAllInputs()]),
    ]
    handler, _ = run_script(tracker, [0, 1, 2], steps)
    assert handler.live_channels == frozenset()


def test_tracker_duplicate_barrier_is_a_protocol_error() -> None:
    handler = BarrierTracker([0, 1], RecordingActions(), FakeClock())
    handler.on_barrier(0, barrier(1))
    with pytest.raises(BarrierProtocolError, match="twice on channel 0"):
        handler.on_barrier(0, barrier(1))


# --- the checks can fail -------------------------------------------------------------


def test_alignment_script_catches_a_handler_that_does_not_block() -> None:
    steps: list[Step] = [
        (0, barrier(1), {0}, [Block(0)]),
        (1, barrier(1), set(), [Trigger(1, at=0.0), UnblockAll()]),
    ]
    run_script(aligner, [0, 1], steps)
    with pytest.raises(AssertionError, match="after step 0"):
        run_script(tracker, [0, 1], steps)


def test_abort_reasons_have_distinct_messages() -> None:
    messages = [reason.message for reason in CheckpointFailureReason]
    assert len(set(messages)) == len(messages)
    assert all(message for message in messages)

"""`BarrierAligner` (exactly-once ABS alignment) driven by scripted event tables (see `scripts`)."""

from __future__ import annotations

import itertools

import pytest

from runtime.barriers import (
    NO_CHECKPOINT,
    AlignerState,
    Aligning,
    BarrierAligner,
    BarrierProtocolError,
    WaitingForBarrier,
)
from runtime.control import CheckpointFailureReason
from tests.runtime.barriers.scripts import (
    DECLINED,
    EOI,
    EXPIRED,
    SUBSUMED,
    Abort,
    Block,
    EndOfAllInputs,
    FakeClock,
    RecordingActions,
    Step,
    Trigger,
    UnblockAll,
    abort,
    aligner,
    barrier,
    cancel,
    run_script,
    tracker,
)


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


def test_second_barrier_on_a_blocked_channel_is_a_protocol_error() -> None:
    handler = BarrierAligner([0, 1], RecordingActions(), FakeClock())
    handler.on_barrier(0, barrier(1))
    with pytest.raises(BarrierProtocolError, match="channel 0, which is blocked for checkpoint 1"):
        handler.on_barrier(0, barrier(1))
    with pytest.raises(BarrierProtocolError, match="blocked"):
        handler.on_barrier(0, barrier(2))
    with pytest.raises(BarrierProtocolError, match="blocked"):
        handler.on_end_of_input(0)


def test_alignment_script_catches_a_handler_that_does_not_block() -> None:
    steps: list[Step] = [
        (0, barrier(1), {0}, [Block(0)]),
        (1, barrier(1), set(), [Trigger(1, at=0.0), UnblockAll()]),
    ]
    run_script(aligner, [0, 1], steps)
    with pytest.raises(AssertionError, match="after step 0"):
        run_script(tracker, [0, 1], steps)

"""`BarrierTracker` (at-least-once: the bookkeeping without blocking) driven by scripted event tables."""

from __future__ import annotations

import itertools

import pytest

from runtime.barriers import (
    BarrierProtocolError,
    BarrierTracker,
)
from tests.runtime.barriers.scripts import (
    DECLINED,
    EOI,
    EXPIRED,
    SUBSUMED,
    Abort,
    EndOfAllInputs,
    FakeClock,
    RecordingActions,
    Step,
    Trigger,
    abort,
    barrier,
    cancel,
    run_script,
    tracker,
)


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

"""The unaligned barrier handler (Chandy-Lamport) and aligned checkpoints with a timeout,
driven by scripted event tables: each step is (channel, event, blocked channels after it,
channels being logged as channel state after it, actions it causes). Step i runs at clock
time ``float(i)``; ``TICK`` is the task's between-batches call."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from runtime.barriers import BarrierProtocolError, Idle, Recording, UnalignedHandler
from tests.runtime.barriers.scripts import (
    DECLINED,
    EOI,
    EXPIRED,
    SUBSUMED,
    TICK,
    Abort,
    Block,
    ChannelStateLogged,
    EndOfAllInputs,
    FakeClock,
    LoggedStep,
    RecordingActions,
    Trigger,
    UnblockAll,
    abort,
    barrier,
    cancel,
    run_steps,
)

Step = LoggedStep


def run(
    channels: Sequence[int], steps: Sequence[Step], timeout: float | None = None
) -> UnalignedHandler:
    def make(actions: RecordingActions, clock: FakeClock) -> UnalignedHandler:
        return UnalignedHandler(channels, actions, clock, aligned_timeout=timeout)

    return run_steps(make, steps)[0]


# --- unaligned ----------------------------------------------------------------------------


def test_the_first_barrier_snapshots_at_once_and_the_others_are_logged_until_theirs() -> None:
    handler = run(
        [0, 1, 2],
        [
            (1, barrier(1), set(), {0, 2}, [Trigger(1, at=0.0)]),
            (2, barrier(1), set(), {0}, []),
            (0, barrier(1), set(), set(), [ChannelStateLogged(1)]),
        ],
    )
    assert handler.latest_checkpoint_id == 1 and isinstance(handler.state, Idle)


def test_a_single_input_needs_no_channel_state() -> None:
    run([4], [(4, barrier(3), set(), set(), [Trigger(3, at=0.0), ChannelStateLogged(3)])])


def test_an_input_that_ends_has_nothing_more_in_flight() -> None:
    run(
        [0, 1],
        [
            (0, barrier(1), set(), {1}, [Trigger(1, at=0.0)]),
            (1, EOI, set(), set(), [ChannelStateLogged(1)]),
            (0, EOI, set(), set(), [EndOfAllInputs()]),
        ],
    )


def test_a_newer_barrier_subsumes_the_checkpoint_being_recorded() -> None:
    run(
        [0, 1],
        [
            (0, barrier(1), set(), {1}, [Trigger(1, at=0.0)]),
            (0, barrier(2), set(), {1}, [Abort(1, SUBSUMED), Trigger(2, at=1.0)]),
            (1, barrier(2), set(), set(), [ChannelStateLogged(2)]),
        ],
    )


def test_a_cancel_barrier_aborts_the_recording_and_stale_barriers_are_ignored() -> None:
    run(
        [0, 1],
        [
            (0, barrier(1), set(), {1}, [Trigger(1, at=0.0)]),
            (1, cancel(1), set(), set(), [Abort(1, DECLINED)]),
            (1, barrier(1), set(), set(), []),  # stale now
            (1, cancel(2), set(), set(), [Abort(2, DECLINED)]),  # not started: recorded
            (0, barrier(2), set(), set(), []),
        ],
    )


def test_a_control_plane_abort_stops_the_recording() -> None:
    run(
        [0, 1],
        [
            (1, barrier(5), set(), {0}, [Trigger(5, at=0.0)]),
            (None, abort(5), set(), set(), [Abort(5, EXPIRED)]),
            (0, barrier(5), set(), set(), []),
        ],
    )


def test_a_barrier_twice_on_one_channel_is_a_protocol_error() -> None:
    actions = RecordingActions()
    handler = UnalignedHandler([0, 1], actions, FakeClock())
    handler.on_barrier(0, barrier(1))
    assert handler.state == Recording(1, frozenset({1}))
    with pytest.raises(BarrierProtocolError, match="twice"):
        handler.on_barrier(0, barrier(1))


# --- aligned, with a timeout -------------------------------------------------------------


def test_a_fast_alignment_stays_aligned() -> None:
    run(
        [0, 1, 2],
        [
            (0, barrier(1), {0}, set(), [Block(0)]),
            (1, barrier(1), {0, 1}, set(), [Block(1)]),
            (
                2,
                barrier(1),
                set(),
                set(),
                [Trigger(1, at=0.0), UnblockAll(), ChannelStateLogged(1)],
            ),
        ],
        timeout=10.0,
    )


def test_a_slow_alignment_turns_unaligned_on_a_tick() -> None:
    handler = run(
        [0, 1, 2],
        [
            (0, barrier(1), {0}, set(), [Block(0)]),
            (None, TICK, {0}, set(), []),  # 1 s < 1.5 s
            (None, TICK, set(), {1, 2}, [Trigger(1, at=0.0), UnblockAll()]),  # 2 s: switch
            (2, barrier(1), set(), {1}, []),
            (1, barrier(1), set(), set(), [ChannelStateLogged(1)]),
        ],
        timeout=1.5,
    )
    assert handler.timed_out == 1


def test_a_zero_timeout_is_unaligned_from_the_first_barrier() -> None:
    run(
        [0, 1],
        [
            (0, barrier(1), set(), {1}, [Trigger(1, at=0.0)]),
            (1, barrier(1), set(), set(), [ChannelStateLogged(1)]),
        ],
        timeout=0.0,
    )


def test_an_aligning_checkpoint_is_subsumed_by_a_newer_barrier_and_unblocks() -> None:
    run(
        [0, 1, 2],
        [
            (0, barrier(1), {0}, set(), [Block(0)]),
            (1, barrier(2), {1}, set(), [Abort(1, SUBSUMED), UnblockAll(), Block(1)]),
            (None, abort(2, EXPIRED), set(), set(), [Abort(2, EXPIRED), UnblockAll()]),
        ],
        timeout=10.0,
    )


def test_the_end_of_the_last_unaligned_input_completes_an_aligned_checkpoint() -> None:
    run(
        [0, 1],
        [
            (0, barrier(1), {0}, set(), [Block(0)]),
            (1, EOI, set(), set(), [Trigger(1, at=0.0), UnblockAll(), ChannelStateLogged(1)]),
        ],
        timeout=10.0,
    )


def test_the_final_checkpoint_always_aligns() -> None:
    final = barrier(9, final=True)
    run(
        [0, 1],
        [
            (0, final, {0}, set(), [Block(0)]),
            (None, TICK, {0}, set(), []),
            (
                1,
                final,
                set(),
                set(),
                [Trigger(9, at=0.0, final=True), UnblockAll(), ChannelStateLogged(9)],
            ),
        ],
    )


# --- overtaking barriers (the priority path) -----------------------------------------------


def test_an_overtaking_barrier_snapshots_and_its_channel_stays_logged_until_in_band() -> None:
    actions, clock = RecordingActions(), FakeClock()
    handler = UnalignedHandler([0, 1], actions, clock)
    handler.on_priority_barrier(1, barrier(1))
    assert actions.calls == [Trigger(1, at=0.0)]
    assert handler.logging_channels == {0, 1}  # 1's records before its barrier: in flight
    handler.on_priority_barrier(1, barrier(1))  # another copy, and an older one: ignored
    handler.on_priority_barrier(0, barrier(1))
    handler.on_barrier(1, barrier(1))
    assert handler.logging_channels == {0}
    handler.on_barrier(0, barrier(1))
    assert actions.calls == [Trigger(1, at=0.0), ChannelStateLogged(1)]
    handler.on_priority_barrier(0, barrier(1))  # late copy of a finished checkpoint
    assert isinstance(handler.state, Idle) and len(actions.calls) == 2


def test_an_overtaking_barrier_after_its_in_band_copy_is_ignored() -> None:
    actions = RecordingActions()
    handler = UnalignedHandler([0, 1], actions, FakeClock())
    handler.on_barrier(0, barrier(2))
    handler.on_priority_barrier(0, barrier(2))
    assert handler.logging_channels == {1} and actions.calls == [Trigger(2, at=0.0)]


def test_a_newer_overtaking_barrier_subsumes_the_recording_one() -> None:
    actions = RecordingActions()
    handler = UnalignedHandler([0, 1], actions, FakeClock())
    handler.on_priority_barrier(0, barrier(1))
    handler.on_priority_barrier(1, barrier(2))
    assert actions.calls == [Trigger(1, at=0.0), Abort(1, SUBSUMED), Trigger(2, at=0.0)]
    assert handler.state == Recording(2, frozenset({0, 1}))
    handler.on_barrier(0, barrier(1))  # the in-band copy of the subsumed one: stale
    assert handler.logging_channels == {0, 1}


def test_final_barriers_never_overtake_and_aligned_handlers_refuse_overtaking() -> None:
    actions = RecordingActions()
    handler = UnalignedHandler([0, 1], actions, FakeClock())
    handler.on_priority_barrier(0, barrier(5, final=True))
    assert actions.calls == [] and isinstance(handler.state, Idle)
    timed = UnalignedHandler([0, 1], RecordingActions(), FakeClock(), aligned_timeout=1.0)
    with pytest.raises(BarrierProtocolError, match="only unaligned checkpoints"):
        timed.on_priority_barrier(0, barrier(1))

"""Cyclic ABS: scripted event tables for a task with back-edge inputs.

Channels 0 and 1 are regular inputs, 8 and 9 back-edges. A step is
``(channel, event, blocked after, logged after, actions of this step)``; "logged"
is the set of back-edge channels whose records the task logs after the step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pytest

from runtime.barriers import (
    BackEdgeLogger,
    BarrierAligner,
    BarrierHandler,
    BarrierProtocolError,
    BarrierTracker,
    CheckpointActions,
    LoggingBackEdges,
    NotLogging,
)
from runtime.control import CheckpointFailureReason
from tests.runtime.barriers.scripts import (
    EOI,
    Abort,
    Action,
    BackEdgesLogged,
    Block,
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

REGULAR, BACK = [0, 1], [8, 9]
SUBSUMED, DECLINED, EXPIRED = (
    CheckpointFailureReason.SUBSUMED,
    CheckpointFailureReason.DECLINED,
    CheckpointFailureReason.EXPIRED,
)
CyclicStep = LoggedStep
Factory = Callable[
    [Iterable[int], CheckpointActions, Callable[[], float], Iterable[int]], BarrierHandler
]


def aligner(
    channels: Iterable[int],
    actions: CheckpointActions,
    clock: Callable[[], float],
    back_edges: Iterable[int],
) -> BarrierHandler:
    return BarrierAligner(channels, actions, clock, back_edges=back_edges)


def tracker(
    channels: Iterable[int],
    actions: CheckpointActions,
    clock: Callable[[], float],
    back_edges: Iterable[int],
) -> BarrierHandler:
    return BarrierTracker(channels, actions, clock, back_edges=back_edges)


def run(
    factory: Factory, steps: Sequence[CyclicStep], back: Sequence[int] = BACK
) -> BarrierHandler:
    return run_steps(lambda actions, clock: factory(REGULAR, actions, clock, back), steps)[0]


def test_aligns_on_regular_inputs_then_logs_back_edges_until_the_barrier_returns() -> None:
    handler = run(
        aligner,
        [
            # Back-edge records before the checkpoint are state, not logged.
            (0, barrier(1), {0}, set(), [Block(0)]),
            (1, barrier(1), set(), {8, 9}, [Trigger(1, at=0.0), UnblockAll()]),
            # The barrier comes back around the loop: consumed, not forwarded.
            (9, barrier(1), set(), {8}, []),
            (8, barrier(1), set(), set(), [BackEdgesLogged(1)]),
        ],
    )
    assert handler.back_edges_live == frozenset(BACK) and handler.latest_checkpoint_id == 1


def test_a_barrier_back_before_the_trigger_here_is_not_waited_for() -> None:
    """A loop whose body does not align (superstep heads feeding each other): a peer that
    snapshotted first sends its barrier back before this task triggered; the log then
    waits for the other back-edge only (waiting for 9 too would never end)."""
    run(
        aligner,
        [
            (9, barrier(1), set(), set(), []),
            (0, barrier(1), {0}, set(), [Block(0)]),
            (1, barrier(1), set(), {8}, [Trigger(1, at=1.0), UnblockAll()]),
            (8, barrier(1), set(), set(), [BackEdgesLogged(1)]),
            # Early barriers of checkpoint 2 on both: its log is complete at its trigger.
            (8, barrier(2), set(), set(), []),
            (9, barrier(2), set(), set(), []),
            (0, barrier(2), {0}, set(), [Block(0)]),
            (1, barrier(2), set(), set(), [Trigger(2, at=6.0), BackEdgesLogged(2), UnblockAll()]),
        ],
    )


def test_an_early_barrier_of_an_aborted_checkpoint_is_forgotten() -> None:
    run(
        aligner,
        [
            (9, barrier(1), set(), set(), []),
            (None, abort(1, EXPIRED), set(), set(), [Abort(1, EXPIRED)]),
            (0, barrier(2), {0}, set(), [Block(0)]),
            (1, barrier(2), set(), {8, 9}, [Trigger(2, at=2.0), UnblockAll()]),
        ],
    )


def test_back_edges_are_never_blocked_and_do_not_take_part_in_alignment() -> None:
    run(
        aligner,
        [
            (0, barrier(1), {0}, set(), [Block(0)]),
            # A back-edge barrier of an older, aborted checkpoint: consumed silently.
            (8, barrier(0), {0}, set(), []),
            (1, barrier(1), set(), {8, 9}, [Trigger(1, at=0.0), UnblockAll()]),
        ],
    )


@pytest.mark.parametrize("factory", [aligner, tracker])
def test_the_tracker_and_the_aligner_log_alike(factory: Factory) -> None:
    blocked: set[int] = {0} if factory is aligner else set()
    trigger: list[Action] = [Trigger(1, at=0.0)]
    if blocked:
        trigger.append(UnblockAll())
    run(
        factory,
        [
            (0, barrier(1), blocked, set(), [Block(0)] if blocked else []),
            (1, barrier(1), set(), {8, 9}, trigger),
            (8, barrier(1), set(), {9}, []),
            (9, barrier(1), set(), set(), [BackEdgesLogged(1)]),
        ],
    )


def test_a_newer_checkpoint_subsumes_one_still_logging() -> None:
    run(
        aligner,
        [
            (0, barrier(1), {0}, set(), [Block(0)]),
            (1, barrier(1), set(), {8, 9}, [Trigger(1, at=0.0), UnblockAll()]),
            (8, barrier(1), set(), {9}, []),
            (0, barrier(2), {0}, {9}, [Block(0)]),
            (1, barrier(2), set(), {8, 9}, [Abort(1, SUBSUMED), Trigger(2, at=3.0), UnblockAll()]),
            # The late barrier of checkpoint 1 is consumed; 2 still waits for both.
            (9, barrier(1), set(), {8, 9}, []),
            (9, barrier(2), set(), {8}, []),
            (8, barrier(2), set(), set(), [BackEdgesLogged(2)]),
        ],
    )


def test_the_job_manager_aborting_a_logged_checkpoint_stops_the_log() -> None:
    handler = run(
        aligner,
        [
            (0, barrier(1), {0}, set(), [Block(0)]),
            (1, barrier(1), set(), {8, 9}, [Trigger(1, at=0.0), UnblockAll()]),
            (None, abort(1, EXPIRED), set(), set(), [Abort(1, EXPIRED)]),
            (8, barrier(1), set(), set(), []),
            (9, barrier(1), set(), set(), []),
        ],
    )
    assert isinstance(handler, BarrierAligner)
    assert isinstance(handler.back_edges.state, NotLogging)


def test_a_cancel_coming_around_the_loop_declines_the_logged_checkpoint() -> None:
    run(
        tracker,
        [
            (0, barrier(1), set(), set(), []),
            (1, barrier(1), set(), {8, 9}, [Trigger(1, at=0.0)]),
            (9, cancel(1), set(), set(), [Abort(1, DECLINED)]),
            (8, barrier(1), set(), set(), []),
        ],
    )


def test_an_ended_back_edge_counts_as_returned() -> None:
    handler = run(
        aligner,
        [
            (0, barrier(1), {0}, set(), [Block(0)]),
            (1, barrier(1), set(), {8, 9}, [Trigger(1, at=0.0), UnblockAll()]),
            (8, barrier(1), set(), {9}, []),
            (9, EOI, set(), set(), [BackEdgesLogged(1)]),
        ],
    )
    assert handler.back_edges_live == frozenset({8})


def test_regular_inputs_end_first_then_the_back_edges_come_around() -> None:
    handler = run(
        aligner,
        [
            (0, barrier(5, final=True), {0}, set(), [Block(0)]),
            (
                1,
                barrier(5, final=True),
                set(),
                {8, 9},
                [Trigger(5, at=0.0, final=True), UnblockAll()],
            ),
            (0, EOI, set(), {8, 9}, []),
            # Every regular input ended: the task forwards its end of input into the loop.
            (1, EOI, set(), {8, 9}, [EndOfAllInputs()]),
            (8, barrier(5, final=True), set(), {9}, []),
            (9, barrier(5, final=True), set(), set(), [BackEdgesLogged(5)]),
            (8, EOI, set(), set(), []),
            (9, EOI, set(), set(), []),
        ],
    )
    assert handler.back_edges_live == frozenset() and handler.live_channels == frozenset()


def test_a_task_whose_back_edges_all_ended_completes_its_log_at_once() -> None:
    run(
        aligner,
        [
            (8, EOI, set(), set(), []),
            (9, EOI, set(), set(), []),
            (0, barrier(1), {0}, set(), [Block(0)]),
            (1, barrier(1), set(), set(), [Trigger(1, at=2.0), BackEdgesLogged(1), UnblockAll()]),
        ],
    )


def test_protocol_violations_on_back_edges_raise() -> None:
    handler = run(
        aligner,
        [
            (0, barrier(1), {0}, set(), [Block(0)]),
            (1, barrier(1), set(), {8, 9}, [Trigger(1, at=0.0), UnblockAll()]),
            (8, barrier(1), set(), {9}, []),
        ],
    )
    with pytest.raises(BarrierProtocolError, match="came back twice on back-edge channel 8"):
        handler.on_barrier(8, barrier(1))
    with pytest.raises(BarrierProtocolError, match="this task never forwarded it"):
        handler.on_barrier(9, barrier(2))
    handler.on_end_of_input(9)
    with pytest.raises(BarrierProtocolError, match="after its end of input"):
        handler.on_barrier(9, barrier(3))


def test_logger_states_are_explicit() -> None:
    logger = BackEdgeLogger([8, 9], RecordingActions())
    assert logger.state == NotLogging() and logger.logging_checkpoint is None
    logger.start(4)
    state: object = logger.state
    assert state == LoggingBackEdges(4, frozenset({8, 9}))
    logger.stop(3)  # not ours
    assert logger.logging_checkpoint == 4
    logger.stop(4)
    assert logger.state == NotLogging()


def test_back_edge_and_regular_channels_must_differ() -> None:
    with pytest.raises(BarrierProtocolError, match="distinct"):
        BarrierAligner([0, 1], RecordingActions(), FakeClock(), back_edges=[1])

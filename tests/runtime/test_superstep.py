"""The loop head's side of superstep checkpoints (``runtime.superstep.SuperstepHead``)
against fakes: a tail checkpoint's barrier is held until the head's own update ended, a
head checkpoint's Go waits for the snapshot. Each scripted case records what the head
did in order: its messages out, barriers handed to the barrier handler (with the
superstep whose update the state holds then), and its reports."""

from __future__ import annotations

from typing import Any

from channels.messages import Barrier, SuperstepMarker
from runtime import control as P
from runtime.superstep import SuperstepHead

FEEDBACK = [4, 5]


class FakeOperator:
    """Its state is the number of updates it ran."""

    name = "step"

    def __init__(self) -> None:
        self.updates = 0

    def check_loaded(self) -> None:
        pass

    def start(self) -> tuple[list[tuple[Any, Any]], float]:
        return [(0, 1)], 0.0

    def end(self, total: float) -> tuple[float, int, int]:
        self.updates += 1
        return 0.0, 1, 1


class FakeOutputs:
    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def emit_to(self, edge: int, records: list[Any]) -> None:
        self.events.append(("messages", len(records)))

    def send_event_on(self, edge: int, event: Any) -> None:
        pass

    def flush(self) -> None:
        pass


class Handler:
    """The barrier handler: takes the snapshot at once (one regular input)."""

    def __init__(self, op: FakeOperator, events: list[Any]) -> None:
        self.op, self.events, self.latest = op, events, 0

    def deliver(self, channel: int, barrier: Barrier) -> None:
        self.latest = max(self.latest, barrier.checkpoint_id)
        self.events.append(("snapshot", barrier.checkpoint_id, self.op.updates))


def head() -> tuple[SuperstepHead, list[Any]]:
    events: list[Any] = []
    op = FakeOperator()
    handler = Handler(op, events)

    def send(msg: P.Message) -> None:
        if isinstance(msg, P.SuperstepDone):
            events.append(("done", msg.superstep))

    h = SuperstepHead(
        op,  # type: ignore[arg-type]
        0,
        0,
        FakeOutputs(events),  # type: ignore[arg-type]
        0,
        1,
        FEEDBACK,
        send,
        handler.deliver,
        lambda: handler.latest,
    )
    return h, events


def markers(h: SuperstepHead, k: int) -> None:
    for channel in FEEDBACK:
        h.on_marker(channel, SuperstepMarker(k, 0.0))


def test_a_tail_barrier_that_comes_mid_superstep_is_held_until_the_update() -> None:
    h, events = head()
    h.on_go(P.SuperstepGo(1, snapshot_after=7))
    h.on_barrier(0, Barrier(7, 0.0))  # superstep 1 still collects: not the state after 1
    assert events == [("messages", 1)] and len(h.held) == 1
    markers(h, 1)
    # snapshot of the state after update 1, before the head reports the superstep done
    assert events == [("messages", 1), ("snapshot", 7, 1), ("done", 1)] and not h.held


def test_a_tail_barrier_after_the_update_and_other_barriers_pass_at_once() -> None:
    h, events = head()
    h.on_barrier(0, Barrier(3, 0.0))  # not announced (blocking, final): the handler's
    h.on_go(P.SuperstepGo(1, snapshot_after=7))
    markers(h, 1)
    h.on_barrier(0, Barrier(7, 0.0))
    assert events == [("snapshot", 3, 0), ("messages", 1), ("done", 1), ("snapshot", 7, 1)]


def test_a_head_checkpoint_go_waits_for_the_snapshot() -> None:
    """Go(2, snapshot_before=7) before barrier 7: superstep 2's messages go out only after
    the snapshot (its barrier precedes them on every feedback channel)."""
    h, events = head()
    h.on_go(P.SuperstepGo(1))
    markers(h, 1)
    h.on_go(P.SuperstepGo(2, snapshot_before=7))
    assert events == [("messages", 1), ("done", 1)] and h.deferred is not None
    h.on_barrier(0, Barrier(7, 0.0))
    assert events[2:] == [("snapshot", 7, 1), ("messages", 1)] and h.deferred is None


def test_a_head_checkpoint_go_after_the_snapshot_starts_at_once() -> None:
    h, events = head()
    h.on_go(P.SuperstepGo(1))
    markers(h, 1)
    h.on_barrier(0, Barrier(7, 0.0))
    h.on_go(P.SuperstepGo(2, snapshot_before=7))
    assert events[2:] == [("snapshot", 7, 1), ("messages", 1)]


def test_an_aborted_checkpoint_releases_a_waiting_go_and_drops_a_held_barrier() -> None:
    h, events = head()
    h.on_go(P.SuperstepGo(1))
    markers(h, 1)
    h.on_go(P.SuperstepGo(2, snapshot_before=7))
    h.aborted(7)
    assert events[-1] == ("messages", 1) and h.deferred is None
    h2, _ = head()
    h2.on_go(P.SuperstepGo(1, snapshot_after=8))
    h2.on_barrier(0, Barrier(8, 0.0))
    h2.aborted(8)
    assert h2.held == []

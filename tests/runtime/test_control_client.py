"""The task's control client: what it queues, what it acts on at once (Cancel, KillSelf),
and its heartbeat timeout; on a fake socket, with a fake clock and a fake self-kill."""

from __future__ import annotations

import signal
from collections import deque

import pytest

from runtime import control as P
from runtime.control_client import ControlClient
from runtime.errors import TaskCancelled
from statebackend.metrics import TaskMetrics


class FakeSocket:
    def __init__(self) -> None:
        self.inbox: deque[bytes] = deque()
        self.sent: list[P.Message] = []

    def tell(self, *msgs: P.Message) -> None:
        self.inbox.extend(P.encode(m) for m in msgs)

    def send(self, data: bytes, /) -> None:
        self.sent.append(P.decode(data))

    def recv(self) -> bytes:
        return self.inbox.popleft()

    def poll(self, timeout: int, /) -> int:
        return len(self.inbox)

    def close(self, linger: int | None = None) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def client() -> tuple[ControlClient, FakeSocket, list[int], Clock]:
    sock, signals, clock = FakeSocket(), list[int](), Clock()
    c = ControlClient(lambda: sock, 0.5, 3.0, clock=clock, kill=signals.append)
    c.open()
    return c, sock, signals, clock


def test_messages_are_queued_until_taken_in_order() -> None:
    c, sock, signals, _ = client()
    sock.tell(P.Trigger(1, 0.0, False), P.Alive(), P.Complete(1))
    c.read()
    assert c.has_messages()
    assert list(c.take()) == [P.Trigger(1, 0.0, False), P.Complete(1)]
    assert not c.has_messages() and signals == []


def test_one_kind_is_taken_out_of_order_and_the_rest_stays_in_order() -> None:
    """A loop head serves a Rescue inside a blocked send (``Task._rescue_now``)."""
    c, sock, _, _ = client()
    sock.tell(P.Complete(1), P.Rescue(9), P.Trigger(2, 0.0, False))
    assert c.take_of(P.Rescue) == [P.Rescue(9)]
    assert c.take_of(P.Rescue) == []
    assert list(c.take()) == [P.Complete(1), P.Trigger(2, 0.0, False)]


def test_kill_self_is_obeyed_the_moment_it_is_read() -> None:
    c, sock, signals, _ = client()
    sock.tell(P.Trigger(1, 0.0, False), P.KillSelf(signal.SIGKILL, "Kill('x[0]')"))
    c.read()  # as inside a blocked send: nothing is acted on, except the kill
    assert signals == [signal.SIGKILL]
    assert list(c.take()) == [P.Trigger(1, 0.0, False)]  # the kill is not queued


def test_cancel_ends_the_task_at_once() -> None:
    c, sock, _, _ = client()
    sock.tell(P.Cancel("attempt 0 failed"))
    with pytest.raises(TaskCancelled, match="attempt 0 failed"):
        c.read()


def test_a_silent_job_manager_ends_the_task() -> None:
    c, sock, _, clock = client()
    beat = P.Heartbeat(0, 0, TaskMetrics())
    c.heartbeat(clock.now, lambda: beat)
    sock.tell(P.Alive())
    c.read()
    clock.now += 2.0
    c.heartbeat(clock.now, lambda: beat)  # answered 2 s ago: fine
    clock.now += 1.5
    with pytest.raises(TaskCancelled, match="stopped answering"):
        c.heartbeat(clock.now, lambda: beat)
    assert sock.sent == [beat, beat, beat]

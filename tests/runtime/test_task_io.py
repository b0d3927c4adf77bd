"""``runtime.task_io.ZmqTaskIO`` over real loopback sockets (no task, no processes): the
control DEALER's identity, output channels to the right gate, and ``wait`` saying which
side is readable."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import zmq

from channels.messages import KIND_DATA, decode_header, decode_records
from channels.zmq_io import InputGate
from runtime.config import JobConfig
from runtime.task_io import ZmqTaskIO

HOST = "127.0.0.1"


@pytest.fixture
def closing() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def wait_for(io: ZmqTaskIO, expected: tuple[bool, bool], seconds: float = 10.0) -> None:
    """Poll ``io.wait`` until it answers ``expected`` (a guard against a hang, not a measure)."""
    deadline = time.monotonic() + seconds
    got = io.wait(0)
    while got != expected and time.monotonic() < deadline:
        got = io.wait(50)
    assert got == expected


def gate(context: zmq.Context[Any], closing: ExitStack) -> InputGate:
    g = InputGate(context, HOST)
    closing.callback(g.close)
    return g


def router(context: zmq.Context[Any], closing: ExitStack) -> tuple[Any, str]:
    """The job manager's end of the control plane, on a free port."""
    sock = context.socket(zmq.ROUTER)
    closing.callback(sock.close, 0)
    port = sock.bind_to_random_port(f"tcp://{HOST}")
    return sock, f"tcp://{HOST}:{port}"


def test_the_control_socket_carries_the_tasks_identity_and_wakes_the_wait(
    context: zmq.Context[Any], closing: ExitStack
) -> None:
    jm, endpoint = router(context, closing)
    io = ZmqTaskIO(context, gate(context, closing), {}, JobConfig(), endpoint, b"task-3")
    control = io.control_socket()
    closing.callback(control.close, 0)
    assert io.wait(0) == (False, False)
    control.send(b"register")
    assert jm.poll(10_000)
    assert jm.recv_multipart() == [b"task-3", b"register"]
    jm.send_multipart([b"task-3", b"trigger"])
    wait_for(io, (False, True))
    assert control.recv() == b"trigger"
    assert io.wait(0) == (False, False)  # read: nothing left
    assert io.refused_connections == 0  # no guard: nothing refused


def test_outputs_reach_the_targets_gate_and_back_edges_its_feedback_gate(
    context: zmq.Context[Any], closing: ExitStack
) -> None:
    _, endpoint = router(context, closing)
    mine, target, target_feedback = (gate(context, closing) for _ in range(3))
    io = ZmqTaskIO(
        context,
        mine,
        {1: target.endpoint},
        JobConfig(batch_size=2),
        endpoint,
        b"task-0",
        feedback_endpoints={1: target_feedback.endpoint},
    )
    assert (io.gate, io.feedback_gate, io.priority_gate) == (mine, None, None)
    forward = io.output(7, 1, on_backpressure=lambda: None)
    back = io.output(8, 1, on_backpressure=lambda: None, back_edge=True)
    closing.callback(forward.close)
    closing.callback(back.close)
    forward.write([("a", 1), ("b", 2)])  # a full batch of 2: sent
    back.write([("c", 3)])
    back.flush()

    def frames(g: InputGate) -> list[bytes]:
        deadline = time.monotonic() + 10.0
        got = g.recv_frames(10)
        while not got and time.monotonic() < deadline:
            g.socket.poll(50)
            got = g.recv_frames(10)
        return got

    (sent,) = frames(target)
    assert decode_header(sent) == (7, KIND_DATA)
    assert decode_records(sent) == [("a", 1), ("b", 2)]
    (looped,) = frames(target_feedback)
    assert decode_header(looped) == (8, KIND_DATA) and decode_records(looped) == [("c", 3)]
    assert target.recv_frames(10) == []  # the back-edge batch went to the feedback gate only


def test_wait_watches_every_gate_the_task_has(
    context: zmq.Context[Any], closing: ExitStack
) -> None:
    """A loop head's records arrive on its feedback gate: that wakes the wait too."""
    _, endpoint = router(context, closing)
    own, feedback = gate(context, closing), gate(context, closing)
    head = ZmqTaskIO(context, own, {}, JobConfig(), endpoint, b"head", feedback_gate=feedback)
    sender = ZmqTaskIO(
        context,
        None,
        {},
        JobConfig(batch_size=1),
        endpoint,
        b"tail",
        feedback_endpoints={0: feedback.endpoint},
    )
    assert sender.gate is None and head.feedback_gate is feedback
    assert head.wait(0) == (False, False)
    out = sender.output(4, 0, on_backpressure=lambda: None, back_edge=True)
    closing.callback(out.close)
    out.write([("x", 1)])
    wait_for(head, (True, False))
    assert decode_header(feedback.recv_frames(1)[0])[0] == 4

"""The job manager's ROUTER (``jobmanager.router_link``): garbage from a peer that is not
one of the job's tasks is dropped, counted and logged; the messages around it arrive."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from jobmanager.router_link import RouterLink, open_router
from runtime import control as P
from statebackend.metrics import TaskMetrics


@pytest.fixture
def link() -> Iterator[tuple[RouterLink, int, zmq.Context[Any]]]:
    zctx: zmq.Context[Any] = zmq.Context()
    router, monitor, port = open_router(zctx, "127.0.0.1", None)
    try:
        yield RouterLink(router, "new"), port, zctx
    finally:
        router.disable_monitor()
        monitor.close(linger=0)
        zctx.destroy(linger=0)


def test_garbage_is_dropped_and_the_real_messages_arrive(
    link: tuple[RouterLink, int, zmq.Context[Any]], caplog: pytest.LogCaptureFixture
) -> None:
    rl, port, zctx = link
    caplog.set_level(logging.WARNING, "absflow.jobmanager")
    peer: zmq.Socket[Any] = zctx.socket(zmq.DEALER)
    peer.connect(f"tcp://127.0.0.1:{port}")
    hello = P.Heartbeat(0, 0, TaskMetrics(records_in=1, records_out=1))
    garbage = [b"", b"\xc1", os.urandom(40), P.encode(hello)[:3], b"\x93\x63\x01\x02"]
    for frame in garbage:
        peer.send(frame)
    peer.send_multipart([b"two", b"frames"])
    peer.send(P.encode(hello))
    got: list[P.Message] = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        got = list(rl.receive(50))
    peer.close(linger=0)
    assert got == [hello]
    assert rl.malformed == len(garbage) + 1
    assert len([r for r in caplog.records if "not a control message" in r.getMessage()]) == 3


def _reached(peer: zmq.Socket[Any], timeout_ms: int) -> list[P.Message]:
    return [P.decode(peer.recv())] if peer.poll(timeout_ms) else []


def _connected(zctx: zmq.Context[Any], port: int, identity: bytes) -> zmq.Socket[Any]:
    peer: zmq.Socket[Any] = zctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.IDENTITY, identity)
    peer.connect(f"tcp://127.0.0.1:{port}")
    return peer


def _register(peer: zmq.Socket[Any], rl: RouterLink) -> None:
    """Send a heartbeat and wait until the ROUTER read it: the peer is connected."""
    peer.send(P.encode(P.Heartbeat(0, 0, TaskMetrics())))
    deadline = time.monotonic() + 10
    while not list(rl.receive(50)):
        assert time.monotonic() < deadline, "the peer's message never arrived"


def test_a_task_of_another_run_on_the_same_port_does_not_take_a_new_tasks_identity(
    link: tuple[RouterLink, int, zmq.Context[Any]],
) -> None:
    # A task process of an earlier run that reconnects to a port the OS handed out again
    # is connected first, with the same task index and attempt.
    rl, port, zctx = link
    stale = _connected(zctx, port, P.peer_identity(0, 0, "old"))
    _register(stale, rl)
    fresh = _connected(zctx, port, P.peer_identity(0, 0, "new"))
    _register(fresh, rl)
    rl.send(0, 0, P.Alive())
    assert _reached(fresh, 5000) == [P.Alive()]
    assert _reached(stale, 0) == []


def test_with_one_identity_for_both_the_new_task_is_refused(
    link: tuple[RouterLink, int, zmq.Context[Any]],
) -> None:
    # The companion: identities without the run (the mechanism off) let the stale
    # process hold the identity, and what the job manager sends never reaches the task.
    rl, port, zctx = link
    stale = _connected(zctx, port, b"0:0")
    _register(stale, rl)
    fresh = _connected(zctx, port, b"0:0")
    fresh.send(P.encode(P.Heartbeat(0, 0, TaskMetrics())))
    assert not list(rl.receive(1000))  # refused: its heartbeat never arrives
    rl.router.send_multipart([b"0:0", P.encode(P.Alive())])
    assert _reached(fresh, 1000) == []
    assert _reached(stale, 5000) == [P.Alive()]

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
        yield RouterLink(router), port, zctx
    finally:
        router.disable_monitor()
        monitor.close(linger=0)
        zctx.destroy(linger=0)


def test_garbage_is_dropped_and_the_real_messages_arrive(
    link: tuple[RouterLink, int, zmq.Context[Any]], caplog: pytest.LogCaptureFixture
) -> None:
    rl, port, zctx = link
    caplog.set_level(logging.WARNING, "absflow.jobmanager")
    peer = zctx.socket(zmq.DEALER)
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

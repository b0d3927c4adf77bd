"""The driver's rendezvous (channels.rendezvous): every task gets every task's message in
task order, whatever order they come in; malformed messages are ignored; a missing task
makes the others' wait end with an error naming the rendezvous; closing releases the
port and the thread."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import zmq

from channels.rendezvous import Rendezvous, RendezvousError, gather
from channels.zmq_io import host_of


def gather_all(endpoint: str, order: list[int], messages: list[str]) -> dict[int, Any]:
    """Each index gathers from a thread of its own, started in ``order``."""
    got: dict[int, Any] = {}

    def one(i: int) -> None:
        try:
            got[i] = gather(endpoint, i, messages[i], timeout=20)
        except Exception as err:  # reported through got
            got[i] = err

    threads = [threading.Thread(target=one, args=(i,)) for i in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return got


@pytest.mark.parametrize("count", [1, 2, 7])
def test_every_task_gets_every_message_in_task_order(count: int) -> None:
    messages = [f'["endpoint of {i}", {i}]' for i in range(count)]
    order = list(range(count))
    random.Random(count).shuffle(order)
    with Rendezvous("127.0.0.1", count) as rendezvous:  # started, closed on leaving
        got = gather_all(rendezvous.endpoint, order, messages)
        assert rendezvous.done.wait(10)
    assert got == {i: messages for i in range(count)}


def test_malformed_messages_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    rendezvous = Rendezvous("127.0.0.1", 2).start()
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        stray = ctx.socket(zmq.DEALER)
        stray.setsockopt(zmq.LINGER, 0)
        stray.connect(rendezvous.endpoint)
        stray.send_multipart([b"5", b"out of range"])
        stray.send_multipart([b"not an index", b"x"])
        stray.send(b"one frame")
        deadline = time.monotonic() + 10  # the stray connects on its own: wait for its 3
        while caplog.text.count("ignored a malformed message") < 3:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.01)
        got = gather_all(rendezvous.endpoint, [1, 0], ["a", "b"])
        assert got == {0: ["a", "b"], 1: ["a", "b"]}
        assert not stray.poll(200)  # nothing for a sender that is not a task
    finally:
        ctx.destroy(linger=0)
        rendezvous.close()
    assert "task index 5 not in [0, 2)" in caplog.text
    assert (
        "invalid literal" in caplog.text and "2 frames, not 3" in caplog.text
    )  # identity + one frame


def test_a_missing_task_ends_the_wait_with_an_error_naming_the_rendezvous() -> None:
    rendezvous = Rendezvous("127.0.0.1", 2).start()
    try:
        with pytest.raises(RendezvousError, match="another task of the stage did not start"):
            gather(rendezvous.endpoint, 0, "alone", timeout=0.3)
        assert not rendezvous.done.is_set()
    finally:
        rendezvous.close()


def test_closing_a_waiting_rendezvous_releases_its_port_and_thread() -> None:
    before = set(threading.enumerate())
    rendezvous = Rendezvous("127.0.0.1", 3).start()
    endpoint = rendezvous.endpoint
    rendezvous.close()  # two tasks never came: the stage failed
    assert set(threading.enumerate()) <= before
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        again = ctx.socket(zmq.ROUTER)
        again.setsockopt(zmq.LINGER, 0)
        again.bind(endpoint)  # the port is free again
    finally:
        ctx.destroy(linger=0)
    Rendezvous("127.0.0.1", 1).close()  # never started: closes as well


def test_host_of_endpoints_and_a_bad_count() -> None:
    assert host_of("tcp://10.0.0.5:4000") == "10.0.0.5"
    assert host_of("tcp://[::1]:4000") == "::1"
    with pytest.raises(ValueError, match="at least one task"):
        Rendezvous("127.0.0.1", 0)


def test_an_ipv6_rendezvous() -> None:
    try:
        rendezvous = Rendezvous("::1", 2).start()
    except zmq.ZMQError as err:  # no IPv6 on this host's loopback
        pytest.skip(f"IPv6 loopback unavailable: {err}")
    try:
        assert rendezvous.endpoint.startswith("tcp://[::1]:")
        got = gather_all(rendezvous.endpoint, [0, 1], ["a", "b"])
    finally:
        rendezvous.close()
    assert got == {0: ["a", "b"], 1: ["a", "b"]}

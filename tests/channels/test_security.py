"""CURVE between the job's sockets (``channels.security``): the job's peers get through,
every stranger is refused before a frame reaches the application, counted, and logged
once per peer with the reason; the secrets never show in a repr."""

from __future__ import annotations

import contextlib
import logging
import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from channels.messages import encode_data
from channels.rendezvous import Rendezvous, RendezvousError, gather
from channels.security import UNNAMED, ChannelKeys, Guard, RefusalReason
from channels.zmq_io import InputGate, OutputChannel
from runtime.config import JobConfig
from runtime.task_environment import TaskEnvironment

KEYS = ChannelKeys.generate()


def wait_for(what: str, check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
    return value


@pytest.fixture
def zctx() -> Iterator[zmq.Context[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


@pytest.fixture
def gate(zctx: zmq.Context[Any]) -> Iterator[tuple[InputGate, Guard]]:
    guard = Guard(zctx, KEYS, "task t[0]").start()
    g = InputGate(zctx, "127.0.0.1", guard=guard)
    yield g, guard
    g.close()
    guard.close()


def frames_within(g: InputGate, timeout: float) -> list[bytes]:
    deadline = time.monotonic() + timeout
    got: list[bytes] = []
    while time.monotonic() < deadline and not got:
        g.socket.poll(20)
        got = g.recv_frames(10)
    return got


def test_the_jobs_client_gets_through(
    zctx: zmq.Context[Any], gate: tuple[InputGate, Guard]
) -> None:
    g, guard = gate
    out = OutputChannel(zctx, g.endpoint, 3, batch_size=2, keys=KEYS)
    try:
        out.write([1, 2])
        assert frames_within(g, 10.0) == [encode_data(3, [1, 2])]
    finally:
        out.close()
    assert guard.refused == 0 and not guard.refusals


def stranger(
    zctx: zmq.Context[Any],
    endpoint: str,
    server_key: bytes | None,
    client: tuple[bytes, bytes] | None,
) -> zmq.Socket[Any]:
    sock: zmq.Socket[Any] = zctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    if server_key is not None and client is not None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, client[0])
        sock.setsockopt(zmq.CURVE_SECRETKEY, client[1])
    sock.connect(endpoint)
    with contextlib.suppress(zmq.Again):  # a CURVE client queues nothing before its handshake
        sock.send(encode_data(3, [666]), zmq.NOBLOCK)  # a plain one does
    return sock


OTHER = ChannelKeys.generate()


@pytest.mark.parametrize(
    ("server_key", "client", "reason"),
    [
        (None, None, RefusalReason.NO_CURVE),
        (
            OTHER.server_public,
            (OTHER.client_public, OTHER.client_secret),
            RefusalReason.WRONG_SERVER_KEY,
        ),
        (
            KEYS.server_public,
            (OTHER.client_public, OTHER.client_secret),
            RefusalReason.WRONG_CLIENT_KEY,
        ),
    ],
    ids=["plain-zeromq", "wrong-server-key", "wrong-client-key"],
)
def test_a_stranger_is_refused_counted_and_logged_once(
    zctx: zmq.Context[Any],
    gate: tuple[InputGate, Guard],
    caplog: pytest.LogCaptureFixture,
    server_key: bytes | None,
    client: tuple[bytes, bytes] | None,
    reason: RefusalReason,
) -> None:
    g, guard = gate
    caplog.set_level(logging.WARNING, "absflow.security")
    for n in (1, 2):  # twice from one host: counted twice, logged once
        sock = stranger(zctx, g.endpoint, server_key, client)
        try:
            wait_for(f"refusal {n}", lambda n=n: guard.refused >= n)  # type: ignore[misc]
            assert frames_within(g, 0.2) == []
        finally:
            sock.close(linger=0)
    assert set(guard.refusals.values()) == {reason}
    assert set(guard.refusals) <= {"127.0.0.1", UNNAMED}
    lines = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(lines) == len(guard.refusals), lines  # once per peer
    assert all("task t[0]" in line and reason.value in line for line in lines)
    if reason is RefusalReason.WRONG_CLIENT_KEY:  # ZAP names the peer's address, always
        assert list(guard.refusals) == ["127.0.0.1"]


def test_the_keys_show_no_secret_and_travel_with_the_environment() -> None:
    env = TaskEnvironment("tcp://127.0.0.1:1", 0, JobConfig(), None, None, None, channel_keys=KEYS)
    for text in (repr(KEYS), repr(env)):
        assert KEYS.server_secret.decode() not in text
        assert KEYS.client_secret.decode() not in text
    assert pickle.loads(pickle.dumps(env)).channel_keys == KEYS  # what the launchers ship


def test_a_second_guard_on_one_context_is_an_error(zctx: zmq.Context[Any]) -> None:
    first = Guard(zctx, KEYS, "a").start()
    try:
        with pytest.raises(zmq.ZMQError):
            Guard(zctx, KEYS, "b").start()
    finally:
        first.close()


def test_the_rendezvous_serves_the_jobs_tasks_and_refuses_others() -> None:
    with Rendezvous("127.0.0.1", 1, KEYS) as rdv:
        with pytest.raises(RendezvousError):
            gather(rdv.endpoint, 0, "stranger", timeout=0.5)  # no keys: never answered
        assert rdv.refused >= 1
        assert gather(rdv.endpoint, 0, "task", keys=KEYS) == ["task"]


@pytest.mark.parametrize(
    ("setting", "remote", "on"),
    [(None, False, False), (None, True, True), (True, False, True), (False, True, False)],
)
def test_secure_channels_is_on_by_default_only_off_a_single_host(
    setting: bool | None, remote: bool, on: bool
) -> None:
    assert JobConfig(secure_channels=setting).secures_channels(remote) is on

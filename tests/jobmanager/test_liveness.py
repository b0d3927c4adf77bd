"""Liveness with a fake process table: dead tasks only after a disconnect, silent tasks,
and the end of a failed attempt (cancel, grace, SIGKILL, stage, ports)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from jobmanager.liveness import Liveness, pid_alive, port_bound
from jobmanager.services import TaskInfo
from tests.jobmanager.fakes import Clock, FakeMonitor, FakeStage, Processes


def tasks() -> list[TaskInfo]:
    out = []
    for i, (pid, host) in enumerate([(100, "h"), (101, "h"), (102, "remote")]):
        t = TaskInfo(f"op[{i}]", i, pid=pid, host=host, endpoint=f"tcp://h:{7000 + i}")
        t.last_seen = 1000.0
        out.append(t)
    return out


def liveness(procs: Processes, clock: Clock, monitor: FakeMonitor | None = None) -> Liveness:
    return Liveness(
        {"h"},
        5.0,
        monitor or FakeMonitor(),
        procs.is_alive,
        procs.port_in_use,
        procs.signal,
        clock=clock,
        sleep=clock.advance,
    )


def test_a_dead_process_is_looked_for_only_after_a_disconnect() -> None:
    procs, clock, monitor = Processes({101, 102}), Clock(), FakeMonitor()
    live = liveness(procs, clock, monitor)
    ts = tasks()
    assert live.dead_task(ts) is None  # pid 100 is gone, but nothing disconnected yet
    monitor.disconnect()
    monitor.disconnect()
    dead = live.dead_task(ts)
    assert dead is not None and dead.task_id == "op[0]"
    assert monitor.events == 0  # every queued event drained
    assert live.dead_task(ts) is None


def test_closed_and_remote_tasks_are_not_dead() -> None:
    procs, clock, monitor = Processes(set()), Clock(), FakeMonitor()
    live = liveness(procs, clock, monitor)
    ts = tasks()
    ts[0].closed = True
    ts[1].pid = 0  # not registered yet
    monitor.disconnect()
    assert live.dead_task(ts) is None  # op[2]'s pid is on another host


def test_a_task_silent_for_the_heartbeat_timeout() -> None:
    live = liveness(Processes(), Clock())
    ts = tasks()
    ts[0].last_seen = ts[2].last_seen = 1004.0
    assert live.silent_task(ts, 1005.0) is None
    silent = live.silent_task(ts, 1005.5)
    assert silent is not None and silent.task_id == "op[1]"
    ts[1].finished = True
    assert live.silent_task(ts, 1005.5) is None


def test_ending_an_attempt_kills_only_local_survivors_that_did_not_close() -> None:
    procs, clock = Processes({100, 101, 102}), Clock()
    live = liveness(procs, clock)
    ts = tasks()
    cancelled: list[bool] = []

    def drain() -> None:
        clock.advance(0.05)
        ts[0].closed = True  # op[0] answers Cancel; op[1] hangs

    stage = FakeStage()
    live.end_attempt(list(ts), lambda: cancelled.append(True), drain, stage)
    assert cancelled == [True]
    assert procs.signals == [(101, signal.SIGKILL)]
    assert stage.cancelled and stage.joined == 1


def test_ending_waits_for_ports_to_be_free() -> None:
    procs, clock = Processes(), Clock()
    live = liveness(procs, clock)
    procs.bound.add("tcp://h:7000")
    released_at = clock.now + 1.0

    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        if clock.now >= released_at:
            procs.bound.clear()

    live.sleep = sleep
    assert live.wait_gone(tasks()[:2])
    assert clock.now >= released_at
    live.sleep = clock.advance
    procs.bound.add("tcp://h:7001")
    assert not live.wait_gone(tasks()[:2])  # gives up after PORTS_FREE_SECONDS


def test_real_pid_and_port_checks() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not pid_alive(child.pid)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_bound(f"tcp://127.0.0.1:{port}")
    assert not port_bound(f"tcp://127.0.0.1:{port}")
    assert not port_bound("")


def test_an_ipv6_port_is_probed_over_ipv6() -> None:
    """A task endpoint on an IPv6 literal is free once its listener closes (probed over
    IPv4, the bracketed host never binds and the port would look taken forever)."""
    try:
        listener = socket.socket(socket.AF_INET6)
        listener.bind(("::1", 0))
    except OSError as err:  # no IPv6 on this host's loopback
        pytest.skip(f"IPv6 loopback unavailable: {err}")
    with listener:
        listener.listen()
        port = listener.getsockname()[1]
        assert port_bound(f"tcp://[::1]:{port}")
    assert not port_bound(f"tcp://[::1]:{port}")

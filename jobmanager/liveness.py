"""Liveness of an attempt's task processes: dead processes (checked on every
disconnect of the control socket), silent tasks (heartbeat timeout), and the end of a
failed attempt (cancel, end survivors, wait until processes and ports are gone).

Driver side, job-manager thread only. Processes are checked only on the driver's
machine (``local_hosts``); remote tasks are watched through heartbeats and Spark.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from channels.zmq_io import host_of, is_ipv6

log = logging.getLogger("absflow.jobmanager")


class TaskProcess(Protocol):
    """What liveness needs to know of a task (``attempt.TaskInfo`` has it)."""

    task_id: str
    pid: int
    host: str
    endpoint: str
    last_seen: float
    finished: bool
    closed: bool


class DisconnectEvents(Protocol):
    """The ROUTER's monitor socket (``zmq.EVENT_DISCONNECTED``)."""

    def poll(self, timeout: int) -> int: ...

    def recv_multipart(self) -> Any: ...


class Stage(Protocol):
    def cancel(self) -> None: ...

    def join(self, timeout: float) -> bool: ...


class Liveness:
    """Watches the task processes of one run (every attempt).

    ``is_alive(pid)``, ``port_in_use(endpoint)`` and ``signal_process(pid, sig)`` default
    to the real checks and ``os.kill``; tests pass fakes, and a ``clock``/``sleep`` pair.
    """

    GRACE_SECONDS = 0.5  # cancelled survivors close their sockets within this
    STAGE_JOIN_SECONDS = 30.0
    PORTS_FREE_SECONDS = 10.0

    def __init__(
        self,
        local_hosts: Iterable[str],
        heartbeat_timeout: float,
        disconnects: DisconnectEvents | None = None,
        is_alive: Callable[[int], bool] | None = None,
        port_in_use: Callable[[str], bool] | None = None,
        signal_process: Callable[[int, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.local_hosts = set(local_hosts)
        self.heartbeat_timeout = heartbeat_timeout
        self.disconnects = disconnects
        self.is_alive = is_alive or pid_alive
        self.port_in_use = port_in_use or port_bound
        self.signal_process = signal_process or send_signal
        self.clock, self.sleep = clock, sleep

    def is_local(self, task: TaskProcess) -> bool:
        return task.host in self.local_hosts

    # -- detection -------------------------------------------------------------------------
    def dead_task(self, tasks: Iterable[TaskProcess]) -> TaskProcess | None:
        """A registered, local, unclosed task whose process is gone, looked for only after
        a connection dropped (a dying process drops its connection at once: no need to wait
        ~1 s for Spark to report the failed stage)."""
        if not self._disconnected():
            return None
        return self.gone_task(tasks)

    def gone_task(self, tasks: Iterable[TaskProcess]) -> TaskProcess | None:
        """A registered, local, unclosed task whose process is gone (checked now)."""
        for t in tasks:
            if t.pid and self.is_local(t) and not t.closed and not self.is_alive(t.pid):
                return t
        return None

    def silent_task(self, tasks: Iterable[TaskProcess], now: float) -> TaskProcess | None:
        """An unfinished task not heard from for ``heartbeat_timeout`` (e.g. frozen)."""
        for t in tasks:
            if not t.finished and now - t.last_seen > self.heartbeat_timeout:
                return t
        return None

    def _disconnected(self) -> bool:
        if self.disconnects is None or not self.disconnects.poll(0):
            return False
        while self.disconnects.poll(0):
            self.disconnects.recv_multipart()
        return True

    # -- the end of a failed attempt -------------------------------------------------------
    def end_attempt(
        self,
        tasks: Sequence[TaskProcess],
        cancel: Callable[[], None],
        drain: Callable[[], None],
        stage: Stage,
    ) -> None:
        """Stop every task of a failed attempt and wait until its processes and ports are
        gone. ``cancel()`` sends every task Cancel; ``drain()`` reads waiting control
        messages (marking tasks closed). Never raises for a task that is already gone."""
        cancel()
        # Survivors close their sockets and return their process to Spark's worker pool
        # (a reused worker starts the next attempt ~1 s sooner than a fresh one).
        local = [t for t in tasks if t.pid and self.is_local(t)]
        deadline = self.clock() + self.GRACE_SECONDS
        while self.clock() < deadline and self._running(local):
            drain()
        for t in self._running(local):
            log.info("ending task %s (pid %d): it did not close after Cancel", t.task_id, t.pid)
            self.signal_process(t.pid, signal.SIGKILL)
        stage.cancel()
        if not stage.join(self.STAGE_JOIN_SECONDS):
            log.warning(
                "the barrier stage of the failed attempt did not end within %.0f s",
                self.STAGE_JOIN_SECONDS,
            )
        self.wait_gone(local)
        log.info("attempt ended: stage done, processes and ports gone")

    def wait_gone(self, local: Sequence[TaskProcess]) -> bool:
        """Wait up to PORTS_FREE_SECONDS until the processes are gone and their ports free
        (the next attempt may bind the same ports); True when they are."""
        deadline = self.clock() + self.PORTS_FREE_SECONDS
        while self._running(local) or any(self.port_in_use(t.endpoint) for t in local):
            if self.clock() >= deadline:
                log.warning("task processes or ports of the failed attempt are still in use")
                return False
            self.sleep(0.02)
        return True

    def _running(self, local: Sequence[TaskProcess]) -> list[TaskProcess]:
        return [t for t in local if not t.closed and self.is_alive(t.pid)]


def send_signal(pid: int, sig: int) -> None:
    """``os.kill`` that ignores a process already gone (or no longer ours)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def port_bound(endpoint: str) -> bool:
    """True while ``tcp://host:port`` cannot be bound (a process still listens on it);
    an IPv6 literal (``tcp://[::1]:port``) is probed over IPv6."""
    if not endpoint.startswith("tcp://"):
        return False
    host, port = host_of(endpoint), endpoint.rpartition(":")[2]
    probe = socket.socket(
        socket.AF_INET6 if is_ipv6(endpoint) else socket.AF_INET, socket.SOCK_STREAM
    )
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((host, int(port)))
        return False
    except OSError:
        return True
    finally:
        probe.close()


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Clean-up that a second Ctrl-C must not cut short (ending tasks, freeing ports,
    removing temp dirs): SIGINT is noted and dropped meanwhile (main thread only; the
    job is already being cancelled or ended)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def note(_signum: int, _frame: Any) -> None:
        log.warning("Ctrl-C: already cleaning up; the job ends in a moment")

    try:
        previous = signal.signal(signal.SIGINT, note)
    except ValueError:  # not the main interpreter
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)

"""The task's side of the control plane: one socket to the job manager.

Sends the task's messages (register, heartbeat, ack, decline, ...), queues what the
job manager sends (trigger, complete, abort) until the task loop acts on it between
two batches, heartbeats, and ends the task when the job manager says Cancel or goes
silent for ``heartbeat_timeout`` (each heartbeat is answered by Alive). A ``KillSelf``
(fault injection on a task on another host) is obeyed the moment it is read, also
inside a blocked send.

Threading: task-loop thread only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator

import zmq

from runtime import control as P
from runtime.control import M
from runtime.errors import AbsflowError, TaskCancelled
from runtime.task_io import ControlSocket

log = logging.getLogger("absflow.task")


def kill_self(sig: int) -> None:
    os.kill(os.getpid(), sig)


def rss_bytes() -> int:
    """This process's resident set size in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes: the kernel's high-water mark
    (``VmHWM``), so a peak between two heartbeats is not missed (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class ControlClosedError(AbsflowError, RuntimeError):
    """The control client was used before ``open()`` or after ``close()`` (a task bug)."""


class ControlClient:
    """Lifecycle: ``open()`` connects, ``close()`` closes; nothing happens in between
    unless the task calls. ``read()`` never acts on a message, so it is safe inside a
    blocked send (a trigger acted on there would put a barrier inside a batch)."""

    def __init__(
        self,
        connect: Callable[[], ControlSocket],
        heartbeat_interval: float,
        heartbeat_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        kill: Callable[[int], None] = kill_self,
    ) -> None:
        self._connect, self._kill = connect, kill
        self._interval, self._timeout, self._clock = heartbeat_interval, heartbeat_timeout, clock
        self._socket: ControlSocket | None = None
        self._queued: deque[P.Message] = deque()
        self._last_contact = 0.0
        # The lowest watermark of the job's aligned sources, from the last Alive.
        self.aligned_watermark: float | None = None
        self._next_heartbeat = 0.0

    def open(self) -> None:
        self._socket = self._connect()
        self._last_contact = self._clock()

    @property
    def _sock(self) -> ControlSocket:
        if self._socket is None:
            raise ControlClosedError("the task's control socket is not open")
        return self._socket

    def send(self, msg: P.Message) -> None:
        self._sock.send(P.encode(msg))

    def send_quietly(self, msg: P.Message) -> None:
        """Send if possible (while failing or closing: the socket may be gone)."""
        with contextlib.suppress(zmq.ZMQError, ControlClosedError):
            self.send(msg)

    def read(self) -> None:
        """Queue every waiting message; Cancel raises TaskCancelled at once, KillSelf
        sends the task its signal at once."""
        sock = self._sock
        while sock.poll(0):
            msg = P.decode(sock.recv())
            self._last_contact = self._clock()
            if isinstance(msg, P.Cancel):
                raise TaskCancelled(msg.reason)
            if isinstance(msg, P.KillSelf):
                log.warning("fault injection: signal %d to this task: %s", msg.signal, msg.label)
                self._kill(msg.signal)
                continue
            if isinstance(msg, P.Alive):
                self.aligned_watermark = msg.aligned_watermark
            else:
                self._queued.append(msg)

    def has_messages(self) -> bool:
        """Whether a message is queued or waiting on the socket (never blocks)."""
        return bool(self._queued) or bool(self._sock.poll(0))

    def wait(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for a message; whether one is there."""
        return bool(self._queued) or bool(self._sock.poll(timeout_ms))

    def take_of(self, kind: type[M]) -> list[M]:
        """Read, then hand out (and unqueue) only the queued messages of ``kind``, oldest
        first; the others stay queued in their order."""
        self.read()
        mine = [m for m in self._queued if isinstance(m, kind)]
        if mine:
            self._queued = deque(m for m in self._queued if not isinstance(m, kind))
        return mine

    def take(self) -> Iterator[P.Message]:
        """Read, then hand out the queued messages oldest first."""
        self.read()
        while self._queued:
            yield self._queued.popleft()

    def heartbeat_soon(self) -> None:
        """Send the next heartbeat at the next ``heartbeat()`` call."""
        self._next_heartbeat = 0.0

    def heartbeat(self, now: float, make: Callable[[], P.Heartbeat]) -> None:
        """Send ``make()`` if a heartbeat is due; raise TaskCancelled if the job manager
        has not answered for ``heartbeat_timeout`` seconds."""
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self._interval
        self.send(make())
        if now - self._last_contact > self._timeout:
            raise TaskCancelled("the job manager stopped answering heartbeats")

    def close(self, linger_ms: int) -> None:
        if self._socket is not None:
            self._socket.close(linger=linger_ms)
            self._socket = None

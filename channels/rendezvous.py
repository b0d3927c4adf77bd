"""The endpoint exchange of a barrier stage's tasks, through the driver.

Every task of an attempt binds its input gates on a port of its own choosing, then needs
every other task's endpoints before it can connect its output channels: an all-gather.
Spark's ``BarrierTaskContext.allGather`` does it, but each call takes about a second
(the executor side polls the driver's barrier coordinator once a second), and an attempt
pays it at every start and every restart. Here the driver gathers instead:

* `Rendezvous` (driver): a ROUTER socket on the driver's address and a thread. Each of
  the ``count`` tasks sends its index and its message; once all have, every task gets
  all messages in task order. Then the thread ends (its work is done).
* `gather` (task): sends this task's message and waits for the list, bounded by a
  deadline that names what to check when it passes.

A task that dies before sending leaves the others waiting: the launcher sees the stage
fail (Spark kills the barrier stage's other tasks) and closes the rendezvous.
Threading: the `Rendezvous` socket is used by its thread only; `gather` opens and closes
its own context.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Final

import zmq

from channels.security import ChannelKeys, Guard
from channels.zmq_io import is_ipv6, tcp_endpoint
from channels.zmq_types import ZmqContext

log = logging.getLogger("absflow.rendezvous")

POLL_MS: Final = 100
"""How often the driver's thread looks at its stop flag while waiting."""

GATHER_TIMEOUT: Final = 120.0
"""How long a task waits for the other tasks' endpoints (a barrier stage starts all its
tasks at once; this bounds a wait for a task that will never come)."""


class RendezvousError(RuntimeError):
    """The exchange did not complete (the driver unreachable, a task missing)."""


class Rendezvous:
    """Gathers one message from each of ``count`` tasks and sends every task all of them,
    in task order (the driver's side; see the module docstring)."""

    def __init__(self, host: str, count: int, keys: ChannelKeys | None = None) -> None:
        """``keys``: a CURVE server of the job's keys (only the job's tasks get through;
        ``refused`` counts the others)."""
        if count < 1:
            raise ValueError(f"a rendezvous needs at least one task, got {count}")
        self.count = count
        self._ctx: ZmqContext = zmq.Context()
        self._guard: Guard | None = None
        self._socket = self._ctx.socket(zmq.ROUTER)
        try:
            if keys is not None:
                self._guard = Guard(self._ctx, keys, "the rendezvous").start()
                self._guard.serve(self._socket)
            where = tcp_endpoint(host)
            if is_ipv6(where):
                self._socket.setsockopt(zmq.IPV6, 1)
            port = self._socket.bind_to_random_port(where)
        except BaseException:
            if self._guard is not None:
                self._guard.close()
            self._ctx.destroy(linger=0)
            raise
        self.endpoint = tcp_endpoint(host, port)
        self.messages: dict[int, str] = {}
        self.done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="absflow-rendezvous", daemon=True)

    def start(self) -> Rendezvous:
        self._thread.start()
        return self

    def __enter__(self) -> Rendezvous:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        sock, senders = self._socket, {}
        try:
            while not self._stop.is_set() and len(self.messages) < self.count:
                if not sock.poll(POLL_MS):
                    continue
                frames = sock.recv_multipart()
                index = self._index(frames)
                if index is None:
                    continue
                senders[index] = frames[0]
                self.messages[index] = frames[2].decode()
            if len(self.messages) == self.count:
                reply = json.dumps([self.messages[i] for i in range(self.count)]).encode()
                for index in range(self.count):
                    sock.send_multipart([senders[index], reply])
                self.done.set()
        finally:
            sock.close(linger=1000)  # the replies leave before the context goes

    def _index(self, frames: list[bytes]) -> int | None:
        """The sender's task index, or None (logged) for a message that is not a task's."""
        try:
            if len(frames) != 3:
                raise ValueError(f"{len(frames)} frames, not 3")
            index = int(frames[1])
            if not 0 <= index < self.count:
                raise ValueError(f"task index {index} not in [0, {self.count})")
            frames[2].decode()
        except (ValueError, UnicodeDecodeError) as err:
            log.warning("rendezvous at %s: ignored a malformed message (%s)", self.endpoint, err)
            return None
        return index

    @property
    def refused(self) -> int:
        """Connections refused for want of the job's keys (0 without keys)."""
        return 0 if self._guard is None else self._guard.refused

    def close(self) -> None:
        """Stop waiting (the stage ended or was cancelled) and release the port."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        elif not self._thread.ident:  # never started: the socket is still open here
            self._socket.close(linger=0)
        if self._guard is not None:
            self._guard.close()
        self._ctx.term()


def gather(
    endpoint: str,
    index: int,
    message: str,
    timeout: float = GATHER_TIMEOUT,
    keys: ChannelKeys | None = None,
) -> list[str]:
    """Send task ``index``'s ``message`` to the driver's rendezvous at ``endpoint``; every
    task's message, in task order. Raises RendezvousError when no answer comes within
    ``timeout`` seconds. ``keys``: connect as the job's CURVE client."""
    ctx: ZmqContext = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        if keys is not None:
            keys.connect(sock)
        sock.setsockopt(zmq.LINGER, 0)
        if is_ipv6(endpoint):
            sock.setsockopt(zmq.IPV6, 1)
        sock.connect(endpoint)
        sock.send_multipart([str(index).encode(), message.encode()])
        deadline = time.monotonic() + timeout
        while not sock.poll(POLL_MS):
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"task {index} got no endpoints from the driver's rendezvous at {endpoint} "
                    f"within {timeout:g} s: another task of the stage did not start, or this "
                    "executor cannot reach the driver (check spark.driver.host and firewalls)"
                )
        messages = json.loads(sock.recv())
        if not isinstance(messages, list) or not all(isinstance(m, str) for m in messages):
            raise RendezvousError(f"the rendezvous at {endpoint} sent a malformed reply")
        return messages
    finally:
        ctx.destroy(linger=0)

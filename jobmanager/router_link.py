"""The job manager's ROUTER socket: where every task's DEALER connects (``runtime.control``).

`open_router` binds it (a CURVE server of the run's keys under secure_channels);
`RouterLink` is how the attempts send and receive on it. A frame that is not a control
message (garbage from a peer that is not one of the job's tasks, possible without
secure_channels) is dropped, logged and counted: it must not end the job manager's loop.

Threading: job-manager thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import msgpack
import zmq

from channels.security import DisconnectNotices, Guard
from channels.zmq_io import tcp_endpoint
from channels.zmq_types import ZmqContext, ZmqSocket
from runtime import control as P

log = logging.getLogger("absflow.jobmanager")


def open_router(
    zctx: ZmqContext, host: str, guard: Guard | None
) -> tuple[ZmqSocket, ZmqSocket | DisconnectNotices, int]:
    """The ROUTER bound on ``host`` (a random port), the source of its disconnect events
    (liveness: a dying task process drops its connection at once, so PIDs are checked on
    every disconnect instead of waiting ~1 s for Spark to report the failed stage), and
    the port. With a ``guard`` (started here) the socket is a CURVE server and the guard,
    which then holds the socket's one monitor, passes the disconnects on."""
    router: ZmqSocket = zctx.socket(zmq.ROUTER)
    try:
        router.setsockopt(zmq.LINGER, 0)
        if guard is not None:
            monitor: ZmqSocket | DisconnectNotices = guard.start().serve(router, disconnects=True)
        else:
            monitor = router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        port = router.bind_to_random_port(tcp_endpoint(host))
    except BaseException:
        router.close(linger=0)
        if guard is not None:
            guard.close()
        raise
    return router, monitor, port


class RouterLink:
    """The ROUTER socket as the attempts see it (job-manager thread only).
    ``malformed`` counts the frames dropped because they were not control messages."""

    def __init__(self, router: zmq.Socket[bytes], run_id: str) -> None:
        self.router, self.run_id = router, run_id
        self._poller = zmq.Poller()  # one for the run: Socket.poll builds one per call
        self._poller.register(router, zmq.POLLIN)
        self.malformed = 0

    def send(self, task_index: int, attempt: int, msg: P.Message) -> None:
        try:
            self.router.send_multipart(
                [P.peer_identity(task_index, attempt, self.run_id), P.encode(msg)],
                zmq.NOBLOCK,
            )
        except zmq.ZMQError as err:
            log.debug("cannot reach task %d: %s", task_index, err)

    def receive(self, timeout_ms: int) -> Iterator[P.Message]:
        """The messages waiting, after waiting up to ``timeout_ms`` for the first. The
        loop turns once per message or so at short checkpoint intervals (acks arrive one
        by one): it asks the socket whether another is there instead of failing a
        non-blocking receive (an exception per turn)."""
        if not self._poller.poll(timeout_ms):  # returns at once if one is waiting
            return
        while self._waiting():
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:  # not expected after POLLIN; harmless
                return
            msg = self._decode(frames)
            if msg is not None:
                yield msg

    def _decode(self, frames: list[bytes]) -> P.Message | None:
        try:
            if len(frames) != 2:
                raise ValueError(f"{len(frames)} frames, not an identity and a message")
            return P.decode(frames[1])
        except (ValueError, TypeError, msgpack.UnpackException) as err:
            self.malformed += 1
            if self.malformed & (self.malformed - 1) == 0:  # the 1st, 2nd, 4th, 8th, ...
                peer = frames[0][:64] if frames else b""
                log.warning(
                    "the job manager dropped a frame that is not a control message from "
                    "connection %r (%s); %d dropped so far. Only the job's tasks should "
                    "connect to its port: turn on secure_channels to refuse the others.",
                    peer,
                    err,
                    self.malformed,
                )
            return None

    def _waiting(self) -> bool:
        events = self.router.get(zmq.EVENTS)
        return isinstance(events, int) and bool(events & zmq.POLLIN)

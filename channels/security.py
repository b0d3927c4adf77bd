"""CURVE on every internal connection of a job: its keys, and the guard that refuses
every peer without them.

One key pair of the job's *servers* and one of its *clients*, made by the driver per run
(`ChannelKeys.generate`) and handed to the tasks inside what launches them (the Spark
barrier stage's closure, the local task process's stdin): never on a command line, in a
plan file or in a log (``repr`` shows the public keys only). Every socket that binds (the
job manager's ROUTER, the rendezvous, each task's gates) is a CURVE server with the
server secret key; every socket that connects (DEALERs, PUSH channels) is a CURVE client
with the client key pair and the server public key. One pair per role, not per task:
every task runs the same code from the same closure, so per-task keys would trust the
same parties, and each server would need every client's public key.

A peer without the keys never gets a frame to the application: libzmq ends its
handshake (no CURVE at all: a mechanism mismatch; a wrong server key: a cryptographic
error; a CURVE client with another key pair: our ZAP handler says 400). A `Guard` (one
per ``zmq.Context``: libzmq asks the ZAP handler bound in the socket's context) is that
ZAP handler, and reads the monitor events of the server sockets it watches: each refused
handshake is counted (``refused``) and logged at WARNING once per peer address.

Naming the peer is exact for a refusal by ZAP (libzmq hands it the address) and best
effort for the others: the guard asks the accepted descriptor for its peer when the
accept event arrives, and a connection libzmq closed before then stays unnamed. A TCP
peer that never speaks ZeroMQ's protocol is closed by libzmq without a handshake event,
so it is not counted (nor does anything reach the application).

Threading: the guard's thread owns the ZAP socket and the monitor sockets (each monitor
socket is created by ``watch`` in the watched socket's thread and handed over, once,
through a queue); ``refused`` and ``refusals`` may be read from any thread.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import queue
import socket as pysocket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import zmq
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from channels.zmq_types import ZmqContext, ZmqSocket

log = logging.getLogger("absflow.security")

ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"
UNNAMED: Final = "an unnamed peer (closed before it could be named)"
DOMAIN: Final = b"absflow"
_EVENTS: Final = (
    zmq.EVENT_ACCEPTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class RefusalReason(enum.Enum):
    """Why a connection was refused; the value is the human message."""

    NO_CURVE = "it does not speak CURVE (a plain ZeroMQ socket)"
    WRONG_SERVER_KEY = "it does not know the job's server key"
    WRONG_CLIENT_KEY = "its CURVE key is not the job's"
    HANDSHAKE = "its handshake failed"


@dataclass(frozen=True, slots=True)
class ChannelKeys:
    """The job's CURVE keys (Z85 text, as libzmq takes them); the secrets stay out of repr."""

    server_public: bytes
    server_secret: bytes = field(repr=False)
    client_public: bytes
    client_secret: bytes = field(repr=False)

    @classmethod
    def generate(cls) -> ChannelKeys:
        """Fresh keys (libzmq's ``zmq_curve_keypair``: a CSPRNG)."""
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public, server_secret, client_public, client_secret)

    def serve(self, socket: ZmqSocket) -> None:
        """Make ``socket`` a CURVE server (before it binds)."""
        socket.setsockopt(zmq.CURVE_SERVER, 1)
        socket.setsockopt(zmq.CURVE_SECRETKEY, self.server_secret)
        socket.setsockopt(zmq.ZAP_DOMAIN, DOMAIN)

    def connect(self, socket: ZmqSocket) -> None:
        """Make ``socket`` a CURVE client of the job's servers (before it connects)."""
        socket.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)
        socket.setsockopt(zmq.CURVE_PUBLICKEY, self.client_public)
        socket.setsockopt(zmq.CURVE_SECRETKEY, self.client_secret)


class DisconnectNotices:
    """The disconnects of a watched socket, read like a ``zmq.EVENT_DISCONNECTED``
    monitor socket (``poll``, then ``recv_multipart`` per notice): a socket has one
    monitor, and the guard holds it (``jobmanager.liveness`` reads these)."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    def _add(self) -> None:
        with self._lock:
            self._count += 1

    def poll(self, timeout: int = 0) -> int:
        """1 if a disconnect is waiting, else 0 (never waits: liveness polls with 0)."""
        return 1 if self._count else 0

    def recv_multipart(self) -> list[bytes]:
        with self._lock:
            self._count = max(0, self._count - 1)
        return []

    def close(self, linger: int | None = None) -> None:
        """Nothing to close: the guard owns the monitor."""


class _Watched:
    """One watched socket's monitor, in the guard's thread."""

    def __init__(self, monitor: ZmqSocket, notices: DisconnectNotices | None) -> None:
        self.monitor, self.notices = monitor, notices
        self.peers: dict[int, str] = {}  # descriptor -> peer address, from the accept
        self.failed: RefusalReason | None = None  # a refusal waiting for its disconnect


class Guard:
    """The ZAP handler of one context and the watcher of its server sockets (see the
    module docstring). ``start`` before any watched socket binds; ``close`` before the
    context is terminated."""

    def __init__(self, context: ZmqContext, keys: ChannelKeys, owner: str) -> None:
        self.context, self.keys, self.owner = context, keys, owner
        self._client = z85.decode(keys.client_public)
        self.refused = 0  # handshakes refused (the guard's thread writes, anyone reads)
        self.refusals: dict[str, RefusalReason] = {}  # peer -> first reason (logged once)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._handover: queue.SimpleQueue[_Watched] = queue.SimpleQueue()
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None

    def start(self) -> Guard:
        """Bind the ZAP handler (in the guard's thread) and return once it is bound."""
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="absflow-guard", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self.close()
            raise self._error
        return self

    def serve(self, socket: ZmqSocket, disconnects: bool = False) -> DisconnectNotices:
        """Make ``socket`` a CURVE server of the job's keys and count its refused
        handshakes (call before it binds, from its owning thread). With ``disconnects``,
        the returned notices get every disconnect of it too."""
        self.keys.serve(socket)
        monitor = socket.get_monitor_socket(_EVENTS)
        notices = DisconnectNotices()
        self._handover.put(_Watched(monitor, notices if disconnects else None))
        os.write(self._wake_w, b"w")
        return notices

    def close(self) -> None:
        """Stop the thread (it closes its sockets). Idempotent."""
        if self._thread is not None and self._thread.is_alive():
            os.write(self._wake_w, b"q")
            self._thread.join()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._wake_r = self._wake_w = -1

    # -- the guard's thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            zap: ZmqSocket = self.context.socket(zmq.REP)
            zap.setsockopt(zmq.LINGER, 0)
            zap.bind(ZAP_ENDPOINT)
        except BaseException as err:  # e.g. a second guard on one context
            self._error = err
            self._ready.set()
            return
        self._ready.set()
        poller = zmq.Poller()
        poller.register(zap, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        watched: dict[ZmqSocket, _Watched] = {}
        try:
            while True:
                events = dict(poller.poll())
                if zap in events:
                    self._answer(zap)
                if self._wake_r in events and os.read(self._wake_r, 1) == b"q":
                    return
                while not self._handover.empty():
                    w = self._handover.get()
                    watched[w.monitor] = w
                    poller.register(w.monitor, zmq.POLLIN)
                for sock, w in watched.items():
                    if sock in events:
                        self._on_event(w, parse_monitor_message(sock.recv_multipart()))
        finally:
            for w in watched.values():
                w.monitor.close(linger=0)
            while not self._handover.empty():
                self._handover.get().monitor.close(linger=0)
            zap.close(linger=0)

    def _answer(self, zap: ZmqSocket) -> None:
        """One ZAP request: 200 for the job's client key, 400 (logged) for any other."""
        frames = zap.recv_multipart()
        version, request_id, _domain, address, _identity, mechanism = frames[:6]
        ok = mechanism == b"CURVE" and len(frames) > 6 and frames[6] == self._client
        if not ok:  # counted by the monitor (a handshake that failed authentication)
            self._note(
                address.decode(errors="replace") or "a local socket", RefusalReason.WRONG_CLIENT_KEY
            )
        zap.send_multipart(
            [version, request_id, b"200" if ok else b"400", b"OK" if ok else b"refused", b"", b""]
        )

    def _on_event(self, w: _Watched, event: Mapping[str, Any]) -> None:
        kind, value = event["event"], event["value"]
        if kind == zmq.EVENT_ACCEPTED:
            w.peers[value] = _peer_of(value)
        elif kind == zmq.EVENT_DISCONNECTED:
            peer = w.peers.pop(value, "")
            if w.failed is not None:  # the refused connection's disconnect follows its failure
                if w.failed is not RefusalReason.WRONG_CLIENT_KEY:  # ZAP logged that one
                    self._note(
                        peer or "an unnamed peer (closed before it could be named)", w.failed
                    )
                w.failed = None
            if w.notices is not None:
                w.notices._add()
        else:  # a handshake failed
            self.refused += 1
            w.failed = _reason(kind, value)

    def _note(self, peer: str, reason: RefusalReason) -> None:
        if peer not in self.refusals:
            self.refusals[peer] = reason
            log.warning(
                "%s refused a connection from %s: %s (secure_channels is on; further "
                "refusals of this peer are counted, not logged)",
                self.owner,
                peer,
                reason.value,
            )


def _reason(kind: int, value: int) -> RefusalReason:
    if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return RefusalReason.WRONG_CLIENT_KEY
    if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return RefusalReason.NO_CURVE
    if value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return RefusalReason.WRONG_SERVER_KEY
    return RefusalReason.HANDSHAKE


def _peer_of(fd: int) -> str:
    """The peer host (its address) of an accepted descriptor, or "" once libzmq closed
    it. The host, not its port: a stranger retrying from new ports is one peer."""
    try:
        with pysocket.socket(fileno=os.dup(fd)) as conn:
            peer = conn.getpeername()
    except OSError:
        return ""
    if isinstance(peer, tuple):
        return str(peer[0])
    return str(peer) or "a local socket"

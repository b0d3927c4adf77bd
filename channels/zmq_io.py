"""ZeroMQ sockets of the data plane: one input gate per task, one output per channel.

Topology: each task binds one PULL socket (its ``InputGate``); every upstream
channel is a PUSH socket (an ``OutputChannel``) connected to it, and every frame
carries its channel id (see ``channels.messages``). ZeroMQ keeps each
connection FIFO, so frames of one channel arrive in the order they were sent;
frames of different channels interleave arbitrarily.

Backpressure: a full send queue (SNDHWM frames on the PUSH side, RCVHWM on the
PULL side, plus kernel buffers) makes ``OutputChannel`` block; while blocked it
calls ``on_backpressure`` so the task can still serve its control socket.

Priority path (unaligned checkpoints): a task may bind a second PULL socket, its
*priority gate*, and each channel to it a second PUSH socket; barriers sent there
overtake the records queued on the data path (``OutputChannel.send_priority``). The
barrier is also sent in band, where it marks the end of the channel's in-flight records.

Threading: each object owns its sockets and is used by one thread only (the task
loop); ``close()`` must be called from that thread too.
"""

from __future__ import annotations

import contextlib
import os
import socket as pysocket
import struct
import sys
import time
import uuid
from collections.abc import Callable
from typing import Final

import zmq

from channels.debloat import BatchSizer
from channels.messages import Event, encode_data, encode_event
from channels.security import ChannelKeys, Guard
from channels.zmq_types import ZmqContext, ZmqSocket

BACKPRESSURE_POLL_MS: Final = 50
"""How long a blocked send waits for POLLOUT before calling on_backpressure again."""


def tcp_endpoint(host: str, port: int | None = None) -> str:
    """``tcp://host[:port]``, with IPv6 literals in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}" if port is None else f"tcp://{host}:{port}"


def is_ipv6(endpoint_or_host: str) -> bool:
    return "[" in endpoint_or_host or endpoint_or_host.count(":") > 2


def host_of(endpoint: str) -> str:
    """The host of ``tcp://host:port`` (an IPv6 literal without its brackets)."""
    host = endpoint.removeprefix("tcp://").rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") else host


IPC_CONNECT_WAIT_MS: Final = 2000
"""How long a channel to a Unix socket waits for its connection to size its send buffer."""


def _push(
    context: ZmqContext,
    endpoint: str,
    sndhwm: int,
    sndbuf: int = 0,
    keys: ChannelKeys | None = None,
) -> ZmqSocket:
    socket: ZmqSocket = context.socket(zmq.PUSH)
    try:
        if keys is not None:
            keys.connect(socket)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, sndhwm)
        if sndbuf > 0:  # the kernel's share of the queue (0: the OS default, autotuned)
            socket.setsockopt(zmq.SNDBUF, sndbuf)
        if is_ipv6(endpoint):
            socket.setsockopt(zmq.IPV6, 1)
        if sndbuf > 0 and endpoint.startswith("ipc://"):
            _connect_ipc(socket, endpoint, sndbuf)
        else:
            socket.connect(endpoint)
    except BaseException:
        socket.close(linger=0)
        raise
    return socket


def _connect_ipc(socket: ZmqSocket, endpoint: str, sndbuf: int) -> None:
    """Connect to a Unix socket and give the connection a send buffer of ``sndbuf`` bytes.

    ZeroMQ sets SO_SNDBUF on TCP connections only: a Unix one keeps the OS default
    (net.core.wmem_default, 208 KiB: ~30 batches of small records queued in the kernel
    beyond the high-water marks, behind which an aligned barrier waits). On a Unix
    stream socket the sender's buffer is what bounds the bytes in flight, so the
    connection's descriptor (from ZeroMQ's connect event) is sized here. Should the
    connection not come up within ``IPC_CONNECT_WAIT_MS`` (the gate binds before its
    endpoint is published, so it does at once), the channel keeps the OS's buffer.
    """
    monitor = socket.get_monitor_socket(zmq.EVENT_CONNECTED)
    try:
        socket.connect(endpoint)
        if monitor.poll(IPC_CONNECT_WAIT_MS):
            _, fd = struct.unpack("=HI", monitor.recv_multipart()[0])  # event, value: the fd
            # (an OSError: the connection is gone already, and ZeroMQ reconnects unsized)
            with contextlib.suppress(OSError), pysocket.socket(fileno=os.dup(fd)) as conn:
                conn.setsockopt(pysocket.SOL_SOCKET, pysocket.SO_SNDBUF, sndbuf)
    finally:
        socket.disable_monitor()
        monitor.close(linger=0)


def local_namespace() -> str | None:
    """What two tasks share when each can reach the other's abstract Unix sockets: one
    kernel (its boot id) and one network namespace. None where there are none (not
    Linux, or /proc unreadable): such tasks connect over TCP."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        net = os.stat("/proc/self/ns/net")
    except OSError:
        return None
    return f"{boot}:{net.st_dev}:{net.st_ino}"


class InputGate:
    """The PULL socket every upstream channel of a task connects to.

    Binds ``tcp://{host}:*`` on a random free port; ``host`` must be an
    address the upstream tasks can reach (this executor's address, not
    ``127.0.0.1``, outside tests).
    """

    __slots__ = ("_endpoint", "_socket")

    def __init__(
        self,
        context: ZmqContext,
        host: str,
        rcvhwm: int = 64,
        rcvbuf: int = 0,
        guard: Guard | None = None,
    ) -> None:
        """``rcvbuf``: the kernel's receive buffer per connection, bytes (0: the OS's);
        ``guard``: a CURVE server of the job's keys whose refusals the context's guard
        counts (``channels.security``), on every bind (TCP and Unix)."""
        socket: ZmqSocket = context.socket(zmq.PULL)
        try:
            if guard is not None:
                guard.serve(socket)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.RCVHWM, rcvhwm)
            if rcvbuf > 0:
                socket.setsockopt(zmq.RCVBUF, rcvbuf)
            if ":" in host:
                socket.setsockopt(zmq.IPV6, 1)
            port = socket.bind_to_random_port(tcp_endpoint(host))
        except BaseException:
            socket.close(linger=0)
            raise
        self._socket = socket
        self._endpoint = tcp_endpoint(host, port)

    @property
    def endpoint(self) -> str:
        """``tcp://host:port`` that upstream OutputChannels connect to."""
        return self._endpoint

    def bind_local(self) -> str:
        """Also bind an abstract Unix socket (Linux: a name, no file to leave behind) for
        upstream tasks in the same network namespace (``local_namespace``); returns its
        ``ipc://@...`` endpoint, or "" where it cannot be bound (the senders use TCP). A
        channel to it skips TCP: loopback's 64 KiB segments against a small receive
        buffer wait on delayed acknowledgements there."""
        endpoint = f"ipc://@absflow-{uuid.uuid4().hex}"
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError:
            return ""
        return endpoint

    @property
    def socket(self) -> ZmqSocket:
        """The PULL socket, for registering with the task's ``zmq.Poller``."""
        return self._socket

    def recv_frames(self, max_frames: int) -> list[bytes]:
        """Return up to ``max_frames`` frames that are already queued; never blocks.

        An empty list means nothing is queued: poll ``socket`` for POLLIN.
        """
        # recv(copy=True): measured 2.2 us per 6 KB frame against 2.7-3.1 us for
        # copy=False (a Frame, then .buffer or .bytes). Zero-copy only pays off for
        # frames of ~100 KB and more, and only if callers took memoryviews.
        frames: list[bytes] = []
        append = frames.append
        recv = self._socket.recv
        try:
            for _ in range(max_frames):
                append(recv(zmq.NOBLOCK))
        except zmq.Again:
            pass
        return frames

    def close(self) -> None:
        """Close the socket, dropping queued frames (linger 0). Idempotent."""
        self._socket.close(linger=0)


class OutputChannel:
    """A PUSH socket sending one channel's records in batches, events in band.

    Records are appended to a pending batch and sent ``batch_size`` at a time;
    ``flush``/``flush_if_older`` send a partial batch. Events are sent after
    everything written before them, so a barrier never overtakes data.
    Sends block under backpressure (see ``write``). ``close`` does not flush.

    Counters (read by metrics): ``records_sent``, ``batches_sent`` (data
    frames), ``events_sent``, ``bytes_sent`` (all frames, headers included),
    ``blocked_seconds`` (time sends waited on a full channel: backpressure).
    """

    __slots__ = (
        "_batch_size",
        "_channel_id",
        "_compress_min_bytes",
        "_first_pending_at",
        "_on_backpressure",
        "_pending",
        "_poller",
        "_priority",
        "_sizer",
        "_socket",
        "batches_sent",
        "blocked_seconds",
        "bytes_sent",
        "events_sent",
        "records_sent",
    )

    def __init__(
        self,
        context: ZmqContext,
        endpoint: str,
        channel_id: int,
        batch_size: int = 1000,
        sndhwm: int = 64,
        compress_min_bytes: int = 65536,
        on_backpressure: Callable[[], None] | None = None,
        priority_endpoint: str | None = None,
        sndbuf: int = 0,
        sizer: BatchSizer | None = None,
        keys: ChannelKeys | None = None,
    ) -> None:
        """``priority_endpoint``: the target's priority gate, for ``send_priority``;
        ``sndbuf``: the kernel's send buffer, bytes (0: the OS's); ``sizer``: batches
        sized from the channel's throughput (bounded in-flight data; ``batch_size`` is
        then the largest batch); ``keys``: connect as the job's CURVE client."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        socket = _push(context, endpoint, sndhwm, sndbuf, keys)
        self._socket = socket
        self._priority: ZmqSocket | None = None
        if priority_endpoint is not None:
            try:
                self._priority = _push(context, priority_endpoint, sndhwm=1000, keys=keys)
            except BaseException:
                socket.close(linger=0)
                raise
        self._poller = zmq.Poller()
        self._poller.register(socket, zmq.POLLOUT)
        self._channel_id = channel_id
        self._sizer = sizer
        self._batch_size = sizer.batch_size if sizer is not None else batch_size
        self._compress_min_bytes = compress_min_bytes
        self._on_backpressure = on_backpressure
        self._pending: list[object] = []  # records, passed on to the wire as they are
        self._first_pending_at = 0.0
        self.records_sent = 0
        self.bytes_sent = 0
        self.batches_sent = 0
        self.events_sent = 0
        self.blocked_seconds = 0.0

    @property
    def channel_id(self) -> int:
        return self._channel_id

    @property
    def batch_size(self) -> int:
        """Records per full batch now (changes with the throughput under a sizer)."""
        return self._batch_size

    @property
    def pending_count(self) -> int:
        """Records written but not yet sent."""
        return len(self._pending)

    def write(self, records: list[object]) -> None:
        """Append ``records`` (copied) and send every full batch.

        Blocks while the receiver applies backpressure, calling
        ``on_backpressure`` about every 50 ms; an exception it raises
        propagates from here, and records not yet sent stay pending.

        Raises:
            RecordSerializationError: a record is not a msgpack type.
        """
        if not records:
            return
        pending = self._pending
        batch_size = self._batch_size
        if not pending:
            if len(records) == batch_size:  # the common case: one full batch, no copy
                frame = encode_data(self._channel_id, records, self._compress_min_bytes)
                try:
                    self._send(frame)
                except BaseException:
                    self._first_pending_at = time.monotonic()
                    pending.extend(records)
                    raise
                self.records_sent += batch_size
                self.bytes_sent += len(frame)
                self.batches_sent += 1
                if self._sizer is not None:
                    self._batch_size = self._sizer.on_batch(
                        batch_size, time.monotonic(), self.blocked_seconds
                    )
                return
            self._first_pending_at = time.monotonic()
        pending.extend(records)
        if len(pending) < batch_size:
            return
        while len(pending) >= batch_size:
            self._send_batch(pending[:batch_size])
            del pending[:batch_size]
            batch_size = self._batch_size
        if pending:
            # The remainder came from this call: all earlier records fit in sent batches.
            self._first_pending_at = time.monotonic()

    def flush(self) -> None:
        """Send the pending partial batch, if any."""
        pending = self._pending
        if pending:
            self._send_batch(pending)
            self._pending = []

    def flush_if_older(self, now: float, timeout: float) -> None:
        """Flush when the oldest pending record was written more than ``timeout`` s before ``now``.

        ``now`` is a ``time.monotonic()`` reading.
        """
        if self._pending and now - self._first_pending_at > timeout:
            self.flush()

    def send_event(self, event: Event) -> None:
        """Flush pending records, then send ``event`` behind them."""
        self.flush()
        frame = encode_event(self._channel_id, event)
        self._send(frame)
        self.events_sent += 1
        self.bytes_sent += len(frame)

    def send_priority(self, event: Event) -> bool:
        """Send ``event`` on the priority path, ahead of every queued record (the caller
        sends it in band too). Returns False without a priority path. Never waits on the
        data path's backpressure (only on a full priority queue: a receiver that stopped)."""
        priority = self._priority
        if priority is None:
            return False
        frame = encode_event(self._channel_id, event)
        try:
            priority.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            while not priority.poll(BACKPRESSURE_POLL_MS, zmq.POLLOUT):
                if self._on_backpressure is not None:
                    self._on_backpressure()
            priority.send(frame, zmq.NOBLOCK)
        self.bytes_sent += len(frame)
        return True

    def close(self, linger_ms: int = 0) -> None:
        """Close the sockets without flushing. Idempotent.

        With ``linger_ms=0`` frames still queued are dropped; after the last
        ``send_event`` pass a positive linger to let them drain.
        """
        if not self._socket.closed:
            self._poller.unregister(self._socket)
            self._socket.close(linger=linger_ms)
        if self._priority is not None and not self._priority.closed:
            self._priority.close(linger=linger_ms)

    def _send_batch(self, batch: list[object]) -> None:
        frame = encode_data(self._channel_id, batch, self._compress_min_bytes)
        self._send(frame)
        self.records_sent += len(batch)
        self.bytes_sent += len(frame)
        self.batches_sent += 1
        if self._sizer is not None:
            self._batch_size = self._sizer.on_batch(
                len(batch), time.monotonic(), self.blocked_seconds
            )

    def _send(self, frame: bytes) -> None:
        try:
            self._socket.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            self._send_blocking(frame)

    def _send_blocking(self, frame: bytes) -> None:
        """Retry until the frame is queued; the high-water mark is reached meanwhile."""
        on_backpressure = self._on_backpressure
        socket = self._socket
        poll = self._poller.poll
        blocked_at = time.monotonic()
        try:
            while True:
                if on_backpressure is not None:
                    on_backpressure()
                poll(BACKPRESSURE_POLL_MS)
                try:
                    socket.send(frame, zmq.NOBLOCK)
                except zmq.Again:
                    continue
                return
        finally:
            self.blocked_seconds += time.monotonic() - blocked_at

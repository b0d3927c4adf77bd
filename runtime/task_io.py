"""How a task reaches the world: its input gate, output channels, control socket, and
the wait between them.

`Task` sees only the protocols below, so its loop runs on fakes in unit tests;
`ZmqTaskIO` is the real thing (``channels.zmq_io`` sockets and one ``zmq.Poller``).
Sockets are created when the task opens, never when an object is constructed.

Threading: task-loop thread only (each socket has one owning thread).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import zmq

from channels.debloat import BatchSizer
from channels.messages import Event
from channels.security import Guard
from channels.zmq_io import InputGate, OutputChannel
from channels.zmq_types import ZmqContext, ZmqSocket
from runtime.config import JobConfig


class Output(Protocol):
    """One output channel (``channels.zmq_io.OutputChannel``); the counters are metrics."""

    bytes_sent: int
    blocked_seconds: float

    @property
    def pending_count(self) -> int: ...
    def write(self, records: list[Any]) -> None: ...
    def flush(self) -> None: ...
    def flush_if_older(self, now: float, timeout: float) -> None: ...
    def send_event(self, event: Event) -> None: ...
    def send_priority(self, event: Event) -> bool: ...
    def close(self, linger_ms: int = 0) -> None: ...


class Gate(Protocol):
    """A task's input gate (``channels.zmq_io.InputGate``)."""

    @property
    def endpoint(self) -> str: ...
    def recv_frames(self, max_frames: int) -> list[bytes]: ...


class ControlSocket(Protocol):
    """The task's end of the control plane (a ZeroMQ DEALER socket)."""

    def send(self, data: bytes, /) -> Any: ...
    def recv(self) -> Any: ...
    def poll(self, timeout: int, /) -> int: ...
    def close(self, linger: int | None = None) -> None: ...


class TaskIO(Protocol):
    """Factories the task calls from ``open()``, and the wait of its input loop."""

    @property
    def gate(self) -> Gate | None:
        """The input gate (bound before the endpoints are exchanged); None for sources."""
        ...

    @property
    def feedback_gate(self) -> Gate | None:
        """The gate of the back-edge channels (loop heads only), else None."""
        ...

    @property
    def priority_gate(self) -> Gate | None:
        """The gate of overtaking barriers (unaligned checkpoints), else None."""
        ...

    def control_socket(self) -> ControlSocket:
        """Connect a new control socket to the job manager."""
        ...

    def output(
        self,
        channel_id: int,
        target_task: int,
        on_backpressure: Callable[[], None],
        back_edge: bool = False,
    ) -> Output:
        """Connect output channel ``channel_id`` to task ``target_task``'s gate (its
        feedback gate for a back-edge channel)."""
        ...

    def wait(self, timeout_ms: int) -> tuple[bool, bool]:
        """Wait up to ``timeout_ms`` for input; returns (a gate readable, control readable)."""
        ...

    @property
    def refused_connections(self) -> int:
        """Connections to this task's gates refused for want of the job's keys (a metric)."""
        ...


class ZmqTaskIO:
    """`TaskIO` over ZeroMQ: PUSH outputs to the gathered endpoints, a DEALER to the
    job manager (identity ``runtime.control.peer_identity``), one poller over gate and DEALER.
    With a ``guard`` (secure_channels) every socket it connects is a CURVE client of the
    guard's keys (the gates were made CURVE servers when they were bound)."""

    def __init__(
        self,
        zctx: ZmqContext,
        gate: InputGate | None,
        endpoints: dict[int, str],
        config: JobConfig,
        jm_endpoint: str,
        identity: bytes,
        feedback_gate: InputGate | None = None,
        feedback_endpoints: dict[int, str] | None = None,
        priority_gate: InputGate | None = None,
        priority_endpoints: dict[int, str] | None = None,
        guard: Guard | None = None,
    ) -> None:
        self._zctx, self._gate, self._endpoints = zctx, gate, endpoints
        self._guard = guard
        self._keys = guard.keys if guard is not None else None
        self._feedback_gate = feedback_gate
        self._feedback_endpoints = feedback_endpoints or {}
        self._priority_gate = priority_gate
        self._priority_endpoints = priority_endpoints or {}
        self._config, self._jm_endpoint, self._identity = config, jm_endpoint, identity
        self._poller: zmq.Poller | None = None
        self._control: ZmqSocket | None = None

    @property
    def gate(self) -> InputGate | None:
        return self._gate

    @property
    def feedback_gate(self) -> InputGate | None:
        return self._feedback_gate

    @property
    def priority_gate(self) -> InputGate | None:
        return self._priority_gate

    @property
    def refused_connections(self) -> int:
        return 0 if self._guard is None else self._guard.refused

    def control_socket(self) -> ZmqSocket:
        control: ZmqSocket = self._zctx.socket(zmq.DEALER)
        if self._keys is not None:
            self._keys.connect(control)
        control.setsockopt(zmq.LINGER, 2000)
        control.setsockopt(zmq.IDENTITY, self._identity)
        control.connect(self._jm_endpoint)
        self._control = control
        return control

    def output(
        self,
        channel_id: int,
        target_task: int,
        on_backpressure: Callable[[], None],
        back_edge: bool = False,
    ) -> OutputChannel:
        cfg = self._config
        endpoints = self._feedback_endpoints if back_edge else self._endpoints
        return OutputChannel(
            self._zctx,
            endpoints[target_task],
            channel_id,
            batch_size=cfg.batch_size,
            sndhwm=cfg.channel_hwm,
            compress_min_bytes=cfg.compress_min_bytes,
            on_backpressure=on_backpressure,
            priority_endpoint=None if back_edge else self._priority_endpoints.get(target_task),
            sndbuf=cfg.socket_buffer,
            keys=self._keys,
            sizer=None
            if cfg.max_inflight_time is None or back_edge
            else BatchSizer(
                cfg.batch_size,
                slots=2 * cfg.channel_hwm + 1,
                target=cfg.max_inflight_time,
                min_batch=min(16, cfg.batch_size),
            ),
        )

    @property
    def _gates(self) -> list[InputGate]:
        gates = (self._gate, self._feedback_gate, self._priority_gate)
        return [gate for gate in gates if gate is not None]

    def wait(self, timeout_ms: int) -> tuple[bool, bool]:
        if self._poller is None:
            self._poller = zmq.Poller()
            for gate in self._gates:
                self._poller.register(gate.socket, zmq.POLLIN)
            if self._control is not None:
                self._poller.register(self._control, zmq.POLLIN)
        events = dict(self._poller.poll(timeout_ms))
        gate_ready = any(gate.socket in events for gate in self._gates)
        return gate_ready, self._control is not None and self._control in events

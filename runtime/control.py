"""The control plane: messages between tasks (DEALER) and the job manager (ROUTER).

Every message is a frozen, slotted dataclass; ``encode`` packs it as a msgpack
array ``[code, *fields]`` and ``decode`` rebuilds it. Tasks and the job manager
both import this module. It sits on the task side, not in ``channels``: its messages
carry ``statebackend`` records (a task's state handle, its metrics), so it is above
``statebackend``, which ``channels`` is below; it imports nothing else of ``runtime``
and nothing of ``jobmanager``. The data plane (batches, barriers, end of input,
cancel) is ``channels.messages``.

``CheckpointFailureReason`` is the one vocabulary of why a checkpoint failed: the
barrier handlers abort with it, tasks decline with it, the coordinator records and
broadcasts it; ``TaskFailureCause`` says whose error a ``Failed`` reports.

Fields are typed: an enum travels by its name, a record (``TaskMetrics``,
``AckMetrics``, ``TaskStateHandle``) as its own ``encode()`` map, rebuilt by its
``decode``. A frame that does not fit (an unknown enum name, a malformed record)
raises ValueError naming the message and the field: never a silent default.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import msgpack

from statebackend.metadata import TaskStateHandle
from statebackend.metrics import AckMetrics, MetricsRecord, TaskMetrics

E = TypeVar("E", bound=enum.Enum)
M = TypeVar("M", bound="Message")


def from_wire(kind: type[E], name: object) -> E:
    """The member of ``kind`` named ``name``; ValueError naming the known ones if there is
    none (a peer of another version, or a corrupt frame: never guessed)."""
    if not isinstance(name, str) or name not in kind.__members__:
        known = ", ".join(kind.__members__)
        raise ValueError(f"{name!r} is no {kind.__name__} (known: {known})")
    return kind[name]


class CheckpointFailureReason(enum.Enum):
    """Why a checkpoint failed or was given up; the value is the human message.

    Travels by name in ``Decline.reason`` and ``Abort.reason``.
    """

    SUBSUMED = "a newer checkpoint superseded it (its barrier arrived or it completed first)"
    DECLINED = "a task declined the checkpoint (an upstream task cancelled it)"
    EXPIRED = "the checkpoint did not complete within checkpoint_timeout"
    INPUT_ENDED = "the input ended before the checkpoint's barrier could be handled"
    TASK_FAILURE = "a task failed while the checkpoint was pending"
    STATE_WRITE_FAILED = "a task could not write its state file"
    METADATA_WRITE_FAILED = "writing the checkpoint metadata failed"

    @property
    def message(self) -> str:
        return self.value


class TaskFailureCause(enum.Enum):
    """Whose error a task's ``Failed`` reports; the value is the human message (the job
    manager's ``FailureCause`` has a member of the same name for each)."""

    USER_FUNCTION_RAISED = "a user function raised"
    TASK_ERROR = "a task failed"


@dataclass(frozen=True, slots=True)
class Message:
    CODE: ClassVar[int] = -1


# -- task -> job manager ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Register(Message):
    CODE: ClassVar[int] = 1
    task_index: int
    attempt: int
    task_id: str
    pid: int
    host: str
    endpoint: str


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    CODE: ClassVar[int] = 2
    task_index: int
    attempt: int
    metrics: TaskMetrics
    """The task's figures since its attempt started (records, RSS, first record, ...)."""


@dataclass(frozen=True, slots=True)
class Ack(Message):
    """Task's part of checkpoint ``checkpoint_id`` is durable: ``state`` is the handle of
    its state (None without checkpoint storage), ``metrics`` its figures."""

    CODE: ClassVar[int] = 3
    task_index: int
    attempt: int
    checkpoint_id: int
    state: TaskStateHandle | None
    metrics: AckMetrics


@dataclass(frozen=True, slots=True)
class Decline(Message):
    """The task gives up ``checkpoint_id`` for ``reason`` (``detail``: the specifics)."""

    CODE: ClassVar[int] = 4
    task_index: int
    attempt: int
    checkpoint_id: int
    reason: CheckpointFailureReason
    detail: str


@dataclass(frozen=True, slots=True)
class SourceEnded(Message):
    """A source task read all its input; it waits for the final checkpoint."""

    CODE: ClassVar[int] = 5
    task_index: int
    attempt: int


@dataclass(frozen=True, slots=True)
class SinkOutput(Message):
    """Records a collect sink committed for ``checkpoint_id`` (the driver dedupes): a
    list, or a msgpack-packed list that the driver keeps packed until the output is read."""

    CODE: ClassVar[int] = 6
    task_index: int
    attempt: int
    step: str
    subtask: int
    checkpoint_id: int
    records: list[Any] | bytes


@dataclass(frozen=True, slots=True)
class Finished(Message):
    CODE: ClassVar[int] = 7
    task_index: int
    attempt: int
    metrics: TaskMetrics


@dataclass(frozen=True, slots=True)
class Failed(Message):
    """A user function raised (``cause`` USER_FUNCTION_RAISED, ``operator`` names its
    step) or the task hit an error it cannot go on from (TASK_ERROR, ``operator`` is the
    task id)."""

    CODE: ClassVar[int] = 8
    task_index: int
    attempt: int
    cause: TaskFailureCause
    operator: str
    subtask: int
    error: str
    traceback: str
    fatal: bool  # a restart cannot help (e.g. the checkpoint does not fit this job)


@dataclass(frozen=True, slots=True)
class Closed(Message):
    """The task closed its sockets and returns its process to Spark (last message)."""

    CODE: ClassVar[int] = 9
    task_index: int
    attempt: int


@dataclass(frozen=True, slots=True)
class LoopStatus(Message):
    """The answer to ``LoopProbe(round, tag)``: records this task has sent on its output
    channels and received (processed) from its input channels in this attempt."""

    CODE: ClassVar[int] = 10
    task_index: int
    attempt: int
    round: int
    sent: int
    received: int
    tag: int = 0


@dataclass(frozen=True, slots=True)
class SuperstepDone(Message):
    """An iteration's loop head finished superstep ``superstep``: the marker of it came on
    every feedback channel and it updated its keys. ``aggregate``: its share of the
    convergence aggregate (bulk: e.g. the L1 change; delta: keys changed); ``active``:
    its keys in the next workset (bulk: keys updated); ``sent``/``received``: messages
    it sent on the feedback edge in this superstep and absorbed for it (the job manager
    checks the superstep's totals balance); ``seconds``: the superstep's time here."""

    CODE: ClassVar[int] = 11
    task_index: int
    attempt: int
    superstep: int
    aggregate: float
    active: int
    sent: int
    received: int
    seconds: float


@dataclass(frozen=True, slots=True)
class SolutionEmitted(Message):
    """The answer to ``EmitSolution``: the loop head wrote its ``records`` keys' values
    to the iteration's result edge (ahead of any later barrier)."""

    CODE: ClassVar[int] = 12
    task_index: int
    attempt: int
    superstep: int
    records: int


@dataclass(frozen=True, slots=True)
class Rescued(Message):
    """The answer to ``Rescue``: this loop head's keyed state, written as its part of
    rescue snapshot ``checkpoint_id`` (``state``: its handle; None without storage), is
    the state after superstep ``after`` (-1: the state it was loaded or restored with,
    before any superstep of this attempt)."""

    CODE: ClassVar[int] = 13
    task_index: int
    attempt: int
    checkpoint_id: int
    after: int
    state: TaskStateHandle | None


@dataclass(frozen=True, slots=True)
class CompensationInput(Message):
    """The answer to ``CompensationRequest``: what a loop head restored from a rescue
    snapshot (``surviving``: its restored keys and values) and the keys it lacks
    (``lost``: the keys of lost key groups with their side input), each a data-plane
    record frame (``channels.messages.encode_data``) of ``(key, value)`` pairs."""

    CODE: ClassVar[int] = 14
    task_index: int
    attempt: int
    surviving: bytes
    lost: bytes


@dataclass(frozen=True, slots=True)
class Compensated(Message):
    """The answer to ``Compensate``: the loop head set its ``keys`` lost keys to their
    compensated values (and its share of the workset additions)."""

    CODE: ClassVar[int] = 15
    task_index: int
    attempt: int
    keys: int


# -- job manager -> task ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Trigger(Message):
    """Sources only: snapshot and emit barrier(checkpoint_id) between two records."""

    CODE: ClassVar[int] = 20
    checkpoint_id: int
    timestamp: float
    final: bool
    drain: bool = False  # a stop with drain: end event time before the final barrier
    savepoint: bool = False  # kept as a savepoint: written self-contained (whole)


@dataclass(frozen=True, slots=True)
class Complete(Message):
    CODE: ClassVar[int] = 21
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class Abort(Message):
    CODE: ClassVar[int] = 22
    checkpoint_id: int
    reason: CheckpointFailureReason


@dataclass(frozen=True, slots=True)
class Cancel(Message):
    """Stop now: close sockets and end the task (the attempt failed or the job was cancelled)."""

    CODE: ClassVar[int] = 23
    reason: str


@dataclass(frozen=True, slots=True)
class Alive(Message):
    """The job manager's answer to a heartbeat: tasks end themselves when it goes silent.
    To a source with watermark alignment (``max_drift``): the lowest watermark of the
    job's aligned sources (None while none has one)."""

    CODE: ClassVar[int] = 24
    aligned_watermark: float | None = None


@dataclass(frozen=True, slots=True)
class LoopProbe(Message):
    """A wave of Mattern's four counters: answer with ``LoopStatus`` for ``round`` and
    ``tag``. Tag 0: termination detection (jobs with loops, after every source ended);
    tag n > 0: the drain before synchronous checkpoint n (every source halted)."""

    CODE: ClassVar[int] = 25
    round: int
    tag: int = 0


@dataclass(frozen=True, slots=True)
class Halt(Message):
    """Sources only, synchronous snapshots: emit nothing more until checkpoint
    ``checkpoint_id`` completes or is aborted (the job drains, then every task snapshots)."""

    CODE: ClassVar[int] = 27
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class KillSelf(Message):
    """Fault injection on a task the job manager cannot signal (on another host): send
    yourself ``signal`` at once, wherever the task is (SIGKILL dies, SIGSTOP freezes)."""

    CODE: ClassVar[int] = 26
    signal: int
    label: str


@dataclass(frozen=True, slots=True)
class SuperstepGo(Message):
    """Iteration loop heads only: start superstep ``superstep`` (send its messages on the
    feedback edge, then its marker on every feedback channel). Sent once every head
    reported ``SuperstepDone`` of the one before (and, blocking or tail, its checkpoint
    completed).

    ``snapshot_before``: a head checkpoint of the state after ``superstep - 1`` is on its
    way: the head starts this superstep only once it took that snapshot (its barrier then
    precedes this superstep's messages on every feedback channel). ``snapshot_after``: a
    tail checkpoint of the state after ``superstep``: the head holds its barrier until its
    own update of this superstep is done."""

    CODE: ClassVar[int] = 28
    superstep: int
    snapshot_before: int | None = None
    snapshot_after: int | None = None


@dataclass(frozen=True, slots=True)
class EmitSolution(Message):
    """Iteration loop heads only: the iteration ended after ``superstep``; write your keys'
    values to the result edge and answer ``SolutionEmitted`` (the final checkpoint,
    which commits them, follows)."""

    CODE: ClassVar[int] = 29
    superstep: int


@dataclass(frozen=True, slots=True)
class Rescue(Message):
    """Iteration loop heads only, optimistic recovery: the attempt failed; write your keyed
    state now (between two batches: the state after some superstep) as your part of
    rescue snapshot ``checkpoint_id``, and answer ``Rescued``. The job manager ends the
    attempt after it."""

    CODE: ClassVar[int] = 30
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class CompensationRequest(Message):
    """Iteration loop heads only, restored from a rescue snapshot, input loaded: answer
    ``CompensationInput`` (the restored keys' values, the lost keys' side input)."""

    CODE: ClassVar[int] = 31


@dataclass(frozen=True, slots=True)
class Compensate(Message):
    """Iteration loop heads only: the compensation function's result for every lost key
    (``values``: a record frame of ``(key, value)``) and the keys it adds to the workset
    (``workset``: a record frame of keys; delta iterations); a head takes the keys it
    holds and answers ``Compensated``."""

    CODE: ClassVar[int] = 32
    values: bytes
    workset: bytes


Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]
_RECORDS = (MetricsRecord, TaskStateHandle)  # typed records: their own encode/decode


def _codec(hint: Any) -> Codec | None:
    """How a field of type ``hint`` goes on the wire and back; None: as it is."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        codec = _codec(inner[0]) if len(inner) == 1 else None
        if codec is None:
            return None
        to_wire, back = codec
        return (
            lambda v: None if v is None else to_wire(v),
            lambda w: None if w is None else back(w),
        )
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        kind: type[enum.Enum] = hint
        return (lambda v: v.name, lambda w: from_wire(kind, w))
    if isinstance(hint, type) and issubclass(hint, _RECORDS):
        record: Any = hint
        return (lambda v: v.encode(), record.decode)
    return None


@dataclass(frozen=True, slots=True)
class _Wire:
    """A message class's fields in order, with the codec of each typed one."""

    names: tuple[str, ...]
    codecs: tuple[Codec | None, ...]
    plain: bool  # no typed field: packed as it is


def _wire(cls: type[Message]) -> _Wire:
    hints = typing.get_type_hints(cls)
    names = tuple(f.name for f in dataclasses.fields(cls))
    codecs = tuple(_codec(hints[name]) for name in names)
    return _Wire(names, codecs, all(c is None for c in codecs))


_TYPES: dict[int, type[Message]] = {
    cls.CODE: cls
    for cls in (
        Register,
        Heartbeat,
        Ack,
        Decline,
        SourceEnded,
        SinkOutput,
        Finished,
        Failed,
        Closed,
        LoopStatus,
        SuperstepDone,
        SolutionEmitted,
        Trigger,
        Complete,
        Abort,
        Cancel,
        Alive,
        LoopProbe,
        KillSelf,
        Halt,
        SuperstepGo,
        EmitSolution,
        Rescued,
        CompensationInput,
        Compensated,
        Rescue,
        CompensationRequest,
        Compensate,
    )
}
_WIRES: dict[type[Message], _Wire] = {}


def _wire_of(cls: type[Message]) -> _Wire:
    """The wire layout of ``cls`` (computed once per class)."""
    wire = _WIRES.get(cls)
    if wire is None:
        wire = _WIRES[cls] = _wire(cls)
    return wire


def peer_identity(task_index: int, attempt: int, run_id: str) -> bytes:
    """The ZeroMQ identity of a task's control socket: ``"<task index>:<attempt>:<run>"``.

    The run is part of it because a ROUTER refuses a second peer with an identity in use
    (ZMQ_ROUTER_HANDOVER off): a task process of another run that still reconnects to
    the port it knew (a port the operating system handed out again) would otherwise
    hold a new task's identity, and the new task could never register."""
    return f"{task_index}:{attempt}:{run_id}".encode()


def of_attempt(msg: Message, attempt: int) -> bool:
    """The fence of the control plane: whether ``msg`` counts for attempt ``attempt``.

    Every message a task sends carries the attempt it belongs to. A task of an earlier
    attempt can outlive it (alive behind a network partition, frozen, slow to die) and
    reach the job manager after the next attempt started: its acks, declines, sink
    output and reports must not count. Job-manager messages carry no attempt (a task's
    socket is addressed by attempt) and always pass."""
    return getattr(msg, "attempt", attempt) == attempt


def encode(msg: Message) -> bytes:
    wire = _wire_of(type(msg))
    fields = [getattr(msg, name) for name in wire.names]
    if not wire.plain:
        fields = [v if c is None else c[0](v) for v, c in zip(fields, wire.codecs, strict=True)]
    packed: bytes = msgpack.packb([msg.CODE, *fields], use_bin_type=True)
    return packed


def decode(frame: bytes) -> Message:
    """The message in ``frame``; ValueError if it is none (unknown code, fields that do
    not fit the message's types)."""
    code, *fields = msgpack.unpackb(frame, raw=False, strict_map_key=False, use_list=False)
    try:
        cls = _TYPES[code]
    except (KeyError, TypeError):
        raise ValueError(f"unknown control message code {code!r}") from None
    return build(cls, fields)


def build(cls: type[M], fields: list[Any]) -> M:
    """A ``cls`` from its decoded wire ``fields`` (see `decode`)."""
    wire = _wire_of(cls)
    if not wire.plain:
        if len(fields) > len(wire.codecs):
            raise ValueError(f"{cls.__name__}: {len(fields)} fields, expected {len(wire.names)}")
        out = []
        for name, value, codec in zip(wire.names, fields, wire.codecs, strict=False):
            try:
                out.append(value if codec is None else codec[1](value))
            except Exception as err:
                raise ValueError(f"{cls.__name__}.{name}: {err}") from err
        fields = out
    try:
        return cls(*fields)
    except TypeError as err:
        raise ValueError(f"{cls.__name__}: {err}") from None

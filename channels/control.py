"""The control plane: messages between tasks (DEALER) and the job manager (ROUTER).

Every message is a frozen, slotted dataclass; ``encode`` packs it as a msgpack
array ``[code, *fields]`` and ``decode`` rebuilds it. Tasks and the job manager
both import this module; it imports nothing of ``runtime`` or ``jobmanager``.
The data plane (batches, barriers, end of input, cancel) is ``channels.messages``.

``CheckpointFailureReason`` is the one vocabulary of why a checkpoint failed: the
barrier handlers abort with it, tasks decline with its name, the coordinator
records and broadcasts it.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack


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

    @classmethod
    def from_wire(cls, name: str) -> CheckpointFailureReason:
        """The reason named ``name``; an unknown name (a newer peer) counts as DECLINED."""
        try:
            return cls[name]
        except KeyError:
            return cls.DECLINED


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
    records_in: int
    records_out: int
    rss_bytes: int
    first_record_at: float  # wall clock of the first record this attempt processed, 0 if none
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``statebackend.metrics.TaskMetrics.encode()`` (empty from an older task)."""


@dataclass(frozen=True, slots=True)
class Ack(Message):
    """Task's part of checkpoint ``checkpoint_id`` is durable.

    ``state`` is ``statebackend.metadata.TaskStateHandle.encode()`` of the task's state
    file (decode it with ``TaskStateHandle.decode``), or None without checkpoint storage.
    """

    CODE: ClassVar[int] = 3
    task_index: int
    attempt: int
    checkpoint_id: int
    state: dict[str, Any] | None
    metrics: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Decline(Message):
    """The task gives up ``checkpoint_id``: ``reason`` is a CheckpointFailureReason name."""

    CODE: ClassVar[int] = 4
    task_index: int
    attempt: int
    checkpoint_id: int
    reason: str
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
    metrics: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Failed(Message):
    """A user function raised (or the task hit an error it cannot go on from)."""

    CODE: ClassVar[int] = 8
    task_index: int
    attempt: int
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


# -- job manager -> task ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Trigger(Message):
    """Sources only: snapshot and emit barrier(checkpoint_id) between two records."""

    CODE: ClassVar[int] = 20
    checkpoint_id: int
    timestamp: float
    final: bool
    drain: bool = False  # a stop with drain: end event time before the final barrier


@dataclass(frozen=True, slots=True)
class Complete(Message):
    CODE: ClassVar[int] = 21
    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class Abort(Message):
    """``reason`` is a CheckpointFailureReason name."""

    CODE: ClassVar[int] = 22
    checkpoint_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Cancel(Message):
    """Stop now: close sockets and end the task (the attempt failed or the job was cancelled)."""

    CODE: ClassVar[int] = 23
    reason: str


@dataclass(frozen=True, slots=True)
class Alive(Message):
    """The job manager's answer to a heartbeat: tasks end themselves when it goes silent."""

    CODE: ClassVar[int] = 24


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
        Trigger,
        Complete,
        Abort,
        Cancel,
        Alive,
        LoopProbe,
        KillSelf,
        Halt,
    )
}


def of_attempt(msg: Message, attempt: int) -> bool:
    """The fence of the control plane: whether ``msg`` counts for attempt ``attempt``.

    Every message a task sends carries the attempt it belongs to. A task of an earlier
    attempt can outlive it (alive behind a network partition, frozen, slow to die) and
    reach the job manager after the next attempt started: its acks, declines, sink
    output and reports must not count. Job-manager messages carry no attempt (a task's
    socket is addressed by attempt) and always pass."""
    return getattr(msg, "attempt", attempt) == attempt


def encode(msg: Message) -> bytes:
    fields = [getattr(msg, f.name) for f in dataclasses.fields(msg)]
    packed: bytes = msgpack.packb([msg.CODE, *fields], use_bin_type=True)
    return packed


def decode(frame: bytes) -> Message:
    code, *fields = msgpack.unpackb(frame, raw=False, strict_map_key=False, use_list=False)
    try:
        cls = _TYPES[code]
    except KeyError:
        raise ValueError(f"unknown control message code {code!r}") from None
    return cls(*fields)

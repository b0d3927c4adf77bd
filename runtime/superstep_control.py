"""Control messages of superstep iterations (``runtime.iterations``): the agreement of
all loop heads through the job manager, the rescue read of optimistic recovery, and
the result hand-over.

One superstep, seen from the job manager::

    JM  -> every task   SuperstepGo(k, stop=False)       start superstep k
    task -> JM          SuperstepDone(k, aggregate, ...) my markers for k are aligned
    (the JM waits for every task's Done(k), never for a time-out, then decides)
    JM  -> every task   SuperstepGo(k + 1, ...) or SuperstepGo(k, stop=True)
    task -> JM          PartitionState(k, state)         (after stop, or a RescueRequest)

The encoding is the control plane's (``runtime.control.encode``: a msgpack array
``[code, *fields]``); ``decode`` knows these codes and falls back to
``runtime.control.decode`` for the shared ones (Register, Failed, Cancel, KillSelf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import msgpack

from runtime import control as P

__all__ = ["PartitionState", "RescueRequest", "SuperstepDone", "SuperstepGo", "decode"]


@dataclass(frozen=True, slots=True)
class SuperstepDone(P.Message):
    """Task -> JM: superstep ``superstep`` is done here. ``aggregate`` is this partition's
    share of the convergence aggregate, ``active`` its workset size (delta iterations),
    ``durable`` the newest superstep whose checkpoint this task has fully written (-1:
    none), ``seconds`` the superstep's local compute time; ``sent`` / ``received``: the
    messages this task sent on the feedback edge in superstep k (to itself too) and the
    ones it received for k (everything ahead of the markers of k): the counts of the
    loop termination's waves (``jobmanager.termination.Wave``)."""

    CODE: ClassVar[int] = 40
    task_index: int
    attempt: int
    superstep: int
    aggregate: float
    active: int
    durable: int
    seconds: float
    sent: int = 0
    received: int = 0


@dataclass(frozen=True, slots=True)
class SuperstepGo(P.Message):
    """JM -> task: start ``superstep`` (``stop`` False), or the iteration ended after
    ``superstep``: send your partition (``PartitionState``) and finish."""

    CODE: ClassVar[int] = 41
    superstep: int
    stop: bool


@dataclass(frozen=True, slots=True)
class RescueRequest(P.Message):
    """JM -> surviving task (optimistic recovery): send your partition as it was after
    ``superstep``, the newest superstep every task agreed on."""

    CODE: ClassVar[int] = 42
    superstep: int


@dataclass(frozen=True, slots=True)
class PartitionState(P.Message):
    """Task -> JM: this task's partition of the iteration state after ``superstep``
    (msgpack of ``[solution items, workset]``)."""

    CODE: ClassVar[int] = 43
    task_index: int
    attempt: int
    superstep: int
    payload: bytes


_TYPES: dict[int, type[P.Message]] = {
    cls.CODE: cls for cls in (SuperstepDone, SuperstepGo, RescueRequest, PartitionState)
}


def decode(frame: bytes) -> P.Message:
    code, *fields = msgpack.unpackb(frame, raw=False, strict_map_key=False, use_list=False)
    cls = _TYPES.get(code)
    if cls is None:
        return P.decode(frame)
    return P.build(cls, fields)

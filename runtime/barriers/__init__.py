"""Barrier handling: the ABS state machines on a task's input side.

A task feeds every in-band control event it reads from its input channels
(barrier, cancel barrier, end of input) and every control-plane abort into one
handler, which decides; the task acts through `CheckpointActions`.

* `BarrierAligner` (``exactly_once``): ABS alignment, Carbone et al. 2015,
  algorithm 1. On barrier(n) from channel c: block c; when barrier(n) has come
  from every live input: snapshot, forward barrier(n), unblock all.
* `BarrierTracker` (``at_least_once``): the same bookkeeping without blocking;
  records after a barrier may enter the snapshot, so replay can duplicate them.
* `UnalignedHandler` (``unaligned``, and ``aligned_timeout``): Chandy-Lamport. On the
  first barrier(n): snapshot, forward barrier(n), block nothing; records arriving on
  inputs without barrier(n) yet are logged as channel state until it arrives. With
  a timeout, a checkpoint aligns first and turns unaligned when alignment is slow.
* `BackEdgeLogger` (both modes, tasks with back-edge inputs; Carbone et al. 2015,
  algorithm 2): the handlers above align on the *regular* inputs only; once
  checkpoint n is triggered the logger is `LoggingBackEdges`: every record that
  arrives on a back-edge channel is logged (and processed as usual) until
  barrier(n) comes back on each back-edge channel; that barrier is consumed, not
  forwarded, and the log completes the task's part of checkpoint n. Back-edge
  channels are never blocked.

The states follow Flink's ``BarrierHandlerState``: the aligner holds exactly one
state object (`WaitingForBarrier` or `Aligning`) whose event methods return the
next state.

Contracts the handlers rely on (a violation raises `BarrierProtocolError`):

* channels are FIFO: each channel delivers at most one barrier per checkpoint,
  barrier ids on a channel strictly increase, and nothing follows end of input;
* after ``block(c)`` the task delivers nothing from ``c`` until ``unblock_all()``.

Modules: ``protocol`` (the task's side, the handler interface), ``aligner``,
``tracker``, ``unaligned``, ``backedges``; everything is importable from ``runtime.barriers``.

Threading: task-loop thread only; the handlers call back into the task
synchronously, from inside the ``on_*`` / ``abort`` call that caused the action.
"""

from runtime.barriers.aligner import AlignerState, Aligning, BarrierAligner, WaitingForBarrier
from runtime.barriers.backedges import BackEdgeLogger, LoggerState, LoggingBackEdges, NotLogging
from runtime.barriers.protocol import (
    NO_CHECKPOINT,
    BarrierHandler,
    BarrierProtocolError,
    CheckpointActions,
)
from runtime.barriers.tracker import BarrierTracker, PendingBarriers
from runtime.barriers.unaligned import (
    AligningWithTimeout,
    Idle,
    Recording,
    UnalignedHandler,
    UnalignedState,
)

__all__ = [
    "NO_CHECKPOINT",
    "AlignerState",
    "Aligning",
    "AligningWithTimeout",
    "BackEdgeLogger",
    "BarrierAligner",
    "BarrierHandler",
    "BarrierProtocolError",
    "BarrierTracker",
    "CheckpointActions",
    "Idle",
    "LoggerState",
    "LoggingBackEdges",
    "NotLogging",
    "PendingBarriers",
    "Recording",
    "UnalignedHandler",
    "UnalignedState",
    "WaitingForBarrier",
]

"""Faults a task injects into itself (``jobmanager.faults`` resolves them to `TaskFault`s),
by `FaultKind`:

* ``KILL_DURING_ALIGNMENT`` — SIGKILL when the task starts aligning a checkpoint
  >= ``checkpoint_id`` (its first barrier arrives while other inputs are live);
* ``KILL_DURING_SNAPSHOT`` — SIGKILL half way through writing the state file;
* ``KILL_DURING_BACKEDGE_LOG`` — SIGKILL a loop head while it logs its back-edges for
  a checkpoint >= ``checkpoint_id`` (after its snapshot, before the barrier came back);
* ``RAISE_AT_RECORD`` — step ``operator`` raises once it has seen ``record`` records.

All hooks sit off the per-record path: the first two run per barrier or per
checkpoint; the raise wraps only the operator it targets (`RaiseAtRecord`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import Any, NoReturn

from runtime.barriers import BarrierHandler
from runtime.errors import AbsflowError
from runtime.operators import Operator
from runtime.task_environment import FaultKind, TaskFault
from statebackend.storage import CheckpointStorage


class InjectedFailure(AbsflowError, RuntimeError):
    """The failure a ``RaiseAt`` fault makes a step raise."""


class RaiseAtRecord(Operator):
    """Raises once the wrapped operator has seen ``record`` records."""

    def __init__(self, inner: Operator, record: int) -> None:
        self.step, self.name, self.watermark = inner.step, inner.name, inner.watermark
        self.inner, self.limit, self.seen = inner, record, 0
        self.keyed_state, self.tracks_changes = inner.keyed_state, inner.tracks_changes

    def process(self, batch: list[Any], side: int = 0) -> list[Any]:
        if self.seen + len(batch) >= self.limit:
            raise InjectedFailure(f"injected failure at record {self.limit} of '{self.name}'")
        self.seen += len(batch)
        return self.inner.process(batch, side)

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)


def _die() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFailure("SIGKILL did not end the process")  # not reached


class TaskFaults:
    """The faults of one task in one attempt."""

    def __init__(self, faults: Sequence[TaskFault], task_index: int, attempt: int) -> None:
        self._faults = [f for f in faults if f.task_index == task_index and f.attempt == attempt]
        self._alignment = [f for f in self._faults if f.kind is FaultKind.KILL_DURING_ALIGNMENT]

    def wrap(self, op: Operator) -> Operator:
        """``op``, wrapped in `RaiseAtRecord` if a fault targets its step."""
        for fault in self._faults:
            if fault.kind is FaultKind.RAISE_AT_RECORD and fault.operator == op.name:
                op = RaiseAtRecord(op, fault.record or 0)
        return op

    def _fires(self, kind: FaultKind, checkpoint_id: int) -> bool:
        return any(f.kind is kind and checkpoint_id >= (f.checkpoint_id or 0) for f in self._faults)

    def before_barrier(self, handler: BarrierHandler, checkpoint_id: int) -> None:
        """Called before ``handler`` sees a barrier: kill if it starts an alignment."""
        if (
            self._alignment
            and checkpoint_id > handler.latest_checkpoint_id
            and len(handler.live_channels) > 1
            and self._fires(FaultKind.KILL_DURING_ALIGNMENT, checkpoint_id)
        ):
            _die()

    def while_logging(self, checkpoint_id: int) -> None:
        """A back-edge record of checkpoint ``checkpoint_id`` is being logged: kill if due."""
        if self._faults and self._fires(FaultKind.KILL_DURING_BACKEDGE_LOG, checkpoint_id):
            _die()

    def kill_during_compaction(self, checkpoint_id: int) -> bool:
        """Whether a compaction started at checkpoint ``checkpoint_id`` must die half way
        through writing its merged file (`die_writing` with its path)."""
        return self._fires(FaultKind.KILL_DURING_COMPACTION, checkpoint_id)

    def kill_during_snapshot(self, checkpoint_id: int) -> bool:
        """Whether writing checkpoint ``checkpoint_id``'s state file must die half way."""
        return self._fires(FaultKind.KILL_DURING_SNAPSHOT, checkpoint_id)

    @staticmethod
    def die_writing(
        storage: CheckpointStorage, checkpoint_id: int, task_id: str, chain: str | None = None
    ) -> NoReturn:
        """Start the state file (or the chain file at ``chain``, relative to the root),
        flush part of it, and SIGKILL this process."""
        path = storage.task_state_path(checkpoint_id, task_id)
        if chain is not None:
            path = storage.fs.join(storage.root, *chain.split("/"))
        with storage.fs.open_write_part(path) as out:  # as write_task_state does
            out.write(b"ABSF-partial")
            out.flush()
            _die()

"""A task's part of each checkpoint: the `CheckpointActions` its barrier handler calls.

A checkpoint is taken in four steps, each its own method so that later work
(back-edge logging, channel state) can slot in between:

1. **capture** — the synchronous part: every operator's state, serialized, between
   two batches (``OperatorChain.capture``);
2. **forward** — the barrier goes out on every output channel, behind all records
   sent before it;
3. **write** — the asynchronous part: the state file (and the chain file of incremental
   keyed state, `runtime.changelog`) is written in one background thread while the task
   goes on (none without storage; a small state, held inline, is acked at once);
4. **ack** — once written, ``Ack`` with the state handle and the metrics (or
   ``Decline`` with STATE_WRITE_FAILED when the write failed: the job goes on). If the
   task's first write fails and a probe file cannot be written either, this executor
   cannot write the storage at all (no endpoint, bucket or credentials), which no
   restart fixes: `collect_writes` raises CheckpointStorageError naming the storage URL
   and the host, reported as fatal (a probe that succeeds: a decline).

A task with back-edge inputs (a loop head, cyclic ABS) slots one step in between
forward and write: it **logs** the records arriving on its back-edges until the
barrier comes back on each (`log`, then `back_edges_logged` from the handler's
`BackEdgeLogger`); the log becomes the operator state of the chain's head step
(the loop head, which holds no state of its own) and is written with the rest.

Threading: task-loop thread, except `_write` (the writer thread), which touches only
the captured, immutable blobs and the storage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from channels.messages import Barrier, CancelBarrier, EndOfInput, Event
from runtime import control as P
from runtime.barriers import (
    BarrierProtocolError,
)
from runtime.chain import Capture, pack
from runtime.control import CheckpointFailureReason
from runtime.errors import CheckpointStorageError
from runtime.inputs import BlockedChannels
from runtime.snapshot_modes import InFlightKind, InFlightLog
from runtime.task_faults import TaskFaults
from runtime.task_io import Output
from runtime.watermarks import watermark_metric
from statebackend.metadata import TaskStateHandle
from statebackend.metrics import AckMetrics
from statebackend.snapshot import OperatorSnapshot, SpooledBlob
from statebackend.spill import SpillBuffer
from statebackend.storage import CheckpointStorage

log = logging.getLogger("absflow.task")


class Snapshotted(Protocol):
    """What the checkpointer needs of the task's operators (``OperatorChain``)."""

    def capture(
        self, checkpoint_id: int, storage: CheckpointStorage | None, savepoint: bool = False
    ) -> Capture: ...
    def finish(self) -> None: ...
    def notify_complete(self, checkpoint_id: int) -> None: ...


@dataclass(frozen=True, slots=True)
class TaskIdentity:
    index: int
    attempt: int
    task_id: str
    host: str = "?"  # the executor's address (named in storage errors)


@dataclass(slots=True)
class _PendingWrite:
    checkpoint_id: int
    future: Future[tuple[TaskStateHandle, float, int]]
    metrics: AckMetrics


@dataclass(slots=True)
class _OpenLog:
    """A checkpoint past its snapshot whose in-flight records are still logged."""

    checkpoint_id: int
    captured: Capture
    metrics: AckMetrics
    frames: SpillBuffer
    records: int = 0
    nbytes: int = 0


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


class TaskCheckpointer:
    """Implements ``runtime.barriers.CheckpointActions`` for one task. ``start()`` starts
    the writer thread, ``close()`` waits for it; ``completed_final``: the task ends."""

    def __init__(
        self,
        task: TaskIdentity,
        chain: Snapshotted,
        outputs: Sequence[Output],
        storage: CheckpointStorage | None,
        send: Callable[[P.Message], None],
        inputs: BlockedChannels | None,
        faults: TaskFaults,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        writer: Executor | None = None,
        counts: Callable[[], tuple[int, int]] = lambda: (0, 0),
        in_flight: InFlightLog | None = None,
        synchronous: bool = False,
        overtake: bool = False,
    ) -> None:
        """``counts()``: the task's (records in, records out) so far; ``in_flight``: set
        for a task that logs in-flight records (back-edges, or unaligned channel state);
        ``overtake``: unaligned barriers also go out on the priority path, first."""
        self.task, self.chain, self.outputs, self.storage = task, chain, outputs, storage
        self._send, self._inputs, self._faults = send, inputs, faults
        self._clock, self._wall_clock = clock, wall_clock
        self._writer = writer
        self._counts = counts
        self._in_flight = in_flight
        self._log: _OpenLog | None = None
        self._owns_writer = writer is None
        self._pending: list[_PendingWrite] = []
        self._wrote_state = False  # a state file was written: the storage is reachable
        self.final_checkpoint: int | None = None
        self.completed_final = False
        self._aborted: set[int] = set()  # checkpoints whose pending writes are moot
        # Synchronous snapshots (Naiad's, the paper's baseline): a source halts on Halt(n)
        # and emits nothing until n ends; once the job manager proved the job drained, the
        # barriers cross empty channels and every task writes its state before it goes on.
        self.synchronous = synchronous
        self.overtake = overtake
        self.on_log_opened: Callable[[], None] | None = None
        """Called when a checkpoint's in-flight log opens (records read but not processed
        yet are logged then: `runtime.overtaking`)."""
        self._halted_for: int | None = None

    def start(self) -> None:
        writer = self._executor()
        if self.storage is not None:  # an object store's client, built before the first write
            writer.submit(self.storage.warm_up)

    def _executor(self) -> Executor:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="absflow-snapshot")
        return self._writer

    # -- CheckpointActions -----------------------------------------------------------------
    def block(self, channel: int) -> None:
        if self._inputs is None:
            raise BarrierProtocolError(f"task {self.task.task_id} has no inputs to block")
        self._inputs.block(channel)

    def unblock_all(self) -> None:
        """Nothing to do here: the task loop replays the buffers of channels the handler
        no longer blocks, before anything newer."""

    def trigger_checkpoint(self, barrier: Barrier, alignment_started_at: float) -> None:
        now = self._clock()
        # The first barrier arrived at alignment_started_at on the handler's clock (this
        # one): its wall-clock time, against the coordinator's trigger time.
        first_barrier_wall = self._wall_clock() - (now - alignment_started_at)
        metrics = AckMetrics(
            start_delay_ms=_ms(first_barrier_wall - barrier.timestamp),
            alignment_ms=_ms(now - alignment_started_at),
            spilled_bytes=self._inputs.spilled_bytes if self._inputs is not None else 0,
        )
        self.checkpoint(barrier, metrics)

    def abort_checkpoint(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        if self._log is not None and self._log.checkpoint_id == checkpoint_id:
            self._drop_log()
        self.forward(CancelBarrier(checkpoint_id))
        self.decline(checkpoint_id, reason, reason.message)

    def end_of_all_inputs(self) -> None:
        self.forward(EndOfInput())

    def back_edges_logged(self, checkpoint_id: int) -> None:
        self._log_complete(checkpoint_id)

    def channel_state_logged(self, checkpoint_id: int) -> None:
        self._log_complete(checkpoint_id)

    def _log_complete(self, checkpoint_id: int) -> None:
        """The in-flight log of ``checkpoint_id`` is complete: write it with the state."""
        log, spec = self._log, self._in_flight
        if log is None or spec is None or log.checkpoint_id != checkpoint_id:
            raise BarrierProtocolError(
                f"task {self.task.task_id}: the in-flight log of checkpoint {checkpoint_id} "
                "completed, but it is not the one being logged"
            )
        self._log = None
        frames = log.frames
        spilled = log.metrics.spilled_bytes + frames.spilled_bytes
        if spec.kind is InFlightKind.BACKEDGE:
            metrics = dataclasses.replace(
                log.metrics,
                backedge_records=log.records,
                backedge_bytes=log.nbytes,
                spilled_bytes=spilled,
            )
        else:
            metrics = dataclasses.replace(
                log.metrics,
                channel_state_records=log.records,
                channel_state_bytes=log.nbytes,
                spilled_bytes=spilled,
            )
        logged = [frames.popleft() for _ in range(len(frames))]
        frames.close()
        captured = log.captured
        if self.storage is not None:
            snapshots = dict(captured.snapshots)
            layout = dict(captured.layout)
            snapshots[spec.step] = OperatorSnapshot(pack(logged), None, None)
            layout[spec.step] = spec.layout
            captured = Capture(snapshots, layout, captured.keys, captured.chains, captured.stores)
        self._write_or_ack(checkpoint_id, captured, metrics)

    # -- the in-flight log (back-edges, channel state) ---------------------------------------
    def log(self, frame: bytes, records: int) -> None:
        """A data frame arrived on a channel being logged (see the handler's
        ``logging_channels``): it belongs to the snapshot being completed."""
        log = self._log
        if log is None:
            raise BarrierProtocolError(
                f"task {self.task.task_id}: a frame to log, but no checkpoint logs"
            )
        log.frames.append(frame)
        log.records += records
        log.nbytes += len(frame)

    def _drop_log(self) -> None:
        if self._log is not None:
            self._log.frames.close()
            self._log = None

    # -- sources: the job manager triggers -------------------------------------------------
    def trigger_source(self, trigger: P.Trigger) -> None:
        """A source's checkpoint, between two batches; the final one ends its output."""
        barrier = Barrier(
            trigger.checkpoint_id, trigger.timestamp, trigger.final, trigger.savepoint
        )
        metrics = AckMetrics(start_delay_ms=_ms(self._wall_clock() - trigger.timestamp))
        self.checkpoint(barrier, metrics)
        if trigger.final:
            self.end_of_all_inputs()
        elif self.synchronous:
            self._halted_for = trigger.checkpoint_id

    def halt(self, checkpoint_id: int) -> None:
        """Synchronous snapshots: until checkpoint ``checkpoint_id`` ends, a source emits
        nothing (its trigger follows the drain) and no task fires a processing-time timer."""
        if not self.synchronous:
            raise BarrierProtocolError(
                f"task {self.task.task_id}: halt for checkpoint {checkpoint_id}, but snapshots "
                "are not synchronous"
            )
        self._halted_for = checkpoint_id

    @property
    def halted(self) -> bool:
        """Synchronous snapshots: the checkpoint this task halted for is running."""
        return self._halted_for is not None

    # -- the steps -----------------------------------------------------------------------
    def checkpoint(self, barrier: Barrier, metrics: AckMetrics) -> None:
        """Capture, forward, then write and ack (ack at once without storage)."""
        n = barrier.checkpoint_id
        if barrier.final:
            self.final_checkpoint = n
            self.chain.finish()
        captured, metrics = self.capture(n, metrics, barrier.savepoint)
        self.forward(barrier)
        spec = self._in_flight
        if spec is not None:  # written once the log is complete (the handler says when)
            self._drop_log()  # an older one still logging was subsumed
            self._log = _OpenLog(
                n, captured, metrics, SpillBuffer(spec.spill_dir, spec.spill_threshold)
            )
            if self.on_log_opened is not None:
                self.on_log_opened()
            return
        self._write_or_ack(n, captured, metrics)

    def _write_or_ack(self, n: int, captured: Capture, metrics: AckMetrics) -> None:
        if self.storage is None:
            self.ack(n, None, dataclasses.replace(metrics, async_ms=0.0))
            return
        self.write(n, captured, metrics)

    def capture(
        self, checkpoint_id: int, metrics: AckMetrics, savepoint: bool = False
    ) -> tuple[Capture, AckMetrics]:
        """The chain's state (whole for a ``savepoint``), and ``metrics`` with the
        capture's figures."""
        started = time.perf_counter()
        captured = self.chain.capture(checkpoint_id, self.storage, savepoint)
        # Counts at the snapshot (a consistent cut): the job's committed record figures.
        records_in, records_out = self._counts()
        return captured, dataclasses.replace(
            metrics,
            sync_ms=_ms(time.perf_counter() - started),
            keys=captured.keys,
            records_in=records_in,
            records_out=records_out,
            watermark=watermark_metric(getattr(self.chain, "watermark", None)),
        )

    def forward(self, event: Event) -> None:
        """Send ``event`` behind every record sent before it; an unaligned barrier first
        overtakes them on every channel's priority path (then marks their end in band)."""
        if self.overtake and isinstance(event, Barrier) and not event.final:
            for output in self.outputs:
                output.send_priority(event)
        for output in self.outputs:
            output.send_event(event)

    def write(self, checkpoint_id: int, captured: Capture, metrics: AckMetrics) -> None:
        """Ack a small state at once, inline (if no older write waits for its ack: acks go
        in order); else start writing the state file: `collect_writes` acks it when done."""
        die = self._faults.kill_during_snapshot(checkpoint_id)
        if (
            not die
            and not self._pending
            and self.storage is not None
            and not captured.chains
            and not captured.stores
        ):
            started = time.perf_counter()
            handle = self.storage.inline_handle(captured.snapshots, captured.layout)
            if handle is not None:  # not after the writer thread and this task's next turn
                self._wrote_state = True
                metrics = dataclasses.replace(
                    metrics,
                    state_bytes=handle.size,
                    full_state_bytes=handle.size,
                    async_ms=_ms(time.perf_counter() - started),
                )
                self.ack(checkpoint_id, handle, metrics)
                return
        future = self._executor().submit(self._write, checkpoint_id, captured, die)
        self._pending.append(_PendingWrite(checkpoint_id, future, metrics))
        if self.synchronous:  # the task does nothing else meanwhile
            self.collect_writes(wait=True)

    def _write(
        self, checkpoint_id: int, captured: Capture, die: bool
    ) -> tuple[TaskStateHandle, float, int]:
        storage = self.storage
        if storage is None:
            raise BarrierProtocolError("a state file write without checkpoint storage")
        chains = captured.chains
        if die:  # fault injection: die with a half-written state (or chain) file on disk
            at = None if chains is None else chains.path
            TaskFaults.die_writing(storage, checkpoint_id, self.task.task_id, at)
        started = time.perf_counter()
        refs, written = chains.write(storage) if chains is not None else ({}, 0)
        stores = {}
        snapshots = dict(captured.snapshots)
        spooled: list[SpooledBlob] = []
        try:
            for store in captured.stores:  # RocksDB: the SST files not uploaded before
                if store.canonical:  # a savepoint: self-contained, spooled
                    spooled.append(store.spool())
                    snapshots[store.operator] = dataclasses.replace(
                        snapshots[store.operator], keyed_state=spooled[-1]
                    )
                    continue
                stores[store.operator], uploaded = store.write(
                    storage, self.task.task_id, checkpoint_id
                )
                written += uploaded
            handle = storage.write_task_state(
                checkpoint_id, self.task.task_id, snapshots, captured.layout
            )
        finally:
            for blob in spooled:
                blob.discard()
        if refs or stores:  # incremental keyed state: its chains, and the bytes of this delta
            handle = dataclasses.replace(handle, chains=refs, stores=stores)
        return handle, _ms(time.perf_counter() - started), written

    @property
    def writes_pending(self) -> bool:
        return bool(self._pending)

    def collect_writes(self, wait: bool = False) -> None:
        """Ack (or decline) every finished write, oldest first; with ``wait``, all of them.
        Raises CheckpointStorageError when no write of this task has succeeded yet."""
        still = []
        for pending in self._pending:
            if not wait and not pending.future.done():
                still.append(pending)
                continue
            n, metrics = pending.checkpoint_id, pending.metrics
            if n in self._aborted:  # its files are gone, or about to be: nothing to report
                self._aborted.discard(n)
                with contextlib.suppress(Exception):
                    pending.future.result()
                continue
            try:
                handle, async_ms, chain_bytes = pending.future.result()
            except Exception as err:  # e.g. disk full: decline, the job goes on
                if not self._wrote_state and not self._storage_writable():
                    t, root = self.task, self.storage.root if self.storage else None
                    raise CheckpointStorageError.unusable(t.task_id, t.host, n, root, err) from err
                # A checkpoint whose directory is gone was aborted (or subsumed) and removed
                # by the job manager while this write ran: nothing went wrong here.
                removed = isinstance(err, FileNotFoundError) and self._removed(n)
                log.log(
                    logging.DEBUG if removed else logging.WARNING,
                    "task %s: writing checkpoint %d failed: %s",
                    self.task.task_id,
                    n,
                    err,
                )
                self.decline(
                    n, CheckpointFailureReason.STATE_WRITE_FAILED, f"{type(err).__name__}: {err}"
                )
                continue
            self._wrote_state = True
            metrics = dataclasses.replace(
                metrics,
                async_ms=async_ms,
                state_bytes=handle.size + chain_bytes,  # written for this checkpoint
                full_state_bytes=handle.full_size,
            )
            self.ack(n, handle, metrics)
        self._pending = still

    def _removed(self, checkpoint_id: int) -> bool:
        try:
            return self.storage is not None and checkpoint_id not in self.storage.checkpoint_ids()
        except OSError:
            return False

    def _storage_writable(self) -> bool:
        try:
            if self.storage is not None:
                self.storage.probe()
                return True
        except Exception as err:
            log.debug("task %s: probing checkpoint storage failed: %s", self.task.task_id, err)
        return False

    def ack(self, checkpoint_id: int, handle: TaskStateHandle | None, metrics: AckMetrics) -> None:
        t = self.task
        self._send(P.Ack(t.index, t.attempt, checkpoint_id, handle, metrics))

    def decline(self, checkpoint_id: int, reason: CheckpointFailureReason, detail: str) -> None:
        t = self.task
        self._send(P.Decline(t.index, t.attempt, checkpoint_id, reason, detail))

    # -- rescue snapshots (an iteration's optimistic recovery) -------------------------------
    def rescue(self, checkpoint_id: int) -> TaskStateHandle | None:
        """Capture and write this task's operator state now, synchronously, as its part of
        rescue snapshot ``checkpoint_id`` (no barrier: the attempt has failed and ends
        after it); the handle, or None without storage. Task-loop thread only."""
        if self.storage is None:
            return None
        captured = self.chain.capture(checkpoint_id, self.storage, False)
        if not captured.chains and not captured.stores:
            handle = self.storage.inline_handle(captured.snapshots, captured.layout)
            if handle is not None:
                return handle
        return self._write(checkpoint_id, captured, False)[0]

    # -- completion ----------------------------------------------------------------------
    def aborted(self, checkpoint_id: int) -> None:
        """The job manager aborted ``checkpoint_id`` and removes its files: a write of it
        still in flight is neither acked nor declined (nor its failure reported)."""
        if self._halted_for is not None and checkpoint_id >= self._halted_for:
            self._halted_for = None
        if any(p.checkpoint_id == checkpoint_id for p in self._pending):
            self._aborted.add(checkpoint_id)

    def complete(self, checkpoint_id: int) -> None:
        """The job manager completed ``checkpoint_id``: operators commit what it covers."""
        self.chain.notify_complete(checkpoint_id)
        if self._halted_for is not None and checkpoint_id >= self._halted_for:
            self._halted_for = None
        if self.final_checkpoint is not None and checkpoint_id >= self.final_checkpoint:
            self.completed_final = True

    def close(self) -> None:
        """Wait for the writer thread (writes not collected are not acked)."""
        self._drop_log()
        if self._writer is not None and self._owns_writer:
            self._writer.shutdown(wait=True)
        self._writer = None

"""Sinks, and the two-phase commit that makes their output exactly-once.

A transactional sink keeps the records of the current epoch (between two
barriers) in an open transaction. On barrier n it *pre-commits*: the open
transaction is sealed as pending transaction n and stored in the task's
snapshot (`SinkSnapshot`). On CHECKPOINT_COMPLETE(n) every pending transaction up
to n is committed, in order; commits are idempotent, so a lost or repeated
completion notice is harmless. On restore, the pending transactions of the
restored snapshot are committed again (idempotently) and everything after it is
rolled back: the sources replay it. A fresh start (nothing restored) first makes
sure the target holds no output of another run.

Every seal and commit is fenced by attempt: an attempt claims its sink subtasks when
it restores them, and a subtask of an older attempt (alive behind a partition) can no
longer seal or commit (`runtime.transactions.Epoch`).

A sink restored at another parallelism (Flink's union state for sinks) recovers
every old subtask's pending transactions exactly once: new subtask ``i`` of ``p``
owns the old subtasks ``j`` with ``j % p == i``; for each old ``j != i`` it opens a
copy of the sink *as subtask j* (j's transaction ids, part files, Delta application
id, PostgreSQL gids; j's commits reach the driver as j's) and recovers j's snapshot
as above. Its own old snapshot (if ``i`` existed before) is then restored as usual.
New transaction ids cannot collide with old ones: an id is (job, step, subtask,
checkpoint id); the new job's checkpoints are numbered above the restored one, and
each old subtask's transactions above it were aborted by its one owner here. An old
subtask index the new job no longer has keeps its committed output; its id space is
only used again if the job later scales back up, and then only for checkpoints above
every one it committed.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import functools
import json
import logging
import os
import reprlib
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, Generic, TypeVar

import msgpack

from channels.errors import RecordSerializationError
from runtime.errors import ConnectorError
from runtime.transactions import Committer, Epoch, StaleAttemptError, TxnId
from statebackend.errors import CorruptCheckpointError
from statebackend.restore import RescaledState

log = logging.getLogger("absflow.sinks")


@dataclasses.dataclass
class SinkContext:
    """What a sink instance learns about where it runs (task process)."""

    step_name: str
    subtask: int
    parallelism: int
    attempt: int
    # (checkpoint id, records): a list, or a msgpack-packed list that travels as is (the
    # driver unpacks it when the output is read)
    send_to_driver: Callable[[int, list[Any] | bytes], None]
    producer: str = ""  # the step whose records this sink receives (named in errors)
    job: str = ""  # the job's name: part of every transaction id
    # (subtask, checkpoint id, records): send_to_driver on behalf of an old subtask
    # index, when a rescaled restore recovers that subtask's transactions.
    send_as: Callable[[int, int, list[Any] | bytes], None] | None = None
    run: str = "run"  # the run's id: with ``attempt``, the sink's `Epoch`

    @property
    def epoch(self) -> Epoch:
        return Epoch(self.run, self.attempt)


TxnT = TypeVar("TxnT")  # a connector's open transaction
HandleT = TypeVar("HandleT")  # a sealed transaction, as the snapshot holds it (msgpack)


@dataclasses.dataclass(frozen=True, slots=True)
class SinkSnapshot:
    """What a transactional sink subtask stores in a checkpoint: the id of that
    ``checkpoint`` and its ``pending`` transactions, ``(checkpoint id, handle)`` in
    checkpoint order, sealed at or before it and not known to be committed (a handle is
    the connector's, msgpack-serializable). ``checkpoint`` None: nothing was restored (a
    fresh start)."""

    checkpoint: int | None = None
    pending: tuple[tuple[int, Any], ...] = ()

    def encode(self) -> dict[str, Any]:
        # (Checkpoints of older versions also hold "next", the restored checkpoint + 1.)
        return {
            "pending": [[n, handle] for n, handle in self.pending],
            "checkpoint": self.checkpoint,
        }

    @classmethod
    def decode(cls, data: Mapping[str, Any] | None) -> SinkSnapshot:
        """The snapshot ``encode`` wrote (None or empty: a fresh start). Raises
        CorruptCheckpointError naming what is malformed."""
        if not data:
            return cls()
        try:
            pending = tuple((int(n), handle) for n, handle in data.get("pending", ()))
            restored = data.get("checkpoint", max((n for n, _ in pending), default=None))
            return cls(None if restored is None else int(restored), pending)
        except (AttributeError, TypeError, ValueError) as err:
            raise CorruptCheckpointError(
                f"sink snapshot {reprlib.repr(data)} is malformed ({err!r}): expected "
                "{'pending': [[checkpoint, handle], ...], 'checkpoint': int}"
            ) from err


@dataclasses.dataclass(frozen=True, slots=True)
class OtherRunsOutput:
    """What a fresh start found in a sink's target that another run wrote: ``found``
    says what and where, ``fix`` the ways out besides restoring the job."""

    found: str
    fix: str


class Sink:
    """Base sink: subclass and override ``write_batch`` (and the checkpoint hooks if needed).

    Lifecycle (task-loop thread): open -> restore_state (always, None on a fresh start)
    -> write_batch* / snapshot_state* / notify_checkpoint_complete* /
    notify_checkpoint_aborted* -> finish -> (final checkpoint) -> close.

    ``rescalable``: ``restore_state`` also takes a `RescaledState` (the job was
    restored at another parallelism); otherwise such a restore is refused.
    """

    rescalable = False

    def validate(self, step_name: str) -> None:
        """Raise an error naming the object and fix if the sink's settings cannot work.
        Offline: explain() and validate() call it, so it must not connect anywhere."""

    def check_system(self, step_name: str) -> None:
        """Raise an error naming the system, object and fix if the sink cannot reach or
        use its system (server down, table missing or of the wrong shape). Called by
        run() on the driver before the job starts; keep it to a few seconds."""

    def open(self, ctx: SinkContext) -> None:
        self.ctx = ctx

    def write_batch(self, records: list[Any]) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """All input has ended; called before the final checkpoint."""

    def snapshot_state(self, checkpoint_id: int) -> Any:
        """Pre-commit; return the state to store in checkpoint ``checkpoint_id``."""
        return None

    def restore_state(self, state: Any) -> None:
        """Restore from a snapshot (before any record arrives)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` is complete: commit what it covers."""

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` will never complete."""

    def close(self) -> None:
        """Release resources (not called after a crash)."""


class TwoPhaseCommitSink(Sink, Generic[TxnT, HandleT]):
    """Exactly-once sink skeleton (Flink's TwoPhaseCommitSinkFunction; docs/connectors.md):
    subclasses implement the hooks.

    The transaction opened after checkpoint n-1 gets the id ``TxnId(job, step, subtask,
    n)`` when it begins; barrier m seals it (pre-commit) as pending transaction m, and
    the snapshot of m (`SinkSnapshot`) holds every pending transaction. On
    CHECKPOINT_COMPLETE(m) every pending transaction <= m is committed, in order; on a
    restore, `recover` commits the restored pending transactions and aborts everything
    else this subtask left (the connector's `abort_uncovered`); a fresh start refuses a
    target holding another run's output (the connector's `other_runs_output`). An
    aborted checkpoint's transaction stays pending: its records are not replayed, so
    the next completed checkpoint commits it.

    With ``commit_off_loop`` the commits run on a `Committer` thread (``commit`` must
    then be thread-safe against ``write_to_transaction``: use its own connection);
    otherwise on the task loop. ``commit`` must be idempotent either way.
    """

    commit_off_loop = False
    rescalable = True  # pending transactions of old subtasks are recovered (see below)

    def open(self, ctx: SinkContext) -> None:
        # The sink as constructed (what ``open`` has not set yet): a rescaled restore
        # opens a copy of it as an old subtask to recover that subtask's transactions.
        self._unopened = copy.copy(self)
        super().open(ctx)
        self.pending: dict[int, HandleT] = {}
        self._lock = threading.Lock()  # guards ``pending`` against the committer thread
        self.next_id = 1  # the checkpoint expected to seal the next transaction
        self.current: TxnT | None = None
        self._finished = False
        self.committer: Committer[HandleT] | None = None
        if self.commit_off_loop:
            self.committer = Committer(self._commit_fenced, self._mark_committed, ctx.step_name)

    def txn_id(self, checkpoint_id: int) -> TxnId:
        ctx = self.ctx
        return TxnId(ctx.job, ctx.step_name, ctx.subtask, checkpoint_id)

    def _begin(self) -> TxnT:
        txn = self.current = self.begin_transaction(self.txn_id(self.next_id))
        return txn

    def write_batch(self, records: list[Any]) -> None:
        if self.committer is not None and self.committer.failure is not None:
            self.committer.raise_if_failed()
        txn = self.current if self.current is not None else self._begin()
        self.write_to_transaction(txn, records)

    def snapshot_state(self, checkpoint_id: int) -> dict[str, Any]:
        txn = self.current if self.current is not None else self._begin()
        with self._fenced("seal", checkpoint_id):
            sealed = self.pre_commit(txn, checkpoint_id)
        self.next_id = checkpoint_id + 1
        with self._lock:
            self.pending[checkpoint_id] = sealed
            pending = [(n, h) for n, h in sorted(self.pending.items())]
        self._begin()
        return SinkSnapshot(checkpoint_id, tuple(pending)).encode()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        with self._lock:
            due = sorted((n, h) for n, h in self.pending.items() if n <= checkpoint_id)
        committer = self.committer
        if committer is None:
            for n, handle in due:
                self._commit_fenced(n, handle)
                self._mark_committed(n)
            return
        for n, handle in due:
            committer.submit(n, handle)
        if self._finished:  # the final checkpoint: the task ends once this returns
            committer.drain()

    def _commit_fenced(self, checkpoint_id: int, handle: Any) -> None:
        with self._fenced("commit", checkpoint_id):
            self.commit(checkpoint_id, handle)

    @contextlib.contextmanager
    def _fenced(self, action: str, checkpoint_id: int) -> Iterator[None]:
        """Run the block (a seal or a commit) only while this attempt owns the subtask;
        StaleAttemptError if a newer one claimed it. The system's owner lock is held
        throughout, so no claim slips in between the check and the block."""
        with self.owner_lock():
            owner = self.owner()
            if owner is not None and owner != self.ctx.epoch:
                raise StaleAttemptError(
                    f"sink '{self.ctx.step_name}'[{self.ctx.subtask}] of attempt "
                    f"{self.ctx.attempt} will not {action} checkpoint {checkpoint_id}: attempt "
                    f"{owner.attempt} of run {owner.run} has taken over its transactions "
                    f"(this task belongs to a failed attempt and ends now)"
                )
            yield

    def _mark_committed(self, checkpoint_id: int) -> None:
        with self._lock:
            self.pending.pop(checkpoint_id, None)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        # Its transaction stays pending (its records are not replayed) and is committed
        # by the next completed checkpoint.
        if checkpoint_id in self.pending:
            log.info(
                "sink '%s'[%d]: checkpoint %d aborted; its transaction waits for the next",
                self.ctx.step_name,
                self.ctx.subtask,
                checkpoint_id,
            )

    def finish(self) -> None:
        self._finished = True

    def restore_state(self, state: Any) -> None:
        self._claim()
        if isinstance(state, RescaledState):
            snapshot = self._recover_rescaled(state)
        else:
            snapshot = SinkSnapshot.decode(state)
        self.recover(snapshot)
        if snapshot.checkpoint is not None:
            self.next_id = snapshot.checkpoint + 1
        if self.current is None:
            self._begin()

    def recover(self, snapshot: SinkSnapshot) -> None:
        """On restore (task loop, before the first record): a fresh start refuses a target
        holding another run's output; then commit what the restored checkpoint covers
        (``snapshot.pending``, in order: commits are idempotent) and abort the rest.
        The connectors give the hooks, not this policy."""
        if snapshot.checkpoint is None:
            self._refuse_other_runs_output()
        for n, handle in snapshot.pending:
            self.commit(n, handle)
        self.abort_uncovered(snapshot)

    def _claim(self) -> None:
        """This attempt takes the subtask over, before it recovers anything: from then on,
        earlier attempts' tasks can seal or commit nothing here."""
        with self.owner_lock():
            self.claim(self.ctx.epoch)

    def _refuse_other_runs_output(self) -> None:
        other = self.other_runs_output()
        if other is None:
            return
        ctx = self.ctx
        raise ConnectorError(
            f"sink '{ctx.step_name}': {other.found}, and job {ctx.job!r} starts fresh (no "
            f"checkpoint restored), so its output would mix with it. Restore the job from "
            f"its checkpoint (run(restore_from=...)), or {other.fix}"
        )

    def _recover_rescaled(self, state: RescaledState) -> SinkSnapshot:
        """Recover the old subtasks this one owns now (but its own); return its own old
        snapshot to restore as usual. A new subtask without an old one, or an old one
        that left no snapshot, gets the restored checkpoint with nothing pending: it
        aborts what an earlier run at that index left after it, and is no fresh start."""
        ctx = self.ctx
        snapshots = {j: SinkSnapshot.decode(part) for j, part in state.parts}
        restored = max(
            (s.checkpoint for s in snapshots.values() if s.checkpoint is not None), default=None
        )
        own = empty = SinkSnapshot(restored)
        parts = [(j, snapshots[j]) for j, _ in state.mine(ctx.subtask, ctx.parallelism)]
        for j, snapshot in parts:
            if snapshot.checkpoint is None:
                snapshot = empty
            if j == ctx.subtask:
                own = snapshot
                continue
            old = self._as_subtask(j)
            try:
                old._claim()
                old.recover(snapshot)
            finally:
                old.close()
            log.info(
                "sink '%s'[%d]: recovered the transactions of old subtask %d of %d",
                ctx.step_name,
                ctx.subtask,
                j,
                state.old_parallelism,
            )
        return own

    def _as_subtask(self, j: int) -> TwoPhaseCommitSink[TxnT, HandleT]:
        """A copy of this sink as constructed, opened as subtask ``j``."""
        ctx = self.ctx
        send = ctx.send_to_driver if ctx.send_as is None else functools.partial(ctx.send_as, j)
        old = copy.copy(self._unopened)
        old.open(dataclasses.replace(ctx, subtask=j, send_to_driver=send))
        return old

    def close(self) -> None:
        if self.committer is not None:
            try:
                self.committer.drain()
            finally:
                self.committer.stop()

    # -- hooks -------------------------------------------------------------------------
    def begin_transaction(self, txn_id: TxnId) -> TxnT:
        raise NotImplementedError

    def write_to_transaction(self, txn: TxnT, records: list[Any]) -> None:
        raise NotImplementedError

    def pre_commit(self, txn: TxnT, checkpoint_id: int) -> HandleT:
        """Seal ``txn``; return its msgpack-serializable handle stored in the snapshot."""
        raise NotImplementedError

    def commit(self, checkpoint_id: int, handle: HandleT) -> None:
        """Make a sealed transaction visible. Must be idempotent."""
        raise NotImplementedError

    def abort_uncovered(self, restored: SinkSnapshot) -> None:
        """After the restored pending transactions were committed: abort whatever this
        subtask's earlier attempts (or runs) left that ``restored`` does not cover
        (transactions sealed after its checkpoint, open ones). Default: nothing (a sink
        whose open transactions leave no trace outside the snapshot)."""

    def other_runs_output(self) -> OtherRunsOutput | None:
        """On a fresh start (no checkpoint restored): output of another run in the
        target, which this run's output would mix with (or skip past). Default: None."""
        return None

    def claim(self, epoch: Epoch) -> None:
        """Record in the sink's system that ``epoch`` owns this subtask's transactions
        (called under ``owner_lock`` when the subtask is restored, before ``recover``).
        The default records nothing: such a sink is fenced by the control plane only
        (the job manager completes checkpoints for the current attempt's tasks only)."""

    def owner(self) -> Epoch | None:
        """The epoch that last claimed this subtask in the sink's system (None: none
        recorded); called under ``owner_lock`` before every seal and commit."""
        return None

    def owner_lock(self) -> contextlib.AbstractContextManager[Any]:
        """Held around a claim, and around every owner check with the seal or commit it
        guards (a lock every host shares: a file lock, a row lock)."""
        return contextlib.nullcontext()


class CollectSink(TwoPhaseCommitSink["_PackedTxn", "bytes | list[Any]"]):
    """Returns the records from ``run()`` (``result.output(name)``), exactly once.

    Committed batches go to the driver tagged (step, subtask, checkpoint id); the
    driver keeps the first copy of each, so re-commits after a restore are dropped.
    Records cross to the driver as msgpack, packed as they arrive (one call per batch):
    sealing a transaction at a barrier only joins bytes, so a large epoch does not hold
    up the barrier, and a record that cannot cross fails as it arrives, naming the step
    that produced it (a RecordSerializationError: restarting cannot help).
    """

    def begin_transaction(self, txn_id: TxnId) -> _PackedTxn:
        return _PackedTxn()

    def write_to_transaction(self, txn: _PackedTxn, records: list[Any]) -> None:
        try:
            packed: bytes = msgpack.packb(records, use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as err:
            raise RecordSerializationError.of_batch(
                records, err, step=self.ctx.producer or self.ctx.step_name
            ) from err
        header = len(_ARRAY_HEADER.pack_array_header(len(records)))
        txn.parts.append(memoryview(packed)[header:])  # the records, without their list
        txn.count += len(records)

    def pre_commit(self, txn: _PackedTxn, checkpoint_id: int) -> bytes:
        header: bytes = _ARRAY_HEADER.pack_array_header(txn.count)
        return b"".join([header, *txn.parts])  # one copy of the epoch's records

    def commit(self, checkpoint_id: int, handle: bytes | list[Any]) -> None:
        # A handle is the packed transaction, sent on as is: neither this task nor the
        # driver's loop unpacks it (or, from older checkpoints, the records).
        self.ctx.send_to_driver(
            checkpoint_id, handle if isinstance(handle, bytes) else list(handle)
        )


_ARRAY_HEADER = msgpack.Packer()


@dataclasses.dataclass(slots=True)
class _PackedTxn:
    """An open `CollectSink` transaction: its records packed batch by batch."""

    parts: list[memoryview] = dataclasses.field(default_factory=list)
    count: int = 0


@dataclasses.dataclass(slots=True)
class _StagingFile:
    """An open `FileSink` transaction: its staging file."""

    path: str
    fh: IO[str]


class FileSink(TwoPhaseCommitSink[_StagingFile, str]):
    """Writes one part file per subtask, ``<dir>/part-<subtask>``, one JSON record per line.

    Exactly-once: each epoch's records go to a staging file, fsynced at pre-commit;
    a commit appends the staging file to the part file and records the committed
    length and checkpoint in ``.part-<subtask>.committed`` (with the lengths of the
    last commits); a restore truncates the part file back to its length at the
    restored checkpoint before replaying, also when newer checkpoints had committed.
    ``format`` turns a record into a line (default: JSON).
    """

    # Committed lengths kept in the marker, so a restore from an older (retained)
    # checkpoint can truncate the output back to it.
    HISTORY = 256

    def __init__(self, directory: str, format: Callable[[Any], str] | None = None) -> None:
        self.directory = os.path.abspath(directory)
        self.format = format

    def open(self, ctx: SinkContext) -> None:
        os.makedirs(self.directory, exist_ok=True)
        self.part = os.path.join(self.directory, f"part-{ctx.subtask}")
        self.marker = os.path.join(self.directory, f".part-{ctx.subtask}.committed")
        super().open(ctx)

    def _staging(self, n: int | str) -> str:
        return os.path.join(
            self.directory, f".part-{self.ctx.subtask}.{self.ctx.attempt}.{n}.staging"
        )

    def _committed(self) -> tuple[int, int]:
        checkpoint, length, _ = self._read_marker()
        return checkpoint, length

    def _read_marker(self) -> tuple[int, int, list[list[int]]]:
        """(last committed checkpoint, part length, [[checkpoint, length], ...] ascending)."""
        try:
            with open(self.marker) as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return -1, 0, [[-1, 0]]
        checkpoint, length = int(data["checkpoint"]), int(data["length"])
        history = [[int(n), int(n_len)] for n, n_len in data.get("history", [[checkpoint, length]])]
        return checkpoint, length, history

    def _write_marker(self, checkpoint_id: int, length: int, history: list[list[int]]) -> None:
        """Only the owner writes the marker (claim, then its fenced commits)."""
        tmp = self.marker + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(
                {
                    "checkpoint": checkpoint_id,
                    "length": length,
                    "history": history[-self.HISTORY :],
                    "owner": str(self.ctx.epoch),
                },
                fh,
            )
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.marker)

    def claim(self, epoch: Epoch) -> None:
        self._write_marker(*self._read_marker())  # the marker names its writer, the owner

    def owner(self) -> Epoch | None:
        try:
            with open(self.marker) as fh:
                return Epoch.parse(json.load(fh).get("owner"))
        except FileNotFoundError:
            return None

    @contextlib.contextmanager
    def owner_lock(self) -> Iterator[None]:
        """An exclusive flock on ``.part-<subtask>.lock`` (every host that mounts the
        directory shares it)."""
        with open(os.path.join(self.directory, f".part-{self.ctx.subtask}.lock"), "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def begin_transaction(self, txn_id: TxnId) -> _StagingFile:
        path = self._staging("open")
        return _StagingFile(path, open(path, "w", encoding="utf-8"))

    def write_to_transaction(self, txn: _StagingFile, records: list[Any]) -> None:
        fmt = self.format
        if fmt is None:
            txn.fh.write("".join(json.dumps(r) + "\n" for r in records))
        else:
            txn.fh.write("".join(fmt(r) + "\n" for r in records))

    def pre_commit(self, txn: _StagingFile, checkpoint_id: int) -> str:
        fh = txn.fh
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        sealed = self._staging(checkpoint_id)
        os.replace(txn.path, sealed)
        return sealed

    def commit(self, checkpoint_id: int, handle: str) -> None:
        done, length, history = self._read_marker()
        if checkpoint_id <= done:
            return  # already committed (idempotent)
        if not os.path.exists(handle):
            raise FileNotFoundError(
                f"file sink: staging file {handle} of checkpoint {checkpoint_id} is missing; "
                f"the output directory {self.directory} was changed outside absflow"
            )
        with open(self.part, "ab") as out:
            out.truncate(length)  # drop a half-done append of an earlier crash
            with open(handle, "rb") as src:
                out.write(src.read())
            out.flush()
            os.fsync(out.fileno())
            new_length = out.tell()
        self._write_marker(checkpoint_id, new_length, [*history, [checkpoint_id, new_length]])
        os.remove(handle)

    def abort_uncovered(self, restored: SinkSnapshot) -> None:
        if restored.pending and restored.checkpoint is not None:
            self._roll_back_to(restored.checkpoint)
        self._abort_uncommitted()

    def _roll_back_to(self, checkpoint_id: int) -> None:
        """Output committed by checkpoints newer than the restored one is replayed: drop it."""
        done, _, history = self._read_marker()
        if done <= checkpoint_id:
            return
        older = [entry for entry in history if entry[0] <= checkpoint_id]
        if not older:
            raise RuntimeError(
                f"file sink: cannot roll {self.part} back to checkpoint {checkpoint_id}: "
                f"{self.marker} records commits from checkpoint {history[0][0]} on only; "
                f"restore from a newer checkpoint or clear the output directory"
            )
        n, length = older[-1]
        with open(self.part, "ab") as out:
            out.truncate(length)
            os.fsync(out.fileno())
        self._write_marker(n, length, older)

    def _abort_uncommitted(self) -> None:
        """Truncate the part file to its committed length; remove staging files."""
        _, length = self._committed()
        if os.path.exists(self.part) and os.path.getsize(self.part) > length:
            with open(self.part, "ab") as out:
                out.truncate(length)
        prefix = f".part-{self.ctx.subtask}."
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if (
                name.startswith(prefix)
                and name.endswith(".staging")
                and (self.current is None or path != self.current.path)
            ):
                os.remove(path)

    def close(self) -> None:
        super().close()
        current = getattr(self, "current", None)
        if current is not None and not current.fh.closed:
            current.fh.close()
            os.remove(current.path)


class PrintSink(Sink):
    """Prints each record to stdout as it arrives (at-least-once: not transactional)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def write_batch(self, records: list[Any]) -> None:
        tag = f"{self.prefix}{self.ctx.step_name}[{self.ctx.subtask}]> "
        sys.stdout.write("".join(f"{tag}{r}\n" for r in records))
        sys.stdout.flush()

"""The operators of one task: its chain of steps in one subtask.

A source chain starts with a `SourceReader` (read by the task loop), every other
step is an `Operator`. `OperatorChain.process` is the per-record path: one call per
batch, a plain loop over the operators' ``process`` functions. The chain also
captures its state for a checkpoint (the synchronous part) and applies a restore plan.

Lifecycle: ``open()`` (sinks open their files here) -> ``restore`` -> ``process`` /
``capture`` / ``notify_complete`` ... -> ``finish`` -> ``close``. Task-loop thread only.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from channels.messages import Watermark
from runtime.changelog import ChainWrite, KeyedChangelog, restore_chains
from runtime.config import JobConfig
from runtime.errors import (
    OperatorFailure,
    RecordSerializationError,
    StateMemoryBudgetError,
    TaskCancelled,
)
from runtime.event_time import TimestampAssigner
from runtime.graph import Step, StepKind
from runtime.operators import KeyedStateFactory, Operator, OperatorContext, build_operator
from runtime.plan import JobPlan, TaskSpec, step_state
from runtime.restored_watermark import restored_watermark
from runtime.sinks import SinkContext
from runtime.sources import SourceReader
from runtime.task_faults import TaskFaults
from runtime.watermarks import NO_WATERMARK
from statebackend.errors import IncompatibleCheckpointError, StateError
from statebackend.keyed import KeyedStateBackend
from statebackend.metadata import CheckpointMetadata, OperatorLayout, TaskStateHandle
from statebackend.restore import RescaledState, RestorePlan, RestoreTarget
from statebackend.rocksdb import RocksDBStateBackend, StoreWrite
from statebackend.snapshot import OperatorSnapshot
from statebackend.storage import CheckpointStorage

log = logging.getLogger("absflow.task")

BUDGET_EVERY = 16
"""Batches between two estimates of the in-memory keyed state against its budget."""

Emit = Callable[[list[object]], None]
"""Write records that leave the chain outside ``process`` (timers, watermarks, finish)."""

SinkOutputSender = Callable[
    [str, int, int, list[object] | bytes], None
]  # step, subtask, checkpoint
"""``send(sink step, checkpoint id, records)``: committed collect() output to the driver."""


@dataclass(frozen=True, slots=True)
class Capture:
    """The synchronous part of a checkpoint: the state of every operator that holds any;
    ``chains``: the bases and deltas of incrementally checkpointed keyed state."""

    snapshots: dict[str, OperatorSnapshot] = field(default_factory=dict)
    layout: dict[str, OperatorLayout] = field(default_factory=dict)
    keys: int = 0
    chains: ChainWrite | None = None
    stores: tuple[StoreWrite, ...] = ()
    """RocksDB checkpoints taken locally, to upload (``statebackend.rocksdb``)."""


def pack(state: object) -> bytes:
    packed: bytes = msgpack.packb(state, use_bin_type=True)
    return packed


def unpack(blob: bytes) -> Any:
    # as on the channels: sequences come back as tuples
    return msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=False)


class OperatorChain:
    def __init__(
        self,
        plan: JobPlan,
        spec: TaskSpec,
        attempt: int,
        send_sink_output: SinkOutputSender,
        faults: TaskFaults,
        config: JobConfig | None = None,
        state_dir: Callable[[], str] | None = None,
        run_id: str = "run",
    ) -> None:
        """``state_dir``: the task's local directory (its scratch directory), where the
        rocksdb state backend keeps its databases; ``run_id``: the run, which with the
        attempt fences the sinks (`runtime.transactions.Epoch`)."""
        self.plan, self.spec, self.attempt, self.run_id = plan, spec, attempt, run_id
        cfg = config if config is not None else JobConfig()
        self._keyed_state_factory = _keyed_state_factory(plan, spec, cfg, state_dir)
        mb = cfg.state_memory_budget_mb
        self._budget_mb = mb
        self._budget = None if mb is None or cfg.state_backend != "memory" else int(mb * (1 << 20))
        """Bytes the in-memory keyed state of the task may take (checked every
        ``BUDGET_EVERY`` batches and at each checkpoint), or None."""
        self._budget_countdown = BUDGET_EVERY
        self._drop_event_time = cfg.debug_drop_event_time
        self.changelog = KeyedChangelog(
            spec.task_id,
            attempt,
            cfg.incremental_checkpoints and cfg.checkpointing,
            cfg.incremental_min_keys,
            cfg.incremental_max_chain,
            cfg.debug_drop_deltas,
            faults,
        )
        """Incremental checkpoints of the chain's keyed operators (`runtime.changelog`)."""
        self._send_sink_output = send_sink_output
        self._faults = faults
        self.steps = plan.chain_steps(spec)
        head = self.steps[0]
        self.source_step: Step | None = head if head.kind is StepKind.SOURCE else None
        self.output_step = self.steps[-1].name
        """The step whose records leave the task on its output channels."""
        self.reader: SourceReader | None = None
        self.operators: list[Operator] = []
        self._processes: list[Callable[[list[object], int], list[object]]] = []
        self._sink_position = -1
        self.emit: Emit = lambda records: None
        """Set by the task: partition and write records that leave the chain."""
        self.watermark = NO_WATERMARK
        """The chain's event time: the last watermark its operators were given."""
        self.finished = False  # the final checkpoint began: event time no longer moves
        self.assigner: TimestampAssigner | None = None
        self.timed: list[int] = []  # positions of operators that want processing time
        self.records_out = 0
        """Records into the sink (sink chains) or onto the output channels (others)."""

    # -- set-up --------------------------------------------------------------------------
    def open(self) -> None:
        """Create the source reader and the operators (sinks open here)."""
        spec = self.spec
        if self.source_step is not None:
            self.reader = self.source_step.fn.create_reader(
                spec.subtask, self.source_step.parallelism
            )
        first = 1 if self.source_step is not None else 0
        for position in range(first, len(self.steps)):
            step = self.steps[position]
            ctx = None
            if step.kind is StepKind.SINK:
                ctx = SinkContext(
                    step.name,
                    spec.subtask,
                    step.parallelism,
                    self.attempt,
                    self._sink_sender(step.name),
                    producer=self._producer(position),
                    job=self.plan.name,
                    send_as=functools.partial(self._send_sink_output, step.name),
                    run=self.run_id,
                )
            op = build_operator(
                step,
                spec.subtask,
                self.plan.max_parallelism,
                ctx,
                self._drop_event_time,
                self._keyed_state_factory,
            )
            op.open(OperatorContext(spec.subtask, self.plan.max_parallelism, ctx))
            keyed = op.keyed_state
            # (a store checkpoints its own files incrementally: no changed keys tracked)
            if (
                self.changelog.enabled
                and op.tracks_changes
                and keyed is not None
                and keyed.in_memory
            ):
                keyed.track_changes()
            self.operators.append(self._faults.wrap(op))
        self._processes = [op.process for op in self.operators]
        for i, op in enumerate(self.operators):
            if isinstance(op, TimestampAssigner):
                self.assigner = op
                if self.reader is not None and i == 0:
                    op.split_of = self.reader.current_split
                    op.ended_splits = self.reader.take_ended_splits
            if op.wants_processing_time:
                self.timed.append(i)
        if self.steps[-1].kind is StepKind.SINK:
            self._sink_position = len(self.operators) - 1

    def _producer(self, position: int) -> str:
        """The step(s) whose records reach the step at ``position`` of the chain."""
        if position > 0:
            return self.steps[position - 1].name
        step = self.steps[position]
        return ", ".join(self.plan.steps[edge.source].name for edge in step.inputs)

    def _sink_sender(self, step: str) -> Callable[[int, list[object] | bytes], None]:
        send, subtask = self._send_sink_output, self.spec.subtask

        def send_to_driver(checkpoint_id: int, records: list[object] | bytes) -> None:
            send(step, subtask, checkpoint_id, records)

        return send_to_driver

    # -- the per-record path -------------------------------------------------------------
    def process(self, batch: list[object], side: int = 0) -> list[object]:
        """Run a batch from input ``side`` through the operators; returns what leaves the
        chain. (The head operator is told the side; the rest take the previous output.)

        Raises OperatorFailure naming the step whose function raised.
        """
        i = 0
        sink_at = self._sink_position
        if self._budget is not None:
            self._budget_countdown -= 1
            if self._budget_countdown <= 0:
                self.check_memory_budget()
        try:
            for process in self._processes:
                if i == sink_at:
                    self.records_out += len(batch)
                batch = process(batch, side)
                side = 0
                if not batch:
                    return batch
                i += 1
        except (TaskCancelled, OperatorFailure, RecordSerializationError):  # named already
            raise
        except Exception as err:
            raise OperatorFailure(self.operators[i].name, err) from err
        self.records_out += len(batch)
        return batch

    def _run_from(self, start: int, batch: list[object]) -> list[object]:
        """Records emitted by operator ``start - 1`` (a timer, a watermark, finish):
        through the rest of the chain; what leaves it is returned (off the hot path)."""
        processes = self._processes
        sink_at = self._sink_position
        i = start
        try:
            while i < len(processes) and batch:
                if i == sink_at:
                    self.records_out += len(batch)
                batch = processes[i](batch, 0)
                i += 1
        except (TaskCancelled, OperatorFailure, RecordSerializationError):  # named already
            raise
        except Exception as err:
            raise OperatorFailure(self.operators[i].name, err) from err
        if i == len(processes) and sink_at < 0:
            self.records_out += len(batch)
        return batch

    def _call(self, i: int, call: Callable[[Operator], list[object]]) -> None:
        """``call`` operator ``i``; what it emits runs through the operators after it
        and leaves through ``emit``."""
        op = self.operators[i]
        try:
            emitted = call(op)
        except (TaskCancelled, OperatorFailure, RecordSerializationError):  # named already
            raise
        except Exception as err:
            raise OperatorFailure(op.name, err) from err
        if emitted:
            out = self._run_from(i + 1, emitted)
            if out:
                self.emit(out)

    def _each(self, start: int, call: Callable[[Operator], list[object]]) -> None:
        """`_call` each operator from ``start`` on, in chain order (so records emitted
        by one reach the next before the next is called)."""
        for i in range(start, len(self.operators)):
            self._call(i, call)

    def check_memory_budget(self) -> None:
        """Raise OperatorFailure (fatal: StateMemoryBudgetError) naming the step whose
        keyed state is largest when the task's in-memory keyed state is estimated past
        ``state_memory_budget_mb``: it says the fix, instead of the machine running out."""
        self._budget_countdown = BUDGET_EVERY
        budget = self._budget
        if budget is None:
            return
        sizes = [
            (op.keyed_state.estimated_bytes(), op)
            for op in self.operators
            if op.keyed_state is not None and op.keyed_state.in_memory
        ]
        total = sum(size for size, _ in sizes)
        if total <= budget:
            return
        size, op = max(sizes, key=lambda pair: pair[0])
        assert op.keyed_state is not None
        mib = 1 << 20
        raise OperatorFailure(
            op.name,
            StateMemoryBudgetError(
                f"step '{op.name}' (task {self.spec.task_id}): keyed state in memory is about "
                f"{size / mib:,.1f} MiB ({op.keyed_state.key_count():,} keys; the task's keyed "
                f"state {total / mib:,.1f} MiB), past state_memory_budget_mb="
                f"{self._budget_mb}. Set state_backend='rocksdb' (keyed state on local disk, "
                "memory bounded by the budget), raise state_memory_budget_mb, or raise the "
                "parallelism of the step"
            ),
        )

    # -- event time ----------------------------------------------------------------------
    def advance_watermark(self, watermark: float, start: int = 0) -> bool:
        """Event time reached ``watermark`` (from the input side, or the assigner at
        ``start - 1``): timers and windows fire, what they emit leaves through ``emit``.
        Returns whether it advanced (never backwards)."""
        if watermark <= self.watermark or self.finished:
            return False  # after the final snapshot nothing fires: it would never commit
        self.watermark = watermark
        self._each(start, lambda op: op.on_watermark(watermark))
        return True

    def poll_watermark(self) -> Watermark | None:
        """A source chain after a batch: the assigner's watermark to send (a
        ``Watermark``) after advancing the operators behind it; None if nothing to send."""
        assigner = self.assigner
        if assigner is None:
            return None
        event = assigner.poll()
        if event is not None and not event.idle:
            self.advance_watermark(event.timestamp, self.operators.index(assigner) + 1)
        return event

    def on_processing_time(self, now: float) -> None:
        """Processing-time timers and windows (called between batches)."""
        for i in self.timed:
            self._call(i, lambda op: op.on_processing_time(now))

    # -- checkpoints ---------------------------------------------------------------------
    def capture(
        self, checkpoint_id: int, storage: CheckpointStorage | None, savepoint: bool = False
    ) -> Capture:
        """Snapshot every operator (sinks pre-commit, also without ``storage``); with a
        ``storage``, the state of those that hold any, serialized: keyed state of operators
        that track their changes incrementally (`runtime.changelog`), except in a
        ``savepoint`` (self-contained: whole, canonical). The final checkpoint at the end
        of the input is a checkpoint like any other (as in Flink): incremental."""
        self.check_memory_budget()
        with_state = storage is not None
        changelog = self.changelog
        snapshots: dict[str, OperatorSnapshot] = {}
        layout: dict[str, OperatorLayout] = {}
        subtask = self.spec.subtask
        if with_state and self.reader is not None and self.source_step is not None:
            name = self.source_step.name
            snapshots[name] = OperatorSnapshot(pack(self.reader.snapshot()), None, None)
            layout[name] = OperatorLayout(subtask, self.source_step.parallelism)
        keys = 0
        stores: list[StoreWrite] = []
        for op in self.operators:
            state = op.snapshot_state(checkpoint_id)
            keyed = op.keyed_state
            if not with_state or (state is None and keyed is None):
                continue  # an operator without state is not in the checkpoint
            groups = keyed.key_groups if keyed is not None else None
            stored = isinstance(keyed, RocksDBStateBackend)
            if stored:  # its own checkpoint of immutable files (a savepoint: canonical,
                assert isinstance(keyed, RocksDBStateBackend)  # spooled from them)
                stores.append(keyed.local_checkpoint(checkpoint_id, canonical=savepoint))
            chained = stored or (
                keyed is not None
                and keyed.in_memory
                and storage is not None
                and not savepoint
                and op.tracks_changes
                and changelog.capture(checkpoint_id, op.name, keyed, storage)
            )
            snapshots[op.name] = OperatorSnapshot(
                None if state is None else pack(state),
                keyed.snapshot() if keyed is not None and not chained else None,
                groups,
            )
            layout[op.name] = OperatorLayout(
                subtask,
                op.step.parallelism,
                None if groups is None else (groups.start, groups.stop),
            )
            if keyed is not None:
                keys += keyed.key_count() if chained else keyed.num_keys()
        return Capture(snapshots, layout, keys, changelog.take(), tuple(stores))

    def finish(self) -> None:
        """All input has ended (before the final checkpoint): what operators emit now
        leaves through ``emit``. Event time stops here: a stop with a savepoint ends the
        input after its final barrier, and windows firing then would emit output no
        checkpoint commits (they stay open in the savepoint and fire after a resume)."""
        self.check_memory_budget()
        self._each(0, lambda op: op.finish())
        self.finished = True

    def notify_aborted(self, checkpoint_id: int) -> None:
        op_name = ""
        try:
            for op in self.operators:
                op_name = op.name
                op.notify_checkpoint_aborted(checkpoint_id)
        except Exception as err:
            raise OperatorFailure(op_name, err) from err

    def notify_complete(self, checkpoint_id: int) -> None:
        op_name = ""
        try:
            for op in self.operators:
                op_name = op.name
                op.notify_checkpoint_complete(checkpoint_id)
        except Exception as err:
            raise OperatorFailure(op_name, err) from err

    # -- restore -------------------------------------------------------------------------
    def restore_targets(self) -> list[RestoreTarget]:
        """This subtask's steps as a restore plan needs them."""
        targets = []
        if self.source_step is not None:
            targets.append(RestoreTarget(step_state(self.source_step)))
        for op in self.operators:
            keyed = op.keyed_state
            targets.append(RestoreTarget(step_state(op.step), keyed.key_groups if keyed else None))
        return targets

    def restore_state(self, plan: RestorePlan, storage: CheckpointStorage) -> dict[str, object]:
        """Seek the source and load keyed state as ``plan`` says; returns the operators'
        own states by name (for `apply_operator_states`)."""
        n = plan.checkpoint_id

        def read(name: str, handle: TaskStateHandle) -> Any:
            blob = storage.read_operator_state(n, handle, name)
            return None if blob is None else unpack(blob)

        def operator_state(name: str) -> object:
            part = plan.operators.get(name)
            if part is not None and part.rescaled:  # union state at another parallelism
                parts = tuple((j, read(name, handle)) for j, handle in part.rescaled)
                return RescaledState(parts, part.old_parallelism)
            if part is None or part.operator_state is None:
                return None
            return read(name, part.operator_state)

        if self.reader is not None and self.source_step is not None:
            position = operator_state(self.source_step.name)
            if isinstance(position, RescaledState):
                self.reader.restore_rescaled(position)
            elif position is not None:
                self.reader.restore(position)
        states: dict[str, object] = {}
        for op in self.operators:
            states[op.name] = operator_state(op.name)
            keyed = op.keyed_state
            if keyed is not None:
                part = plan.operators.get(op.name)
                handles = part.keyed_state if part is not None else ()
                _restore_stores(keyed, op.name, handles, storage)
                for handle in handles:  # no key hashed when the writer's key groups are ours
                    layout = handle.operators.get(op.name)
                    written = layout.key_groups if layout is not None else None
                    with storage.keyed_state_streams(
                        n, handle, op.name, keyed.key_groups
                    ) as streams:
                        keyed.restore_streams(
                            streams, written_for=range(*written) if written else None
                        )
                inherited = restore_chains(keyed, op.name, handles, storage)
                if op.tracks_changes and inherited is not None:
                    self.changelog.inherit(op.name, inherited)
                op.after_keyed_restore()
        return states

    def apply_operator_states(self, states: dict[str, object]) -> None:
        """Hand restored states to their operators; sinks always get theirs (None on a
        fresh start: they roll back output no checkpoint covers)."""
        for op in self.operators:
            state = states.get(op.name)
            if op.step.kind is StepKind.SINK or state is not None:
                op.restore_state(state)
        restored = [op.watermark for op in self.operators if op.uses_event_time]
        self.watermark = max(restored, default=NO_WATERMARK)

    def restore_watermark(self, metadata: CheckpointMetadata | None) -> float:
        """After `apply_operator_states`: start from the task's watermark at the checkpoint
        (`runtime.restored_watermark`), also without an event-time operator or after a
        rescale (the operators that lost theirs get it, without firing: what was due
        below it fired before the checkpoint). Returns the chain's watermark."""
        if metadata is not None and not self._drop_event_time:
            first = self.operators[0].step if self.operators else self.source_step
            parallelism = first.parallelism if first is not None else 1
            mark = restored_watermark(metadata, self.spec.task_id, parallelism)
            if mark > self.watermark:
                self.watermark = mark
            for op in self.operators:
                if op.uses_event_time and mark > op.watermark:
                    op.watermark = mark
        return self.watermark

    # -- shutdown ------------------------------------------------------------------------
    def close(self, graceful: bool) -> None:
        """Close the operators (only when ``graceful``: not after a failure) and the reader."""
        self.changelog.close()
        for op in self.operators:
            if op.keyed_state is not None:
                op.keyed_state.close()
        if graceful:
            for op in self.operators:
                try:
                    op.close()
                except Exception as err:
                    log.warning("task %s: closing '%s' failed: %s", self.spec.task_id, op.name, err)
        if self.reader is not None:
            self.reader.close()


def _keyed_state_factory(
    plan: JobPlan, spec: TaskSpec, cfg: JobConfig, state_dir: Callable[[], str] | None
) -> KeyedStateFactory | None:
    """The rocksdb backend's factory (None: in memory), each keyed step of the chain
    given an equal part of the task's ``state_memory_budget_mb``."""
    if cfg.state_backend != "rocksdb":
        return None
    if state_dir is None:
        raise StateError("state_backend='rocksdb' needs the task's local directory")
    keyed_steps = max(1, sum(1 for s in plan.chain_steps(spec) if s.key_fn is not None))
    mb = cfg.state_memory_budget_mb
    budget = None if mb is None else int(mb * (1 << 20)) // keyed_steps
    directory, drop = state_dir, cfg.debug_drop_deltas

    def factory(
        operator: str,
        max_parallelism: int,
        key_groups: range,
        key_group_of: Callable[[object], int],
    ) -> KeyedStateBackend:
        return RocksDBStateBackend(
            operator, max_parallelism, key_groups, key_group_of, directory, budget, drop
        )

    return factory


def _restore_stores(
    keyed: KeyedStateBackend,
    operator: str,
    handles: tuple[TaskStateHandle, ...],
    storage: CheckpointStorage,
) -> None:
    """Open or copy the RocksDB checkpoints of ``operator`` in ``handles``."""
    stores = [h.stores[operator] for h in handles if operator in h.stores]
    if not stores:
        return
    if not isinstance(keyed, RocksDBStateBackend):
        raise IncompatibleCheckpointError(
            f"the checkpoint holds the keyed state of '{operator}' as RocksDB files "
            "(state_backend='rocksdb'); restore it with state_backend='rocksdb', or take a "
            "savepoint on that backend (canonical: either backend restores it) to switch"
        )
    keyed.restore_stores(stores, storage)

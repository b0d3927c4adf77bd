"""What a snapshot mode builds for a task: its barrier handler, and where it logs the
records in flight at a snapshot (`InFlightLog`: a loop head's back-edge log, or an
unaligned checkpoint's channel state), stored like the operator state of a step and
replayed before new input on restore."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from channels.messages import decode_records, encode_data
from channels.partitioners import Partitioner
from runtime.barriers import (
    BarrierAligner,
    BarrierHandler,
    BarrierTracker,
    CheckpointActions,
    UnalignedHandler,
)
from runtime.chain import unpack
from runtime.config import JobConfig, SnapshotMode
from runtime.graph import Partitioning
from runtime.overtaking import OvertakingInput
from runtime.plan import JobPlan, TaskSpec
from runtime.scratch import ScratchDir
from runtime.task_io import TaskIO
from statebackend.metadata import OperatorLayout, StepState
from statebackend.restore import RestorePlan, RestoreTarget
from statebackend.storage import CheckpointStorage


class InFlightKind(enum.Enum):
    """Which records in flight a task logs; its ack counts them in ``<value>_records`` and
    ``<value>_bytes`` (`statebackend.metrics.AckMetrics`)."""

    BACKEDGE = "backedge"  # a loop head's back-edges
    CHANNEL_STATE = "channel_state"  # an unaligned checkpoint's input channels


@dataclass(frozen=True, slots=True)
class InFlightLog:
    """Where a task keeps the records in flight at its snapshot (a loop head's back-edge
    log, or an unaligned checkpoint's channel state): the operator state of ``step``."""

    step: str
    layout: OperatorLayout
    spill_dir: Callable[[], str]
    spill_threshold: int
    kind: InFlightKind = InFlightKind.BACKEDGE
    rescaler: BackEdgeRouting | None = None
    """How a log written at another parallelism is redistributed (None: it cannot be)."""

    def restore_target(self) -> RestoreTarget:
        """What a restore must find for the log: a non-keyed state of ``step``, which is
        union state when the log can be redistributed (`BackEdgeRouting`)."""
        kind = f"{self.kind.value}-log"
        step = StepState(
            self.step, kind, self.layout.parallelism, False, redistribute=self.rescaler is not None
        )
        return RestoreTarget(step)

    def read_log(self, plan: RestorePlan, storage: CheckpointStorage) -> list[bytes]:
        """The frames a restored checkpoint logged for this task, in arrival order; at
        another parallelism, the records of every old subtask's log that this subtask owns
        now (each old log in order, the old subtasks in order)."""
        part = plan.operators.get(self.step)
        if part is not None and part.rescaled and self.rescaler is not None:
            frames: list[bytes] = []
            for _old, handle in part.rescaled:
                blob = storage.read_operator_state(plan.checkpoint_id, handle, part.operator)
                if blob is not None:
                    frames += self.rescaler.mine(unpack(blob), self.layout.subtask)
            return frames
        if part is None or part.operator_state is None:
            return []
        blob = storage.read_operator_state(plan.checkpoint_id, part.operator_state, part.operator)
        return [] if blob is None else list(unpack(blob))


@dataclass(frozen=True, slots=True)
class BackEdgeRouting:
    """How a loop head's back-edge log is redistributed at another parallelism: when its
    back-edges are hash partitioned by one step, every logged record goes to the subtask
    its key belongs to now (the sender's partitioner at the new parallelism), replayed on
    ``channel``, one of this task's back-edge channels."""

    partitioner: Partitioner
    channel: int

    def mine(self, frames: list[bytes], subtask: int) -> list[bytes]:
        """The records of ``frames`` (logged at the old parallelism) that ``subtask``
        owns, re-framed on this task's channel."""
        out: list[bytes] = []
        for frame in frames:
            records = [
                r
                for target, batch in self.partitioner.partition(decode_records(frame))
                if target == subtask
                for r in batch
            ]
            if records:
                out.append(encode_data(self.channel, records))
        return out


def back_edge_routing(spec: TaskSpec, plan: JobPlan) -> BackEdgeRouting | None:
    """The routing of ``spec``'s back-edge records at another parallelism, or None when
    they cannot be redistributed (a back-edge that is not hash partitioned, or back-edges
    from more than one step: the log does not say which step's rule a record followed)."""
    if not spec.back_edge_inputs:
        return None
    channels = [plan.channels[c] for c in spec.back_edge_inputs]
    if len({c.source_step for c in channels}) != 1:
        return None
    first = channels[0]
    sender = plan.tasks[first.source_task]
    out = next(o for o in sender.outputs if first.id in o.channels)
    if out.partitioning is not Partitioning.HASH:
        return None
    return BackEdgeRouting(out.partitioner(len(out.channels), sender, plan), first.id)


def handler_for(spec: TaskSpec, actions: CheckpointActions, cfg: JobConfig) -> BarrierHandler:
    """The barrier handler of ``cfg.snapshot_mode`` for a task with inputs."""
    mode = cfg.snapshot_mode
    if cfg.records_channel_state:
        return UnalignedHandler(spec.regular_inputs, actions, aligned_timeout=cfg.aligned_timeout)
    cls = BarrierTracker if mode is SnapshotMode.AT_LEAST_ONCE else BarrierAligner
    return cls(spec.regular_inputs, actions, back_edges=spec.back_edge_inputs)


class _Logs(Protocol):
    """The checkpointer's part in reading ahead (``runtime.checkpointer``)."""

    on_log_opened: Callable[[], None] | None

    def log(self, frame: bytes, records: int) -> None: ...


def overtaking_input_for(
    handler: BarrierHandler,
    io: TaskIO,
    checkpointer: _Logs,
    deliver: Callable[[bytes], None],
    scratch: ScratchDir,
    cfg: JobConfig,
) -> OvertakingInput | None:
    """Under unaligned checkpoints, the input side where barriers overtake queued input
    (wired to the checkpointer: queued frames are logged when a log opens); else None."""
    gate, priority = io.gate, io.priority_gate
    if not cfg.barriers_overtake or gate is None or priority is None:
        return None
    if not isinstance(handler, UnalignedHandler):
        raise TypeError(f"unaligned checkpoints need an UnalignedHandler, got {handler!r}")
    overtaking = OvertakingInput(
        gate,
        priority,
        handler,
        checkpointer.log,
        deliver,
        lambda: scratch.path,
        cfg.spill_threshold,
    )
    checkpointer.on_log_opened = overtaking.log_queued
    return overtaking


def redistributable_logs(plan: JobPlan) -> frozenset[str]:
    """The in-flight logs of ``plan`` a restore at another parallelism redistributes: the
    back-edge logs of loop heads whose back-edges `back_edge_routing` can route."""
    return frozenset(
        f"{plan.chain_steps(t)[0].name}#{InFlightKind.BACKEDGE.value}-log"
        for t in plan.tasks
        if back_edge_routing(t, plan) is not None
    )


def in_flight_log_for(
    spec: TaskSpec,
    plan: JobPlan,
    head: str,
    parallelism: int,
    cfg: JobConfig,
    spill_dir: Callable[[], str],
) -> InFlightLog | None:
    """Where the task logs records in flight at a snapshot, if it does: a loop head its
    back-edges, a task with inputs under unaligned checkpoints its channel state."""
    layout = OperatorLayout(spec.subtask, parallelism)
    if spec.back_edge_inputs:
        return InFlightLog(
            f"{head}#{InFlightKind.BACKEDGE.value}-log",
            layout,
            spill_dir,
            cfg.spill_threshold,
            rescaler=back_edge_routing(spec, plan),
        )
    if spec.inputs and cfg.records_channel_state:
        return InFlightLog(
            f"{head}#channel-state",
            layout,
            spill_dir,
            cfg.spill_threshold,
            InFlightKind.CHANNEL_STATE,
        )
    return None

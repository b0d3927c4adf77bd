"""What a snapshot mode builds for a task: its barrier handler, and where it logs the
records in flight at a snapshot (`InFlightLog`: a loop head's back-edge log, or an
unaligned checkpoint's channel state), stored like the operator state of a step and
replayed before new input on restore."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from runtime.barriers import (
    BarrierAligner,
    BarrierHandler,
    BarrierTracker,
    CheckpointActions,
    UnalignedHandler,
)
from runtime.chain import unpack
from runtime.config import JobConfig, SnapshotMode
from runtime.overtaking import OvertakingInput
from runtime.plan import TaskSpec
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

    def restore_target(self) -> RestoreTarget:
        """What a restore must find for the log: a non-keyed state of ``step``."""
        kind = f"{self.kind.value}-log"
        return RestoreTarget(StepState(self.step, kind, self.layout.parallelism, False))

    def read_log(self, plan: RestorePlan, storage: CheckpointStorage) -> list[bytes]:
        """The frames a restored checkpoint logged for this task, in arrival order."""
        part = plan.operators.get(self.step)
        if part is None or part.operator_state is None:
            return []
        blob = storage.read_operator_state(plan.checkpoint_id, part.operator_state, part.operator)
        return [] if blob is None else list(unpack(blob))


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


def in_flight_log_for(
    spec: TaskSpec, head: str, parallelism: int, cfg: JobConfig, spill_dir: Callable[[], str]
) -> InFlightLog | None:
    """Where the task logs records in flight at a snapshot, if it does: a loop head its
    back-edges, a task with inputs under unaligned checkpoints its channel state."""
    layout = OperatorLayout(spec.subtask, parallelism)
    if spec.back_edge_inputs:
        return InFlightLog(f"{head}#backedge-log", layout, spill_dir, cfg.spill_threshold)
    if spec.inputs and cfg.records_channel_state:
        return InFlightLog(
            f"{head}#channel-state",
            layout,
            spill_dir,
            cfg.spill_threshold,
            InFlightKind.CHANNEL_STATE,
        )
    return None

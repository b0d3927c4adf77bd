"""What the job manager hands every task of an attempt: its environment (settings,
storage roots, the checkpoint to restore, keys) and the faults it injects into itself."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from channels.security import ChannelKeys
from runtime.config import JobConfig
from statebackend.metadata import CheckpointMetadata
from statebackend.storage import CheckpointStorage


class FaultKind(enum.Enum):
    """What a task-side fault does. The value of a kill is the moment as users write it
    (``Kill(task, during="alignment")``, the examples' ``--after alignment``)."""

    KILL_DURING_ALIGNMENT = "alignment"  # it starts aligning a checkpoint
    KILL_DURING_SNAPSHOT = "snapshot"  # half way through writing its state file
    KILL_DURING_BACKEDGE_LOG = "backedge_log"  # a loop head, logging its back-edges
    KILL_DURING_COMPACTION = "compaction"  # half way through writing a chain's merged file
    RAISE_AT_RECORD = "raise_at_record"  # a step raises at record k

    @classmethod
    def kill_during(cls, moment: str) -> FaultKind | None:
        """The kill at ``moment`` ("alignment", ...), or None if there is none."""
        kind = cls._value2member_map_.get(moment)
        return kind if isinstance(kind, cls) and kind is not cls.RAISE_AT_RECORD else None

    @classmethod
    def moments(cls) -> tuple[str, ...]:
        """How the kills' moments are written: ``("alignment", "snapshot", ...)``."""
        return tuple(k.value for k in cls if k is not cls.RAISE_AT_RECORD)


@dataclass(frozen=True)
class TaskFault:
    """A fault a task injects into itself (a real SIGKILL of its own process, or a raise)."""

    kind: FaultKind
    task_index: int
    attempt: int = 0
    checkpoint_id: int | None = None  # first checkpoint at or after which to fire
    operator: str | None = None
    record: int | None = None


@dataclass(frozen=True)
class TaskEnvironment:
    """What the job manager hands every task of one attempt (pickled to the executors).

    The roots are paths or URLs; ``config.storage_options`` (endpoint, credentials) go
    with them, so that every task opens the same storage the driver opened."""

    jm_endpoint: str
    attempt: int
    config: JobConfig
    checkpoint_root: str | None  # CheckpointStorage root (path or URL) for state; None: none
    restore_root: str | None  # CheckpointStorage root holding the checkpoint to restore
    restore_metadata: CheckpointMetadata | None  # that checkpoint's (verified) metadata
    run_id: str = "run"  # names the tasks' temp dirs (stale ones of a run are removed)
    faults: tuple[TaskFault, ...] = ()
    # The run's CURVE keys (secure_channels), or None: plain ZeroMQ. They reach the tasks
    # only inside what launches them (the barrier stage's closure, the local task's stdin).
    channel_keys: ChannelKeys | None = field(default=None, repr=False)

    def open_storage(self, root: str) -> CheckpointStorage:
        """The checkpoint storage at ``root`` (one of the roots above), opened with the
        driver's ``storage_options`` (no I/O)."""
        return CheckpointStorage(
            root,
            storage_options=self.config.storage_options,
            inline_threshold=self.config.state_inline_threshold,
            compression=self.config.snapshot_compression,
        )

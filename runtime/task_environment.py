"""What the job manager hands every task of an attempt: its environment (settings,
storage roots, the checkpoint to restore, keys) and the faults it injects into itself."""

from __future__ import annotations

from dataclasses import dataclass, field

from channels.security import ChannelKeys
from runtime.config import JobConfig
from statebackend.metadata import CheckpointMetadata
from statebackend.storage import CheckpointStorage


@dataclass(frozen=True)
class TaskFault:
    """A fault a task injects into itself (a real SIGKILL of its own process, or a raise)."""

    kind: str  # "kill_during_alignment" | "kill_during_snapshot" | "raise_at_record"
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

"""State backend: keyed state in key groups, task state files, checkpoint storage and its
metadata schema, restore planning, spill.

Imports nothing of absflow but ``channels.errors`` (the root error).
"""

from statebackend.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    CorruptStateError,
    IncompatibleCheckpointError,
    StateError,
    StorageAccessError,
    StorageUsageError,
)
from statebackend.fs import FileSystem, LocalFileSystem
from statebackend.keyed import KeyedStateBackend, StateKind
from statebackend.metadata import (
    CheckpointMetadata,
    OperatorLayout,
    StepState,
    TaskStateHandle,
)
from statebackend.restore import (
    RescaledState,
    RestorePlan,
    RestoreTarget,
    check_compatible,
    plan_restore,
)
from statebackend.snapshot import (
    FLAG_RAW,
    OperatorSnapshot,
    StateFileInfo,
    encode_task_snapshot,
    list_operators,
    read_keyed_state,
    read_operator_state,
    verify_state_file,
    write_task_snapshot,
)
from statebackend.spill import SpillBuffer
from statebackend.storage import CheckpointInfo, CheckpointStatus, CheckpointStorage

__all__ = [
    "FLAG_RAW",
    "CheckpointInfo",
    "CheckpointMetadata",
    "CheckpointNotFoundError",
    "CheckpointStatus",
    "CheckpointStorage",
    "CorruptCheckpointError",
    "CorruptStateError",
    "FileSystem",
    "IncompatibleCheckpointError",
    "KeyedStateBackend",
    "LocalFileSystem",
    "OperatorLayout",
    "OperatorSnapshot",
    "RescaledState",
    "RestorePlan",
    "RestoreTarget",
    "SpillBuffer",
    "StateError",
    "StateFileInfo",
    "StateKind",
    "StepState",
    "StorageAccessError",
    "StorageUsageError",
    "TaskStateHandle",
    "check_compatible",
    "encode_task_snapshot",
    "list_operators",
    "plan_restore",
    "read_keyed_state",
    "read_operator_state",
    "verify_state_file",
    "write_task_snapshot",
]

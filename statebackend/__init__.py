"""State backend: keyed state in key groups, task state files, checkpoint storage, spill.

Imports nothing of absflow but ``channels.errors`` (the root error).
"""

from statebackend.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    CorruptStateError,
    StateError,
)
from statebackend.keyed import KeyedStateBackend, StateKind
from statebackend.snapshot import (
    OperatorSnapshot,
    StateFileInfo,
    list_operators,
    read_keyed_state,
    read_operator_state,
    verify_state_file,
    write_task_snapshot,
)
from statebackend.spill import SpillBuffer
from statebackend.storage import CheckpointStorage

__all__ = [
    "CheckpointNotFoundError",
    "CheckpointStorage",
    "CorruptCheckpointError",
    "CorruptStateError",
    "KeyedStateBackend",
    "OperatorSnapshot",
    "SpillBuffer",
    "StateError",
    "StateFileInfo",
    "StateKind",
    "list_operators",
    "read_keyed_state",
    "read_operator_state",
    "verify_state_file",
    "write_task_snapshot",
]

"""absflow's user API: build a Dataflow, run it on Spark with exactly-once checkpoints."""

from runtime.api.dataflow import Dataflow, KeyedStream, Stream
from runtime.config import JobConfig, SnapshotMode
from runtime.errors import (
    AbsflowError,
    CheckpointStorageError,
    GraphError,
    IncompatibleCheckpointError,
    InsufficientSlotsError,
    JobCancelledError,
    RecordSerializationError,
    TaskFailedError,
    UnpicklableFunctionError,
    UnsupportedSessionError,
)

__all__ = [
    "AbsflowError",
    "CheckpointStorageError",
    "Dataflow",
    "GraphError",
    "IncompatibleCheckpointError",
    "InsufficientSlotsError",
    "JobCancelledError",
    "JobConfig",
    "KeyedStream",
    "RecordSerializationError",
    "SnapshotMode",
    "Stream",
    "TaskFailedError",
    "UnpicklableFunctionError",
    "UnsupportedSessionError",
]

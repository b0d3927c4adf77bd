"""Errors a user of the runtime can act on: each says what is wrong, where, and the fix."""

from __future__ import annotations

from channels.errors import AbsflowError, RecordSerializationError
from statebackend.errors import IncompatibleCheckpointError


class GraphError(AbsflowError, ValueError):
    """The dataflow graph is malformed (raised at build or validation time)."""


class UnpicklableFunctionError(GraphError, TypeError):
    """A user function cannot be shipped to the task processes."""


class TaskFailedError(AbsflowError, RuntimeError):
    """A task failed and the restart strategy gave up (or restarts are off).

    ``operator``, ``subtask`` and ``remote_traceback`` name where and why.
    """

    def __init__(
        self,
        message: str,
        operator: str | None = None,
        subtask: int | None = None,
        remote_traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.operator = operator
        self.subtask = subtask
        self.remote_traceback = remote_traceback


class InsufficientSlotsError(AbsflowError, RuntimeError):
    """The SparkSession has fewer task slots than the job has tasks."""


class UnsupportedSessionError(AbsflowError, RuntimeError):
    """The SparkSession cannot run barrier stages (a Spark Connect session, dynamic
    allocation on): checked before anything is submitted."""


class WorkerStartError(AbsflowError, RuntimeError):
    """The Spark Python workers cannot import the task code (a worker lost while starting
    is a failure like any other: the restart strategy handles it)."""


class JobCancelledError(AbsflowError, RuntimeError):
    """The job was cancelled (Ctrl-C or a cancel request); its tasks were ended."""


class CheckpointStorageError(AbsflowError, OSError):
    """Checkpoint storage cannot be created or written: found by the driver before the job
    starts, or by a task whose first state write failed (the storage is out of its reach)."""

    @classmethod
    def unusable(
        cls, task: str, host: str, checkpoint_id: int, root: str | None, err: Exception
    ) -> CheckpointStorageError:
        """Task ``task``'s first state write failed and a probe file failed too."""
        return cls(
            f"task {task} on host {host} cannot write its state file of checkpoint "
            f"{checkpoint_id} to checkpoint storage {root!r}: {type(err).__name__}: {err}. "
            f"It is this task's first state write and a probe file cannot be written either: "
            f"the storage is not usable from this executor (a restart cannot fix that). Make "
            f"it reachable and writable from every executor (network, the bucket, endpoint "
            f"and credentials in storage_options)"
        )


class ConnectorError(AbsflowError, RuntimeError):
    """A source or sink cannot reach or use its external system (a database, a table, a
    bucket): the message names the system, the object and the fix."""


class PackagingError(AbsflowError, RuntimeError):
    """The code or the environment cannot be packaged or submitted to a cluster."""


# -- inside a task process (never reach the user as such) -------------------------------
class StateMemoryBudgetError(GraphError, MemoryError):
    """A task's in-memory keyed state passed ``state_memory_budget_mb``: a restart would
    only fill it again (fatal)."""


class TaskCancelled(AbsflowError):
    """The job manager told this task to stop (or went silent): end the task quietly."""


class IterationError(GraphError):
    """An iteration is built or used wrongly (the message names the step and the fix);
    raised in a task (a message to a key the solution set lacks) it fails the run
    without restarts, like any GraphError at run time."""


class OperatorFailure(AbsflowError):
    """A user function of step ``operator`` raised ``cause`` (reported to the job manager)."""

    def __init__(self, operator: str, cause: BaseException) -> None:
        super().__init__(f"{operator}: {type(cause).__name__}: {cause}")
        self.operator = operator
        self.cause = cause

    @property
    def fatal(self) -> bool:
        """A GraphError at run time (e.g. a timestamp that is not a number): a restart would
        replay the same record into the same error."""
        return isinstance(self.cause, GraphError)


__all__ = [
    "AbsflowError",
    "CheckpointStorageError",
    "GraphError",
    "IncompatibleCheckpointError",
    "InsufficientSlotsError",
    "IterationError",
    "JobCancelledError",
    "PackagingError",
    "RecordSerializationError",
    "StateMemoryBudgetError",
    "TaskFailedError",
    "UnpicklableFunctionError",
    "UnsupportedSessionError",
    "WorkerStartError",
]

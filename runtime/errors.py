"""Errors a user of the runtime can act on: each says what is wrong, where, and the fix."""

from __future__ import annotations

from channels.errors import AbsflowError


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


class WorkerStartError(AbsflowError, RuntimeError):
    """Spark could not start the Python workers that run the tasks."""


class JobCancelledError(AbsflowError, RuntimeError):
    """The job was cancelled (Ctrl-C or a cancel request); its tasks were ended."""


class CheckpointStorageError(AbsflowError, OSError):
    """The checkpoint directory cannot be created or written (checked before the job starts)."""


class FaultInjectionError(AbsflowError, RuntimeError):
    """A fault injection cannot be carried out (e.g. a kill of a task on another host)."""


__all__ = [
    "AbsflowError",
    "CheckpointStorageError",
    "FaultInjectionError",
    "GraphError",
    "InsufficientSlotsError",
    "JobCancelledError",
    "TaskFailedError",
    "UnpicklableFunctionError",
    "WorkerStartError",
]

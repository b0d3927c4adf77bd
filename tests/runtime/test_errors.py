"""The runtime's user-facing errors (runtime/errors.py): one root, the builtin each also
is, the fields a failure carries, and the messages that name the problem and the fix."""

from __future__ import annotations

import pytest

from runtime import errors
from runtime.errors import (
    AbsflowError,
    CheckpointStorageError,
    GraphError,
    IterationError,
    OperatorFailure,
    StateMemoryBudgetError,
    TaskFailedError,
    UnpicklableFunctionError,
)


@pytest.mark.parametrize("name", errors.__all__)
def test_every_exported_error_derives_from_the_root(name: str) -> None:
    error = getattr(errors, name)
    assert isinstance(error, type) and issubclass(error, AbsflowError), name


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (GraphError, ValueError),
        (UnpicklableFunctionError, TypeError),
        (UnpicklableFunctionError, GraphError),
        (TaskFailedError, RuntimeError),
        (CheckpointStorageError, OSError),
        (StateMemoryBudgetError, MemoryError),
        (IterationError, GraphError),
    ],
)
def test_builtins_are_mixed_in_where_they_fit(
    error: type[AbsflowError], builtin: type[Exception]
) -> None:
    assert issubclass(error, builtin)


def test_task_failed_carries_where_and_why() -> None:
    err = TaskFailedError("count[1] failed", operator="count", subtask=1, remote_traceback="tb")
    assert (str(err), err.operator, err.subtask, err.remote_traceback) == (
        "count[1] failed",
        "count",
        1,
        "tb",
    )
    bare = TaskFailedError("lost")
    assert bare.operator is None and bare.subtask is None and bare.remote_traceback is None


def test_unusable_storage_names_task_host_checkpoint_url_cause_and_fix() -> None:
    cause = PermissionError(13, "Permission denied")
    err = CheckpointStorageError.unusable("map[2]", "exec-7", 4, "s3://bucket/ck", cause)
    message = str(err)
    for part in ("task map[2]", "host exec-7", "checkpoint 4", "'s3://bucket/ck'"):
        assert part in message
    assert "PermissionError: [Errno 13] Permission denied" in message
    assert "a restart cannot fix that" in message
    assert "reachable and writable from every executor" in message


@pytest.mark.parametrize(
    ("cause", "fatal"),
    [
        (GraphError("timestamp 'x' is not a number"), True),
        (IterationError("no key 7 in the solution set"), True),
        (ZeroDivisionError("division by zero"), False),
        (ValueError("bad value"), False),
    ],
)
def test_operator_failure_is_fatal_only_for_graph_errors(cause: BaseException, fatal: bool) -> None:
    failure = OperatorFailure("parse", cause)
    assert failure.fatal is fatal
    assert failure.operator == "parse" and failure.cause is cause
    assert str(failure) == f"parse: {type(cause).__name__}: {cause}"

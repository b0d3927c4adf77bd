"""Failures as data: their words, and the rule that tells one a restart cannot fix."""

from __future__ import annotations

from jobmanager.failures import (
    Failure,
    FailureCause,
    FailureHistory,
    classify_stage_error,
    reported_failure,
)
from runtime import control as P

RAISED = Failure(FailureCause.USER_FUNCTION_RAISED, "split", 1, "ValueError: bad line\nmore")


def test_describe_names_operator_subtask_and_exception() -> None:
    assert RAISED.describe() == (
        "a user function raised in operator 'split' (subtask 1): ValueError: bad line"
    )
    assert Failure(FailureCause.JOB_TIMEOUT).describe() == "the job ran longer than its timeout"


def test_the_same_failure_twice_after_the_same_restore_point_is_deterministic() -> None:
    h = FailureHistory()
    assert h.repeated(RAISED, None) is None
    assert h.repeated(RAISED, 3) is None  # progress: it got further than the last time
    earlier = Failure(FailureCause.USER_FUNCTION_RAISED, "split", 1, "ValueError: bad line\nmore")
    again = Failure(FailureCause.USER_FUNCTION_RAISED, "split", 0, "ValueError: bad line\nmore")
    h = FailureHistory()
    h.repeated(earlier, 3)
    assert h.repeated(again, 3) is earlier  # the first error is the one reported


def test_different_errors_or_operators_are_retried() -> None:
    h = FailureHistory()
    h.repeated(RAISED, 3)
    assert (
        h.repeated(Failure(FailureCause.USER_FUNCTION_RAISED, "split", 1, "KeyError: x"), 3) is None
    )
    assert (
        h.repeated(Failure(FailureCause.USER_FUNCTION_RAISED, "count", 1, "KeyError: x"), 3) is None
    )


def test_kills_and_timeouts_are_never_deterministic() -> None:
    died = Failure(FailureCause.TASK_DIED, "count", 1, "task count[1] (pid 7) is gone")
    h = FailureHistory()
    h.repeated(died, 3)
    assert h.repeated(died, 3) is None
    silent = Failure(FailureCause.HEARTBEAT_LOST, "count", 1, "no heartbeat")
    h.repeated(silent, 4)
    assert h.repeated(silent, 4) is None


def test_stage_errors_are_classified() -> None:
    assert (
        classify_stage_error("Python worker exited unexpectedly (crashed)")
        is FailureCause.TASK_DIED
    )
    assert classify_stage_error("... PythonException: ...") is FailureCause.TASK_ERROR
    assert classify_stage_error("barrier stage failed") is FailureCause.STAGE_FAILED


def test_a_reported_cause_maps_to_the_failure_cause_of_its_name() -> None:
    """``Failed.cause`` travels as a task-side enum; the job manager takes the
    FailureCause of the same name (every task-side cause has one)."""
    for cause in P.TaskFailureCause:
        msg = P.Failed(0, 0, cause, "count", 1, "E: x", "tb", False)
        failure = reported_failure(msg)
        assert failure.cause is FailureCause[cause.name]
        assert failure.cause.message == cause.value

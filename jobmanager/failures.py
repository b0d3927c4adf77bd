"""Why an attempt failed, as data: a ``FailureCause`` (an enum with a human message)
and a ``Failure`` naming the operator, the subtask and the exception; and the rule
that tells a failure a restart cannot fix (``FailureHistory``). Driver side only."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from runtime import control as P


class FailureCause(enum.Enum):
    """What ended an attempt; the value is the human message. Logs, ``Restart`` records
    and the final error are keyed by it."""

    TASK_DIED = "a task process died (killed or crashed)"
    USER_FUNCTION_RAISED = "a user function raised"
    TASK_ERROR = "a task failed"
    HEARTBEAT_LOST = "a task stopped heart-beating"
    STAGE_FAILED = "the barrier stage failed"
    STAGE_ENDED_EARLY = "the barrier stage ended before every task finished"
    TOO_MANY_CHECKPOINT_FAILURES = "too many consecutive checkpoint failures"
    FINAL_CHECKPOINT_FAILED = "the final checkpoint failed"
    JOB_TIMEOUT = "the job ran longer than its timeout"
    REGISTRATION_TIMEOUT = "the tasks did not start in time"
    CANCELLED = "the job was cancelled"

    @property
    def message(self) -> str:
        return self.value


@dataclass(frozen=True)
class Failure:
    """One failed attempt.

    ``operator``/``subtask`` say where (None when the failure is not a task's, e.g. a
    timeout); ``error`` is the exception as ``Type: message`` (or what was observed, e.g.
    "task count[1] (pid 7) is gone"); ``permanent`` says why a restart cannot help
    (None: the restart strategy decides).
    """

    cause: FailureCause
    operator: str | None = None
    subtask: int | None = None
    error: str | None = None
    traceback: str | None = None
    permanent: str | None = None

    def describe(self) -> str:
        """E.g. "a user function raised in operator 'split' (subtask 1): ValueError: bad line"."""
        where = ""
        if self.operator is not None:
            where = f" in operator '{self.operator}'"
            if self.subtask is not None:
                where += f" (subtask {self.subtask})"
        error = f": {first_lines(self.error, 1) or self.error}" if self.error else ""
        return f"{self.cause.message}{where}{error}"

    @property
    def signature(self) -> tuple[FailureCause, str | None, str | None] | None:
        """What makes two failures "the same": cause, operator, exception type and message.
        None for failures without an exception a task reported (deaths, timeouts, ...)."""
        if self.cause not in (FailureCause.USER_FUNCTION_RAISED, FailureCause.TASK_ERROR):
            return None
        if not self.error:
            return None
        return (self.cause, self.operator, self.error)


def classify_stage_error(text: str) -> FailureCause:
    """The cause of a barrier stage that Spark reports as failed, from its error text
    (a Py4JJavaError carries no structured reason), or the local launcher's."""
    if "exited unexpectedly" in text or "crashed" in text:
        return FailureCause.TASK_DIED
    if "PythonException" in text or "raised an exception" in text:
        return FailureCause.TASK_ERROR
    return FailureCause.STAGE_FAILED


def stage_reason(text: str) -> str:
    """The line of a failed stage's error text that says what happened (Py4J's first line,
    "An error occurred while calling ...", does not)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for marker in ("exited unexpectedly", "crashed", "failure reason:", "Exception:", "Error:"):
        for line in lines:
            if marker in line and not line.startswith("at "):
                return line[:300]
    return lines[0][:300] if lines else "no error text"


class FailureHistory:
    """Tells a deterministic failure: the same operator failing with the same exception
    type and message after the same restore point twice in a row. Restarting again would
    replay the same records into the same code, so the job manager gives up at once."""

    def __init__(self) -> None:
        self._last: tuple[Failure, int | None] | None = None

    def repeated(self, failure: Failure, restored: int | None) -> Failure | None:
        """Record ``failure`` of an attempt that restored checkpoint ``restored`` (None:
        started from scratch). Returns the earlier, identical failure when the previous
        attempt restored the same point and failed the same way; else None."""
        previous = self._last
        self._last = (failure, restored)
        if previous is None or failure.signature is None:
            return None
        earlier, earlier_restored = previous
        if earlier.signature == failure.signature and earlier_restored == restored:
            return earlier
        return None


def restore_point_words(checkpoint_id: int | None) -> str:
    """The words for a restore point: "checkpoint 3", or "the start" for None."""
    return f"checkpoint {checkpoint_id}" if checkpoint_id is not None else "the start"


def reported_failure(msg: P.Failed) -> Failure:
    """The Failure a task reported (``Failed``) about itself: a user function's error
    names its operator, the task's own error its task id."""
    return Failure(
        FailureCause[msg.cause.name],
        operator=msg.operator,
        subtask=msg.subtask,
        error=msg.error,
        traceback=msg.traceback,
        permanent="the task reported that a restart cannot fix this error" if msg.fatal else None,
    )


def first_lines(text: str, n: int = 12) -> str:
    """The first ``n`` lines of ``text`` without its surrounding blank space."""
    return "\n".join(text.strip().splitlines()[:n])

"""The pieces of the transactional sink contract that are not a sink: transaction ids
and the committer thread.

A transaction id is derived from (job, sink step, subtask, checkpoint id) only, so
after a crash the restored sink can name every transaction an earlier attempt may have
left open in an external system (a PostgreSQL ``PREPARE TRANSACTION`` gid, a Delta
application id) without having stored it anywhere.

A sink whose commits talk to a remote system commits through a `Committer`: one thread
per sink instance that commits sealed transactions in checkpoint order, retrying a
failed commit with backoff. The task loop only hands work over (a bounded queue), so
record processing never waits for a commit; a commit that keeps failing is raised on
the task loop at its next call into the sink (the task then fails and the restore
commits it again: commits are idempotent).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from runtime.errors import AbsflowError

log = logging.getLogger("absflow.sinks")

TXN_PREFIX = "absflow"


class CommitFailedError(AbsflowError, RuntimeError):
    """A sink's commit failed after its retries (the cause is chained)."""


class StaleAttemptError(AbsflowError, RuntimeError):
    """A sink subtask of a superseded attempt tried to seal or commit a transaction: a
    newer attempt has claimed the subtask (`Epoch`), so this one must write nothing."""


@dataclass(frozen=True, slots=True)
class Epoch:
    """The attempt of a run that owns a sink subtask's transactions.

    Every attempt claims its sink subtasks in their system when it restores them (the
    last claim wins: attempts of a run start one after the other), and a sink seals
    and commits only while its own epoch is the owner. A task of a failed attempt that
    lives on (behind a network partition, frozen, slow to die) is fenced: it can no
    longer seal or commit anything once the next attempt started (Kafka's producer
    epochs do the same for transactional ids).
    """

    run: str
    attempt: int

    def __str__(self) -> str:
        return f"{self.run}/{self.attempt}"

    @classmethod
    def parse(cls, text: str | None) -> Epoch | None:
        """The epoch ``text`` names (``str(epoch)``), or None."""
        if not text or "/" not in text:
            return None
        run, _, attempt = text.rpartition("/")
        try:
            return cls(run, int(attempt))
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class TxnId:
    """The id of the transaction a sink subtask seals at checkpoint ``checkpoint_id``
    (the checkpoint expected to seal it: known when the transaction begins)."""

    job: str
    step: str
    subtask: int
    checkpoint_id: int

    @property
    def owner(self) -> str:
        """What every transaction of this sink subtask shares: ``absflow:<job>:<step>:<i>``."""
        return f"{TXN_PREFIX}:{_clean(self.job)}:{_clean(self.step)}:{self.subtask}"

    def __str__(self) -> str:
        return f"{self.owner}:{self.checkpoint_id}"

    @classmethod
    def parse(cls, text: str) -> TxnId | None:
        """The id ``text`` names, or None if it is not one of ours."""
        parts = text.split(":")
        if len(parts) != 5 or parts[0] != TXN_PREFIX:
            return None
        try:
            return cls(parts[1], parts[2], int(parts[3]), int(parts[4]))
        except ValueError:
            return None


def _clean(name: str) -> str:
    # ':' separates the parts; ids travel as SQL literals and file names.
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]


H = TypeVar("H")  # a sealed transaction's handle
DoneFn = Callable[[int], None]


class Committer(Generic[H]):
    """Commits sealed transactions on its own thread, in checkpoint order, with retries.

    Threading: ``submit``/``raise_if_failed``/``drain``/``stop`` are called by the task
    loop; ``commit`` and ``on_committed`` run on the committer thread. At most
    ``max_queued`` commits wait; ``submit`` blocks beyond that (back-pressure on
    checkpoint completion, never on records).
    """

    def __init__(
        self,
        commit: Callable[[int, H], None],
        on_committed: DoneFn,
        name: str,
        retries: int = 5,
        backoff_s: float = 0.2,
        max_queued: int = 64,
    ) -> None:
        self._commit, self._on_committed = commit, on_committed
        self.name, self.retries, self.backoff_s = name, retries, backoff_s
        self._queue: queue.Queue[tuple[int, H] | None] = queue.Queue(max_queued)
        self._thread: threading.Thread | None = None
        self._idle = threading.Condition()
        self._outstanding = 0
        self.failure: BaseException | None = None
        self.committed = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"commit-{self.name}", daemon=True)
        self._thread.start()

    def submit(self, checkpoint_id: int, handle: H) -> None:
        self.raise_if_failed()
        if self._thread is None:
            self.start()
        with self._idle:
            self._outstanding += 1
        self._queue.put((checkpoint_id, handle))

    def raise_if_failed(self) -> None:
        failure = self.failure
        if isinstance(failure, StaleAttemptError):
            raise failure
        if failure is not None:
            raise CommitFailedError(
                f"sink '{self.name}': a commit failed {self.retries + 1} times: {failure}; "
                f"the job restarts from its last checkpoint and commits it again"
            ) from failure

    def drain(self, timeout_s: float = 120.0) -> None:
        """Wait until every submitted commit is done (or raise the failure)."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._outstanding and self.failure is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommitFailedError(
                        f"sink '{self.name}': {self._outstanding} commit(s) still running "
                        f"after {timeout_s:.0f} s; check that the system it writes to is up"
                    )
                self._idle.wait(min(left, 0.5))
        self.raise_if_failed()

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=10.0)
        self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            n, handle = item
            if self.failure is None:
                self._commit_with_retries(n, handle)
            with self._idle:
                self._outstanding -= 1
                self._idle.notify_all()

    def _commit_with_retries(self, n: int, handle: H) -> None:
        for attempt in range(self.retries + 1):
            try:
                self._commit(n, handle)
                self._on_committed(n)
                self.committed += 1
                return
            except StaleAttemptError as err:
                self.failure = err  # a newer attempt owns the subtask: retrying cannot help
                return
            except Exception as err:
                if attempt == self.retries:
                    self.failure = err
                    return
                log.warning(
                    "sink '%s': commit of checkpoint %d failed (try %d of %d): %s",
                    self.name,
                    n,
                    attempt + 1,
                    self.retries + 1,
                    err,
                )
                time.sleep(self.backoff_s * (2**attempt))

"""The transactional sink contract: txn ids, pre-commit/commit/recover, the committer thread."""

from __future__ import annotations

import threading
import time
from typing import Any

import msgpack
import pytest

from runtime.errors import ConnectorError
from runtime.sinks import OtherRunsOutput, SinkContext, SinkSnapshot, TwoPhaseCommitSink
from runtime.transactions import CommitFailedError, Epoch, StaleAttemptError, TxnId
from statebackend.errors import CorruptCheckpointError
from statebackend.restore import RescaledState


class Ledger:
    """A fake external system: transactions by id, committed in order."""

    def __init__(self) -> None:
        self.committed: list[tuple[int, list[Any]]] = []
        self.begun: list[str] = []
        self.aborted: list[int] = []
        self.recovered: list[tuple[str, int, int]] = []  # (what, subtask, checkpoint id)
        self.other_run: dict[int, str] = {}  # subtask -> output another run left
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next = 0
        self.commit_threads: set[str] = set()


class LedgerSink(TwoPhaseCommitSink[list[Any], list[Any]]):
    def __init__(self, ledger: Ledger, off_loop: bool = True) -> None:
        self.ledger = ledger
        self.commit_off_loop = off_loop

    def begin_transaction(self, txn_id: TxnId) -> Any:
        self.ledger.begun.append(str(txn_id))
        return []

    def write_to_transaction(self, txn: Any, records: list[Any]) -> None:
        txn.extend(records)

    def pre_commit(self, txn: Any, checkpoint_id: int) -> Any:
        return list(txn)

    def _commit(self, checkpoint_id: int, handle: Any) -> None:
        self.ledger.commit_threads.add(threading.current_thread().name)
        self.ledger.gate.wait(10)
        if self.ledger.fail_next:
            self.ledger.fail_next -= 1
            raise ConnectionError("ledger down")
        if checkpoint_id not in [n for n, _ in self.ledger.committed]:  # idempotent
            self.ledger.committed.append((checkpoint_id, list(handle)))

    def commit(self, checkpoint_id: int, handle: Any) -> None:
        self.ledger.recovered.append(("commit", self.ctx.subtask, checkpoint_id))
        self._commit(checkpoint_id, handle)

    def abort_uncovered(self, restored: SinkSnapshot) -> None:
        n = -1 if restored.checkpoint is None else restored.checkpoint
        self.ledger.aborted.append(n)
        self.ledger.recovered.append(("abort", self.ctx.subtask, n))

    def other_runs_output(self) -> OtherRunsOutput | None:
        found = self.ledger.other_run.get(self.ctx.subtask)
        return None if found is None else OtherRunsOutput(found, "use another ledger")


def ctx(subtask: int = 0, attempt: int = 0) -> SinkContext:
    return SinkContext("out", subtask, 2, attempt, lambda n, r: None, job="clicks")


def opened(ledger: Ledger, off_loop: bool = True, attempt: int = 0) -> LedgerSink:
    sink = LedgerSink(ledger, off_loop)
    sink.open(ctx(attempt=attempt))
    sink.restore_state(None)
    return sink


def wait_for(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_txn_ids_are_derived_from_job_step_subtask_checkpoint() -> None:
    txn = TxnId("clicks job", "pg:out", 3, 7)
    assert str(txn) == "absflow:clicks_job:pg_out:3:7"
    assert TxnId.parse(str(txn)) == TxnId("clicks_job", "pg_out", 3, 7)
    assert TxnId.parse("someone-else:1") is None
    assert txn.owner == "absflow:clicks_job:pg_out:3"


def test_the_id_of_a_transaction_is_known_when_it_begins() -> None:
    ledger = Ledger()
    sink = opened(ledger, off_loop=False)
    sink.write_batch([1])
    sink.snapshot_state(1)
    sink.snapshot_state(4)  # ids may skip (aborted checkpoints elsewhere)
    assert ledger.begun == [
        "absflow:clicks:out:0:1",
        "absflow:clicks:out:0:2",
        "absflow:clicks:out:0:5",
    ]


def test_snapshot_holds_pending_and_its_checkpoint() -> None:
    sink = opened(Ledger(), off_loop=False)
    sink.write_batch(["a"])
    state = sink.snapshot_state(3)
    assert state == {"pending": [[3, ["a"]]], "checkpoint": 3}


def test_commits_run_off_the_task_loop_and_never_block_records() -> None:
    ledger = Ledger()
    sink = opened(ledger)
    sink.write_batch([1, 2])
    sink.snapshot_state(1)
    ledger.gate.clear()  # the external system hangs
    sink.notify_checkpoint_complete(1)
    sink.write_batch([3])  # returns although the commit is stuck
    state = sink.snapshot_state(2)
    # Not confirmed yet: still pending in the snapshot (a restore would commit it).
    assert [n for n, _ in state["pending"]] == [1, 2]
    ledger.gate.set()
    wait_for(lambda: ledger.committed == [(1, [1, 2])])
    assert ledger.commit_threads == {"commit-out"}
    wait_for(lambda: 1 not in sink.pending)
    sink.notify_checkpoint_complete(2)
    sink.close()
    assert ledger.committed == [(1, [1, 2]), (2, [3])]


def test_committer_retries_then_commits() -> None:
    ledger = Ledger()
    ledger.fail_next = 2
    sink = opened(ledger)
    sink.committer.backoff_s = 0.01  # type: ignore[union-attr]
    sink.write_batch(["x"])
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.close()
    assert ledger.committed == [(1, ["x"])]


def test_a_commit_that_keeps_failing_fails_the_task_loop_and_stays_pending() -> None:
    ledger = Ledger()
    ledger.fail_next = 100
    sink = opened(ledger)
    sink.committer.backoff_s = 0.001  # type: ignore[union-attr]
    sink.write_batch(["x"])
    state = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    wait_for(lambda: sink.committer.failure is not None)  # type: ignore[union-attr]
    with pytest.raises(CommitFailedError, match="sink 'out': a commit failed 6 times"):
        sink.write_batch(["y"])
    assert 1 in sink.pending
    # The restarted task restores checkpoint 1 and commits it again.
    ledger.fail_next = 0
    fresh = LedgerSink(ledger)
    fresh.open(ctx(attempt=1))
    fresh.restore_state(msgpack.unpackb(msgpack.packb(state)))
    assert ledger.committed == [(1, ["x"])]
    fresh.close()


def test_a_stale_attempts_commit_is_not_retried_and_fails_the_task_as_stale() -> None:
    ledger = Ledger()
    sink = opened(ledger)
    sink.committer.backoff_s = 5.0  # type: ignore[union-attr]  # a retry would show
    sink.owner = lambda: Epoch("run", 1)  # type: ignore[method-assign]  # attempt 1 took over
    sink.write_batch(["x"])
    sink.pending[1] = ["x"]  # sealed before the takeover
    started = time.monotonic()
    sink.notify_checkpoint_complete(1)
    wait_for(lambda: sink.committer.failure is not None)  # type: ignore[union-attr]
    assert time.monotonic() - started < 2.0  # no backoff: a retry cannot help
    with pytest.raises(StaleAttemptError, match="attempt 0 will not commit checkpoint 1"):
        sink.write_batch(["y"])
    assert ledger.committed == []
    sink.committer.stop()  # type: ignore[union-attr]


def test_final_checkpoint_waits_for_its_commits() -> None:
    ledger = Ledger()
    sink = opened(ledger)
    sink.write_batch(["last"])
    sink.finish()
    sink.snapshot_state(9)
    sink.notify_checkpoint_complete(9)
    assert ledger.committed == [(9, ["last"])]  # committed before the task may end
    sink.close()


def test_aborted_checkpoint_keeps_its_transaction_for_the_next() -> None:
    ledger = Ledger()
    sink = opened(ledger, off_loop=False)
    sink.write_batch(["a"])
    sink.snapshot_state(1)
    sink.notify_checkpoint_aborted(1)
    sink.write_batch(["b"])
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)
    assert ledger.committed == [(1, ["a"]), (2, ["b"])]


def test_recover_commits_the_restored_pending_and_is_told_the_checkpoint() -> None:
    ledger = Ledger()
    sink = opened(ledger, off_loop=False)
    sink.write_batch(["a"])
    state = sink.snapshot_state(5)
    fresh = LedgerSink(ledger, off_loop=False)
    fresh.open(ctx(attempt=1))
    fresh.restore_state(state)
    assert ledger.committed == [(5, ["a"])]
    assert ledger.aborted == [-1, 5]
    assert ledger.begun[-1] == "absflow:clicks:out:0:6"


def test_sink_operator_tells_the_sink_of_an_aborted_checkpoint() -> None:
    from runtime.graph import Step, StepKind
    from runtime.operators import OperatorContext, SinkOperator

    class Told(LedgerSink):
        def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
            self.told = checkpoint_id

    sink = Told(Ledger(), off_loop=False)
    step = Step(0, "out", StepKind.SINK, 1, fn=sink)
    op_ctx = OperatorContext(0, 128, ctx())
    op = SinkOperator(step, op_ctx)
    op.open(op_ctx)
    op.notify_checkpoint_aborted(4)
    assert sink.told == 4


# -- the skeleton's recovery policy -------------------------------------------------------
def test_sink_snapshot_round_trips_and_reads_what_older_sinks_wrote() -> None:
    snap = SinkSnapshot(7, ((6, ["a"]), (7, ["b"])))
    assert SinkSnapshot.decode(msgpack.unpackb(msgpack.packb(snap.encode()))) == snap
    older = {"pending": [[7, "b"]], "checkpoint": 7, "next": 8}  # as sinks wrote it before
    assert SinkSnapshot.decode(older) == SinkSnapshot(7, ((7, "b"),))
    assert SinkSnapshot.decode(None) == SinkSnapshot.decode({}) == SinkSnapshot()
    # No "checkpoint" key: the newest pending one is the restored checkpoint.
    assert SinkSnapshot.decode({"pending": [[3, "x"]]}) == SinkSnapshot(3, ((3, "x"),))


def test_a_malformed_sink_snapshot_is_named() -> None:
    with pytest.raises(CorruptCheckpointError, match=r"sink snapshot .* is malformed"):
        SinkSnapshot.decode({"pending": [["three", "x"]], "checkpoint": 3})


def test_recover_commits_the_covered_transactions_in_order_before_aborting_the_rest() -> None:
    ledger = Ledger()
    sink = LedgerSink(ledger, off_loop=False)
    sink.open(ctx(attempt=1))
    sink.restore_state(SinkSnapshot(5, ((4, ["a"]), (5, ["b"]))).encode())
    assert ledger.recovered == [("commit", 0, 4), ("commit", 0, 5), ("abort", 0, 5)]
    assert ledger.committed == [(4, ["a"]), (5, ["b"])]


def test_a_fresh_start_refuses_a_target_holding_another_runs_output() -> None:
    ledger = Ledger()
    ledger.other_run[0] = "the ledger already holds entries of job 'clicks'"
    sink = LedgerSink(ledger, off_loop=False)
    sink.open(ctx())
    with pytest.raises(ConnectorError) as info:
        sink.restore_state(None)
    message = str(info.value)
    assert "sink 'out': the ledger already holds entries of job 'clicks'" in message
    assert "restore_from" in message and "use another ledger" in message
    assert ledger.recovered == []  # nothing committed or aborted
    # A restore is no fresh start: the same target is recovered, not refused.
    restored = LedgerSink(ledger, off_loop=False)
    restored.open(ctx(attempt=1))
    restored.restore_state(SinkSnapshot(3).encode())
    assert ledger.recovered == [("abort", 0, 3)]


def test_a_rescaled_restore_recovers_each_old_subtask_once_and_none_is_a_fresh_start() -> None:
    """New subtask 0 of 2 owns old subtasks 0 and 2 of 3: it recovers 2 as subtask 2
    (2 left no snapshot: it still aborts after the restored checkpoint, and another
    run's output at index 2 is not refused), then restores its own old snapshot."""
    ledger = Ledger()
    ledger.other_run = {0: "old output", 2: "old output"}
    old = {0: SinkSnapshot(8, ((8, ["x"]),)).encode(), 1: SinkSnapshot(8).encode(), 2: None}
    sink = LedgerSink(ledger, off_loop=False)
    sink.open(ctx())
    sink.restore_state(RescaledState(tuple(old.items()), 3))
    assert ledger.recovered == [("abort", 2, 8), ("commit", 0, 8), ("abort", 0, 8)]
    assert ledger.begun[-1] == "absflow:clicks:out:0:9"

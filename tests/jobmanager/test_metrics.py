"""Run figures across restores: committed (exactly-once) counts from the checkpoints,
work replayed, every attempt's checkpoints, collect-sink outputs."""

from __future__ import annotations

import pytest

from jobmanager.coordinator import CompletedCheckpoint
from jobmanager.failures import FailureCause
from jobmanager.metrics import CommittedOutputs, RecordCounts, RunMetrics
from jobmanager.result import Restart
from jobmanager.services import TaskInfo
from statebackend.metrics import AckMetrics, CheckpointSummary
from tests.jobmanager.fakes import small_plan

SOURCES, SINKS = (0, 1), (2, 3)


def cp(n: int, final: bool = False) -> CompletedCheckpoint:
    acks = {f"t{i}": AckMetrics(start_delay_ms=float(n + i), alignment_ms=0.5) for i in range(4)}
    return CompletedCheckpoint(n, final, 10.0, CheckpointSummary(), None, task_metrics=acks)


def snapshot(m: RunMetrics, n: int, records_in: int, records_out: int) -> None:
    """Every task acks checkpoint n; sources split records_in, sinks records_out."""
    for i in SOURCES:
        m.on_snapshot(i, n, AckMetrics(records_in=records_in // 2, records_out=records_in // 2))
    for i in SINKS:
        m.on_snapshot(i, n, AckMetrics(records_in=99, records_out=records_out // 2))


def table(records_in: int, records_out: int) -> dict[int, TaskInfo]:
    tasks = {i: TaskInfo(f"t{i}", i % 2) for i in range(4)}
    for i in SOURCES:
        tasks[i].records_in = records_in // 2
    for i in SINKS:
        tasks[i].records_out = records_out // 2
    return tasks


def test_committed_counts_after_a_restore_are_exactly_once() -> None:
    m = RunMetrics(small_plan())
    m.start_attempt(None)
    snapshot(m, 1, 100, 40)
    m.on_checkpoint_completed(cp(1))
    snapshot(m, 2, 200, 80)
    m.on_checkpoint_completed(cp(2))
    m.end_attempt(table(260, 120), False, [])  # killed after checkpoint 2: 60 in, 40 out lost
    m.start_attempt(2)
    assert m.live(table(10, 4)) == RecordCounts(210, 84)
    snapshot(m, 3, 100, 60)  # the restored attempt's own counts since its restore
    m.on_checkpoint_completed(cp(3))
    snapshot(m, 4, 800, 920)
    m.on_checkpoint_completed(cp(4, final=True))
    m.end_attempt(table(800, 920), True, [])
    assert m.committed_at[3] == RecordCounts(300, 140)
    assert m.committed() == RecordCounts(1000, 1000)
    assert m.processed == RecordCounts(1060, 1040)
    assert m.processed.beyond(m.committed()) == RecordCounts(60, 40)
    assert m.checkpoints_completed == 3  # every attempt's, the final one not counted


def test_a_restore_from_another_run_counts_this_runs_records() -> None:
    m = RunMetrics(small_plan())
    m.start_attempt(40)  # not a checkpoint of this run
    snapshot(m, 41, 10, 10)
    m.on_checkpoint_completed(cp(41, final=True))
    assert m.committed() == RecordCounts(10, 10)


def test_without_counts_from_every_task_the_last_attempt_counts() -> None:
    m = RunMetrics(small_plan())
    m.start_attempt(None)
    m.on_snapshot(0, 1, AckMetrics(records_in=5, records_out=5))
    m.on_checkpoint_completed(cp(1, final=True))
    m.end_attempt(table(10, 8), True, [])
    assert 1 not in m.committed_at
    assert m.committed() == RecordCounts(10, 8)


def test_start_up_and_recovery_times() -> None:
    m = RunMetrics(small_plan())
    m.on_first_record(0, 102.5, 100.0)
    assert m.startup_seconds == pytest.approx(2.5)
    m.restarts.append(Restart(0, FailureCause.TASK_DIED, "died", 1, failed_at=110.0))
    m.on_first_record(1, 111.25, 110.5)
    assert m.restarts[0].recovery_seconds == pytest.approx(1.25)
    assert m.startup_seconds == pytest.approx(2.5)


def test_result_and_summary_use_the_committed_figures() -> None:
    m = RunMetrics(small_plan())
    m.start_attempt(None)
    snapshot(m, 1, 100, 40)
    m.on_checkpoint_completed(cp(1))
    m.end_attempt(table(150, 60), False, [])
    m.restarts.append(Restart(0, FailureCause.TASK_DIED, "a task process died", 1, 0.0))
    m.start_attempt(1)
    snapshot(m, 2, 900, 960)
    m.on_checkpoint_completed(cp(2, final=True))
    m.end_attempt(table(900, 960), True, [])
    r = m.result("job", {"out": []}, 2.0, None, ["k: the job finished first, 1 checkpoint(s)"])
    assert (r.records_in, r.records_out, r.replayed_in, r.replayed_out) == (1000, 1000, 50, 20)
    assert r.records_per_second == 500.0
    assert r.checkpoints_completed == 1
    assert r.checkpoints[0].committed_records_in == 100
    # each task's part of each checkpoint, as its ack reported it
    tasks = r.checkpoints[1].tasks
    assert sorted(tasks) == ["t0", "t1", "t2", "t3"]
    assert (tasks["t3"].start_delay_ms, tasks["t3"].alignment_ms) == (5.0, 0.5)
    text = r.summary()
    assert "1,000 records in, 1,000 out (committed)" in text
    assert "replayed after restores: 50 records in, 20 out" in text
    assert "checkpoints: 1 completed + final" in text
    assert "1 checkpoint(s)" in text


def test_collect_outputs_first_copy_wins_and_replayed_batches_are_dropped() -> None:
    out = CommittedOutputs(small_plan())
    assert out.outputs() == {"out": []}
    out.add("out", 1, 1, [3])
    out.add("out", 0, 1, [1, 2])
    out.add("out", 0, 2, [4])
    out.add("out", 0, 1, [9, 9])  # re-committed after a restore: dropped
    assert out.outputs() == {"out": [1, 2, 3, 4]}
    out.drop_after(1)
    assert out.outputs() == {"out": [1, 2, 3]}
    out.drop_after(None)
    assert out.outputs() == {"out": []}


def test_a_run_restored_from_another_runs_checkpoint_drops_what_that_run_returned() -> None:
    """The sinks recommit the restored checkpoint's pending output on restore; the run
    that took it returned it already (a savepoint's last epoch would come back twice)."""
    resumed = CommittedOutputs(small_plan(), committed_up_to=12)
    resumed.add("out", 0, 12, [1, 2])  # recommitted on restore
    resumed.add("out", 0, 13, [3])
    assert resumed.outputs()["out"] == [3]
    fresh = CommittedOutputs(small_plan())  # companion: without the floor it comes back
    fresh.add("out", 0, 12, [1, 2])
    fresh.add("out", 0, 13, [3])
    assert fresh.outputs()["out"] == [1, 2, 3]


def test_checkpoints_completed_counts_non_final_ones_as_they_come() -> None:
    """Counted incrementally, asked between completions (the attempt's loop asks every
    turn); checkpoints appended to ``completed`` directly count too."""
    m = RunMetrics(small_plan())
    assert m.checkpoints_completed == 0
    m.on_checkpoint_completed(cp(1))
    m.on_checkpoint_completed(cp(2))
    assert m.checkpoints_completed == 2
    m.completed.append(cp(3))
    assert m.checkpoints_completed == 3
    m.on_checkpoint_completed(cp(4, final=True))
    assert m.checkpoints_completed == 3
    m.on_checkpoint_completed(cp(5))
    assert m.checkpoints_completed == m.checkpoints_completed == 4

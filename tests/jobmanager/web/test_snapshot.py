"""``jobmanager.web.snapshot`` without a server: what a published ``JobSnapshot`` holds
(rates, the duration histogram, the bounded history, job states) and the plan and
config views."""

from __future__ import annotations

from jobmanager.coordinator import CompletedCheckpoint
from jobmanager.metrics import RunMetrics
from jobmanager.services import TaskInfo
from jobmanager.web.snapshot import (
    DURATION_BUCKETS_MS,
    HISTORY,
    JobBoard,
    JobSnapshot,
    SnapshotBuilder,
    config_view,
    plan_view,
)
from runtime.config import JobConfig, SnapshotMode
from statebackend.metrics import CheckpointSummary, TaskMetrics
from tests.jobmanager.fakes import small_plan
from tests.jobmanager.web.fakes import FakeAttempt, FakeCoordinator


def builder(interval: float = 0.0) -> tuple[SnapshotBuilder, RunMetrics, FakeAttempt]:
    plan = small_plan()
    metrics = RunMetrics(plan)
    metrics.start_attempt(None)
    b = SnapshotBuilder(JobBoard(plan, JobConfig()), plan, metrics, interval=interval)
    tasks = {t.index: TaskInfo(t.task_id, t.subtask, pid=10 + t.index) for t in plan.tasks}
    return b, metrics, FakeAttempt(0, tasks)


def latest(b: SnapshotBuilder) -> JobSnapshot:
    assert b.board.latest is not None
    return b.board.latest


def completed(checkpoint_id: int, duration_ms: float) -> CompletedCheckpoint:
    return CompletedCheckpoint(checkpoint_id, False, duration_ms, CheckpointSummary(tasks=4), None)


def test_publish_builds_at_most_one_snapshot_per_interval() -> None:
    b, _, attempt = builder(interval=3600.0)
    b.publish(attempt)
    first = latest(b)
    attempt.tasks[0].metrics = TaskMetrics(records_in=5, uptime_seconds=1.0)
    b.publish(attempt)
    assert latest(b) is first  # too soon: nothing rebuilt
    b.finish("finished")  # an ending is published at once
    assert latest(b) is not first and latest(b).job["state"] == "finished"
    assert latest(b).tasks[0]["records_in"] == 5  # with the tasks' final figures


def test_rates_come_from_the_last_two_heartbeats_and_restart_with_a_new_attempt() -> None:
    b, _, attempt = builder()
    rates = []
    for uptime, records in ((1.0, 10), (3.0, 50), (3.0, 60), (0.5, 2), (1.5, 12)):
        attempt.tasks[2].metrics = TaskMetrics(
            records_in=records, records_out=records // 2, uptime_seconds=uptime
        )
        b.publish(attempt)
        row = latest(b).tasks[2]
        rates.append((row["records_in_per_second"], row["records_out_per_second"]))
    # first beat: none yet; +40 in 2 s; no time passed: kept; new attempt: none; +10 in 1 s
    assert rates == [(0.0, 0.0), (20.0, 10.0), (20.0, 10.0), (0.0, 0.0), (10.0, 5.0)]


def test_the_duration_histogram_counts_every_checkpoint_and_the_history_is_bounded() -> None:
    b, metrics, attempt = builder()
    durations = [5.0, 30.0, 99_999.0] + [60.0] * HISTORY
    metrics.completed.extend(completed(i + 1, d) for i, d in enumerate(durations))
    b.publish(attempt)
    snap = latest(b)
    assert len(snap.duration_buckets) == len(DURATION_BUCKETS_MS) + 1
    expected = [0] * (len(DURATION_BUCKETS_MS) + 1)
    expected[0] += 1  # 5 ms <= 10
    expected[2] += 1  # 25 < 30 ms <= 50
    expected[3] += HISTORY  # 50 < 60 ms <= 100
    expected[-1] += 1  # past the last bound: +Inf
    assert list(snap.duration_buckets) == expected
    assert snap.duration_sum_ms == sum(durations)
    ids = [c["checkpoint_id"] for c in snap.checkpoints]
    assert ids == list(range(4, len(durations) + 1))  # the newest HISTORY, oldest first
    assert snap.job["last_checkpoint_id"] == len(durations)
    b.publish(attempt)  # nothing new: counted once
    assert latest(b).duration_sum_ms == sum(durations)


def test_a_checkpoint_belongs_to_the_attempt_that_triggered_it() -> None:
    b, metrics, attempt = builder()
    attempt.coordinator = FakeCoordinator({7: object()})
    b.publish(attempt)
    assert latest(b).job["checkpoints_pending"] == [7]
    b.restarting("waiting for 4 task slots")
    snap = latest(b)
    assert (snap.job["state"], snap.job["message"]) == ("restarting", "waiting for 4 task slots")
    assert snap.job["checkpoints_pending"] == []
    metrics.completed.append(completed(7, 12.0))  # it completed as the attempt ended
    b.publish(FakeAttempt(1, attempt.tasks))
    assert latest(b).checkpoints[0]["attempt"] == 0 and latest(b).job["attempt"] == 1
    b.finish("failed", "task count[0] died 3 times")
    assert (latest(b).job["state"], latest(b).job["error"]) == (
        "failed",
        "task count[0] died 3 times",
    )


def test_the_config_view_is_json_ready_and_leaves_credentials_out() -> None:
    view = config_view(
        JobConfig(
            snapshot_mode=SnapshotMode.AT_LEAST_ONCE,
            checkpoint_interval=2.5,
            storage_options={"key": "secret"},
        )
    )
    assert "storage_options" not in view
    assert view["snapshot_mode"] == "at_least_once" and view["checkpoint_interval"] == 2.5
    assert all(v is None or isinstance(v, bool | int | float | str) for v in view.values())


def test_the_plan_view_names_steps_chains_tasks_and_channels() -> None:
    view = plan_view(small_plan())
    assert [c["steps"] for c in view["chains"]] == [["src"], ["count", "out"]]
    assert {s["name"]: s["chain"] for s in view["steps"]} == {"src": 0, "count": 1, "out": 1}
    assert [(c["source_task"], c["target_task"]) for c in view["channels"]] == [
        (0, 2),
        (0, 3),
        (1, 2),
        (1, 3),
    ]
    assert {c["partitioning"] for c in view["channels"]} == {"hash"}
    assert view["back_edges"] == [] and not any(c["back_edge"] for c in view["channels"])

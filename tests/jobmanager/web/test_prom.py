"""``/metrics`` (``jobmanager.web.prom``): a job's snapshot in Prometheus' text format,
over HTTP and from ``registry_for``/``exposition`` directly."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from jobmanager.coordinator import CompletedCheckpoint
from jobmanager.metrics import RunMetrics
from jobmanager.services import TaskInfo
from jobmanager.web.prom import METRICS, MetricType, exposition, registry_for
from jobmanager.web.server import DashboardServer
from jobmanager.web.snapshot import JobBoard, SnapshotBuilder
from runtime.config import JobConfig
from statebackend.metrics import CheckpointSummary, TaskMetrics
from tests.jobmanager.fakes import small_plan
from tests.jobmanager.web.fakes import FakeAttempt, get, published


def test_metrics_in_prometheus_format_per_job(server: DashboardServer) -> None:
    board, _, _ = published(server)
    status, ctype, body = get(server.url + "metrics")
    assert status == 200 and ctype.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    records = families["absflow_task_records_in"]
    assert records.type == "counter"
    by_task = {
        (s.labels["step"], s.labels["subtask"]): s.value
        for s in records.samples
        if s.name.endswith("_total")
    }
    assert by_task == {("src", "0"): 10, ("src", "1"): 20, ("count", "0"): 30, ("count", "1"): 40}
    assert all(s.labels["job"] == board.job_id for s in records.samples)
    hist = families["absflow_checkpoint_duration_seconds"]
    count = next(s for s in hist.samples if s.name.endswith("_count"))
    assert count.value == 1
    assert families["absflow_checkpoint_last_completed_id"].samples[0].value == 4
    assert "absflow_task_backpressure_seconds" in families
    assert "absflow_restarts" in families


def samples(board: JobBoard) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = exposition(registry_for(board)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def published_board() -> tuple[JobBoard, SnapshotBuilder, RunMetrics, FakeAttempt]:
    plan = small_plan()
    metrics = RunMetrics(plan)
    metrics.start_attempt(None)
    board = JobBoard(plan, JobConfig())
    builder = SnapshotBuilder(board, plan, metrics, interval=0.0)
    tasks = {t.index: TaskInfo(t.task_id, t.subtask, pid=10 + t.index) for t in plan.tasks}
    return board, builder, metrics, FakeAttempt(0, tasks)


def test_a_job_that_published_nothing_exports_nothing() -> None:
    board, *_ = published_board()
    assert samples(board) == {}


def test_the_duration_histogram_is_cumulative_in_seconds() -> None:
    board, builder, metrics, attempt = published_board()
    summary = CheckpointSummary(tasks=4, state_bytes=300, full_state_bytes=900)
    for n, ms in enumerate((5.0, 30.0, 99_999.0), start=1):
        metrics.completed.append(CompletedCheckpoint(n, False, ms, summary, None))
    builder.publish(attempt)
    got = samples(board)
    job = (("job", board.job_id),)

    def bucket(le: str) -> float:
        return got[("absflow_checkpoint_duration_seconds_bucket", (*job, ("le", le)))]

    assert [bucket(le) for le in ("0.01", "0.025", "0.05", "60.0", "+Inf")] == [1, 1, 2, 2, 3]
    assert got[("absflow_checkpoint_duration_seconds_count", job)] == 3
    assert got[("absflow_checkpoint_duration_seconds_sum", job)] == (5.0 + 30.0 + 99_999.0) / 1000
    assert got[("absflow_checkpoint_last_completed_id", job)] == 3
    assert got[("absflow_checkpoint_size_bytes", (*job, ("kind", "full_state")))] == 900
    assert got[("absflow_checkpoint_size_bytes", (*job, ("kind", "state")))] == 300
    assert got[("absflow_checkpoints_completed_total", job)] == metrics.checkpoints_completed


def test_task_families_label_step_by_chain_and_skip_figures_not_there_yet() -> None:
    board, builder, _, attempt = published_board()
    attempt.tasks[3].metrics = TaskMetrics(records_out=8, uptime_seconds=1.0, watermark=1234)
    builder.publish(attempt)
    got = samples(board)
    key = (("job", board.job_id), ("step", "count"), ("subtask", "1"))
    assert got[("absflow_task_records_out_total", key)] == 8
    watermarks = {k: v for k, v in got.items() if k[0] == "absflow_task_watermark"}
    assert watermarks == {("absflow_task_watermark", key): 1234}  # the others have none


def test_every_counter_is_exposed_with_total_and_every_name_once() -> None:
    names = [m.name for m in METRICS]
    assert len(set(names)) == len(names)
    assert all(n.startswith("absflow_") for n in names)
    for spec in METRICS:
        suffix = spec.exposed_name.removeprefix(spec.name)
        assert suffix == ("_total" if spec.type is MetricType.COUNTER else "")

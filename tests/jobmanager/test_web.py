"""The dashboard's server, REST API and /metrics against a published snapshot (no Spark)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobmanager.coordinator import CompletedCheckpoint
from jobmanager.failures import FailureCause
from jobmanager.metrics import RunMetrics
from jobmanager.result import FailedCheckpoint, Restart, SuperstepRecovery
from jobmanager.services import TaskInfo
from jobmanager.supersteps import IterationPhase
from jobmanager.web import Dashboard, close_all, serve
from jobmanager.web.server import DashboardServer, UiError
from jobmanager.web.snapshot import JobBoard, SnapshotBuilder
from runtime.config import JobConfig
from runtime.control import CheckpointFailureReason
from runtime.errors import GraphError
from statebackend.metrics import AckMetrics, CheckpointSummary, TaskMetrics
from tests.jobmanager.fakes import small_plan


@dataclass
class FakeCoordinator:
    pending: dict[int, Any] = field(default_factory=dict)
    failed: list[FailedCheckpoint] = field(default_factory=list)


@dataclass
class FakeAttempt:
    number: int
    tasks: dict[int, TaskInfo]
    coordinator: FakeCoordinator = field(default_factory=FakeCoordinator)
    supersteps: Any = None  # an iteration's driver (jobmanager.supersteps)


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as res:
            return res.status, res.headers["Content-Type"], res.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


@pytest.fixture
def server() -> Iterator[DashboardServer]:
    srv = serve("127.0.0.1", 0, say=lambda _: None)
    yield srv
    close_all()


def published(srv: DashboardServer) -> tuple[JobBoard, SnapshotBuilder, FakeAttempt]:
    """A job with 4 tasks, a completed and a failed checkpoint and a restart, published."""
    plan = small_plan()
    metrics = RunMetrics(plan)
    metrics.start_attempt(None)
    board = JobBoard(plan, JobConfig(checkpoint_interval=1.0, storage_options={"secret": "x"}))
    builder = SnapshotBuilder(board, plan, metrics, interval=0.0)
    srv.add(board)
    tasks = {t.index: TaskInfo(t.task_id, t.subtask, pid=100 + t.index) for t in plan.tasks}
    for i, t in tasks.items():
        t.records_in = t.records_out = 10 * (i + 1)  # as the heartbeats set them
        t.metrics = TaskMetrics(
            records_in=10 * (i + 1),
            records_out=10 * (i + 1),
            bytes_out=1000,
            backpressure_seconds=0.25,
            uptime_seconds=1.0,
            idle_seconds=0.25,
            input_queue=i,
        )
    attempt = FakeAttempt(1, tasks, FakeCoordinator({5: object()}))
    attempt.coordinator.failed.append(
        FailedCheckpoint(3, CheckpointFailureReason.EXPIRED, "2 task(s) did not ack", attempt=1)
    )
    acks = {"src[0]": AckMetrics(alignment_ms=1.5, start_delay_ms=0.5, state_bytes=40)}
    summary = CheckpointSummary(tasks=1, mode="exactly_once", state_bytes=40)
    metrics.completed.append(CompletedCheckpoint(4, False, 42.0, summary, None, 1.0, acks))
    metrics.restarts.append(
        Restart(0, FailureCause.TASK_DIED, "task count[1] died", 2, time.time() - 2, None, None)
    )
    builder.publish(attempt)
    return board, builder, attempt


def test_rest_api_answers_with_the_published_state(server: DashboardServer) -> None:
    board, _, _ = published(server)
    base = server.url + "api/"
    status, ctype, body = get(base + "jobs")
    assert status == 200 and ctype == "application/json"
    jobs = json.loads(body)["jobs"]
    assert [j["id"] for j in jobs] == [board.job_id] and jobs[0]["state"] == "running"

    plan = json.loads(get(base + "plan")[2])
    assert [t["task_id"] for t in plan["tasks"]] == ["src[0]", "src[1]", "count[0]", "count[1]"]
    assert len(plan["channels"]) == 4 and plan["back_edges"] == []

    tasks = json.loads(get(base + f"tasks?job={board.job_id}")[2])["tasks"]
    assert tasks[1]["records_in"] == 20 and tasks[1]["backpressure_share"] == 0.25
    assert tasks[1]["busy_share"] == 0.5 and tasks[3]["input_queue"] == 3

    cps = json.loads(get(base + "checkpoints")[2])
    assert [c["checkpoint_id"] for c in cps["completed"]] == [4] and cps["pending"] == [5]
    assert cps["completed"][0]["tasks"]["src[0]"]["alignment_ms"] == 1.5
    assert cps["failed"] == [
        {"checkpoint_id": 3, "attempt": 1, "reason": "EXPIRED", "detail": "2 task(s) did not ack"}
    ]
    assert json.loads(get(base + "checkpoints?since=4")[2])["completed"] == []

    restarts = json.loads(get(base + "restarts")[2])["restarts"]
    assert restarts[0]["cause"] == "TASK_DIED" and restarts[0]["restored_checkpoint"] == 2

    config = json.loads(get(base + "config")[2])["config"]
    assert config["checkpoint_interval"] == 1.0 and config["snapshot_mode"] == "exactly_once"
    assert "storage_options" not in config  # credentials stay out

    m = json.loads(get(base + "metrics")[2])
    assert m["records_in"] == 30 and m["records_out"] == 70  # sources 0, 1; sinks 2, 3
    assert m["last_checkpoint_id"] == 4 and m["restarts"] == 1


def test_unknown_paths_404_and_bad_queries_400_never_a_traceback(
    server: DashboardServer,
) -> None:
    published(server)
    base = server.url
    for path in ("api/nope", "nope", "static/../server.py", "static/%2e%2e/server.py", "api/"):
        status, _, body = get(base + path)
        assert status == 404, path
        assert b"Traceback" not in body
    for query in (
        "checkpoints?limit=ten",
        "checkpoints?limit=0",
        "tasks?color=red",
        "tasks?job=a&job=b",
    ):
        status, ctype, body = get(base + "api/" + query)
        assert status == 400 and ctype == "application/json", query
        assert "error" in json.loads(body)
    assert get(base + "api/tasks?job=unknown")[0] == 404
    assert get(base + "metrics?limit=3")[0] == 400
    req = urllib.request.Request(base + "api/jobs", method="POST", data=b"{}")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 405  # read-only


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


def test_the_dashboard_page_and_its_vendored_libraries_are_served(server: DashboardServer) -> None:
    published(server)
    status, ctype, page = get(server.url)
    assert status == 200 and ctype.startswith("text/html")
    for src in (
        b"/static/vendor/cytoscape.min.js",
        b"/static/app.js",
        b"/static/vendor/uPlot.iife.min.js",
    ):
        assert src in page
        assert get(server.url + src.decode().lstrip("/"))[0] == 200
    assert b"http://" not in page and b"https://" not in page  # no CDN


def test_binds_127_0_0_1_by_default_and_a_taken_port_picks_another() -> None:
    config = JobConfig()
    assert config.ui_host == "127.0.0.1" and config.ui
    said: list[str] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            dash = Dashboard(small_plan(), JobConfig(ui_port=port), RunMetrics(small_plan()))
            assert dash.url is None  # nothing is bound before open()
            dash.open(said.append)
            assert dash.url is not None and f":{port}/" not in dash.url
            assert said and f"port {port} is in use" in said[0]
            srv = serve("127.0.0.1", port, said.append)  # the job's server, found again
            assert srv.httpd.server_address[0] == "127.0.0.1"
            assert get(srv.url + "api/jobs")[0] == 200
        finally:
            close_all()


def test_ui_false_serves_nothing_and_bad_settings_are_named() -> None:
    dash = Dashboard(small_plan(), JobConfig(ui=False), RunMetrics(small_plan()))
    assert dash.open(print) is None and dash.url is None
    dash.finish("finished")  # no-op
    with pytest.raises(GraphError, match="ui_port must be a TCP port"):
        JobConfig(ui_port=70000)
    with pytest.raises(UiError, match=r"ui_host='256\.1\.1\.1'"):
        serve("256.1.1.1", 0, print)


def test_a_stuck_client_does_not_block_publishing_or_other_clients(
    server: DashboardServer,
) -> None:
    _, builder, attempt = published(server)
    with socket.create_connection(("127.0.0.1", server.port)) as stuck:
        stuck.sendall(b"GET /api/jobs HTTP/1.1\r\n")  # never finishes its request
        attempt.tasks[0].metrics = TaskMetrics(records_in=99, uptime_seconds=2.0)
        publishing = threading.Thread(target=builder.publish, args=(attempt,))
        publishing.start()  # a reference swap: no wait on any client
        publishing.join(30)  # (a guard against a hang, not a measure)
        assert not publishing.is_alive(), "publish waited for the stuck client"
        tasks = json.loads(get(server.url + "api/tasks")[2])["tasks"]
        assert tasks[0]["records_in"] == 99
        stuck.setblocking(False)  # ... and the stuck client is still waiting: no answer yet
        with pytest.raises(BlockingIOError):
            stuck.recv(1)


def test_a_long_lived_driver_keeps_the_newest_jobs_only(server: DashboardServer) -> None:
    plan, config = small_plan(), JobConfig()
    boards = [JobBoard(plan, config) for _ in range(22)]
    for board in boards:
        server.add(board)
    assert list(server.jobs) == [b.job_id for b in boards[-20:]]
    assert set(server.registries) == set(server.jobs)  # their /metrics registries too


@dataclass
class FakeSupersteps:
    phase: IterationPhase
    current: int


def test_an_iterations_supersteps_show_in_the_api_and_metrics(server: DashboardServer) -> None:
    """A running iteration: its phase, superstep, aggregate, checkpoints and recoveries in
    /api/iteration and /api/overview, and absflow_superstep & co in /metrics; a job that
    is no iteration answers null and exports none of them."""
    plain, _, _ = published(server)
    assert json.loads(get(server.url + f"api/iteration?job={plain.job_id}")[2])["iteration"] is None
    families = {
        f.name
        for f in text_string_to_metric_families(
            get(server.url + f"metrics?job={plain.job_id}")[2].decode()
        )
    }
    assert "absflow_superstep" not in families

    from runtime.api.iterations import iteration_dataflow
    from runtime.iterations.library import ConnectedComponentsStep

    graph = {0: (1,), 1: (0,), 2: ()}
    flow = iteration_dataflow(
        "cc", ConnectedComponentsStep(), {v: v for v in graph}, graph, list(graph), 2, None, None
    )
    plan = flow.plan()
    metrics = RunMetrics(plan)
    assert metrics.iteration is not None
    progress = metrics.iteration
    progress.supersteps, progress.supersteps_started = 4, 6
    progress.aggregates = [(1, 3.0), (2, 2.0), (3, 1.0), (4, 1.0)]
    progress.checkpoints = [(2, 1), (4, 3)]
    progress.recoveries = [SuperstepRecovery(4, 2)]
    board = JobBoard(plan, JobConfig())
    builder = SnapshotBuilder(board, plan, metrics, interval=0.0)
    server.add(board)
    tasks = {t.index: TaskInfo(t.task_id, t.subtask, pid=200 + t.index) for t in plan.tasks}
    builder.publish(FakeAttempt(1, tasks, supersteps=FakeSupersteps(IterationPhase.SUPERSTEP, 5)))

    it = json.loads(get(server.url + f"api/iteration?job={board.job_id}")[2])["iteration"]
    assert (it["phase"], it["superstep"], it["supersteps_done"]) == ("superstep", 5, 4)
    assert it["supersteps_started"] == 6 and it["aggregate"] == 1.0 and it["rerun"] == 2
    assert [c["superstep"] for c in it["checkpoints"]] == [2, 4]
    assert it["recoveries"] == [{"failed_during": 4, "resumed_from": 2, "rerun": 2}]
    overview = json.loads(get(server.url + f"api/overview?job={board.job_id}")[2])
    assert overview["iteration"] == it
    text = get(server.url + f"metrics?job={board.job_id}")[2].decode()
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["absflow_superstep"].value == 5
    assert samples["absflow_superstep"].labels["phase"] == "superstep"
    assert samples["absflow_supersteps_done"].value == 4
    assert samples["absflow_superstep_aggregate"].value == 1.0
    assert samples["absflow_supersteps_started_total"].value == 6
    builder.finish("finished")
    assert (
        json.loads(get(server.url + f"api/iteration?job={board.job_id}")[2])["iteration"]["phase"]
        == "finished"
    )

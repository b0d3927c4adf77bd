"""The REST API (``jobmanager.web.api``): over HTTP against a published job, and its pure
``answer``, ``parse_query``, ``int_param`` and ``Jobs`` called directly."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobmanager.coordinator import CompletedCheckpoint
from jobmanager.metrics import RunMetrics
from jobmanager.result import SuperstepRecovery
from jobmanager.services import TaskInfo
from jobmanager.supersteps import IterationPhase
from jobmanager.web.api import (
    API,
    ENDPOINTS,
    MAX_LIMIT,
    BadRequest,
    Jobs,
    NotFound,
    answer,
    int_param,
    parse_query,
)
from jobmanager.web.server import DashboardServer
from jobmanager.web.snapshot import JobBoard, SnapshotBuilder
from runtime.config import JobConfig
from statebackend.metrics import CheckpointSummary
from tests.jobmanager.fakes import small_plan
from tests.jobmanager.web.fakes import FakeAttempt, FakeSupersteps, get, published


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


def test_a_long_lived_driver_keeps_the_newest_jobs_only(server: DashboardServer) -> None:
    plan, config = small_plan(), JobConfig()
    boards = [JobBoard(plan, config) for _ in range(22)]
    for board in boards:
        server.add(board)
    assert list(server.jobs) == [b.job_id for b in boards[-20:]]
    assert set(server.registries) == set(server.jobs)  # their /metrics registries too


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


def board_with_checkpoints(ids: range) -> tuple[JobBoard, SnapshotBuilder, FakeAttempt]:
    """A published job (not on any server) whose run completed checkpoints ``ids``."""
    plan = small_plan()
    metrics = RunMetrics(plan)
    metrics.start_attempt(None)
    board = JobBoard(plan, JobConfig())
    builder = SnapshotBuilder(board, plan, metrics, interval=0.0)
    metrics.completed.extend(
        CompletedCheckpoint(n, False, 10.0, CheckpointSummary(tasks=4), None) for n in ids
    )
    tasks = {t.index: TaskInfo(t.task_id, t.subtask, pid=10 + t.index) for t in plan.tasks}
    attempt = FakeAttempt(0, tasks)
    builder.publish(attempt)
    return board, builder, attempt


def test_query_strings_take_each_known_parameter_once() -> None:
    assert parse_query("", ("job",)) == {}
    assert parse_query("job=a&limit=3", ("job", "limit")) == {"job": "a", "limit": "3"}
    assert parse_query("job=", ("job",)) == {"job": ""}
    with pytest.raises(
        BadRequest, match=r"unknown query parameter\(s\) \['color'\]; .* takes: job"
    ):
        parse_query("color=red", ("job",))
    with pytest.raises(BadRequest, match="takes: none"):
        parse_query("job=a", ())
    with pytest.raises(BadRequest, match="'job' is given 2 times; give it once"):
        parse_query("job=a&job=b", ("job",))
    with pytest.raises(BadRequest, match="malformed query string 'job'"):
        parse_query("job", ("job",))


def test_integer_parameters_are_checked_against_their_range() -> None:
    assert int_param({}, "limit", 100, 1, 1000) == 100
    assert int_param({"limit": "7"}, "limit", 100, 1, 1000) == 7
    with pytest.raises(BadRequest, match=r"limit='ten' is not an integer"):
        int_param({"limit": "ten"}, "limit", 100, 1, 1000)
    with pytest.raises(BadRequest, match=r"limit=0 is out of range \[1, 1000\]"):
        int_param({"limit": "0"}, "limit", 100, 1, 1000)


def test_jobs_pick_the_newest_by_default_and_name_the_known_ones() -> None:
    jobs = Jobs()
    with pytest.raises(NotFound, match="no job has run in this driver yet"):
        jobs.pick(None)
    first, second = JobBoard(small_plan(), JobConfig()), JobBoard(small_plan(), JobConfig())
    jobs.add(first)
    jobs.add(second)
    assert jobs.pick(None) is second and jobs.pick(first.job_id) is first
    with pytest.raises(NotFound, match=rf"no job 'x'; jobs: \['{first.job_id}', "):
        jobs.pick("x")
    jobs.add(JobBoard(small_plan(), JobConfig()), keep=2)
    assert first.job_id not in jobs and len(jobs) == 2


def test_answers_are_status_and_body_never_an_exception() -> None:
    jobs = Jobs()
    assert answer(jobs, "jobs", "") == (200, {"jobs": []})
    status, body = answer(jobs, "/tasks/", "")
    assert status == 404 and "no job has run" in str(body)
    status, body = answer(jobs, "nope", "")
    assert status == 404 and "/api/overview" in str(body)  # the endpoints are listed

    waiting = JobBoard(small_plan(), JobConfig())  # added, nothing published yet
    jobs.add(waiting)
    assert answer(jobs, "jobs", "")[1] == {
        "jobs": [{"id": waiting.job_id, "name": "job", "state": "starting"}]
    }
    assert answer(jobs, "plan", "")[0] == 200  # static: there from the start
    status, body = answer(jobs, "tasks", "")
    assert status == 404 and "has not published its state yet" in str(body)
    assert answer(jobs, "tasks", "limit=3")[0] == 400  # /tasks takes no limit


def test_checkpoints_since_an_id_and_the_newest_limit() -> None:
    board, _, _ = board_with_checkpoints(range(1, 6))
    jobs = Jobs()
    jobs.add(board)

    def ids(query: str) -> list[object]:
        status, body = answer(jobs, "checkpoints", query)
        assert status == 200 and isinstance(body, dict)
        return [c["checkpoint_id"] for c in body["completed"]]

    assert ids("") == [1, 2, 3, 4, 5]
    assert ids("limit=2") == [4, 5]
    assert ids("since=3") == [4, 5]
    assert ids("since=1&limit=1") == [5]
    assert answer(jobs, "checkpoints", f"limit={MAX_LIMIT + 1}")[0] == 400
    overview = answer(jobs, "overview", "limit=1")[1]
    assert isinstance(overview, dict)
    assert [c["checkpoint_id"] for c in overview["checkpoints"]["completed"]] == [5]


def test_every_endpoint_of_the_table_answers_for_a_published_job() -> None:
    board, _, _ = board_with_checkpoints(range(1, 3))
    jobs = Jobs()
    jobs.add(board)
    assert len(set(ENDPOINTS)) == len(API) and ENDPOINTS[0] == "jobs"
    for endpoint in API:
        assert endpoint.path == f"/api/{endpoint.name}"
        status, body = answer(jobs, endpoint.name, f"job={board.job_id}" if endpoint.params else "")
        assert status == 200, (endpoint.name, body)

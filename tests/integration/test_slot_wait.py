"""A restart that finds too few task slots (a host lost with its worker) waits for them,
says so in the log and on the dashboard (REST: state "restarting" and a message), and
resumes exactly once a worker returns. On the harness with the launcher's slot count
faked (Spark's own count is what `check_slots` reads on a cluster; the host tests lose
a real worker): the runner, the slot wait and the dashboard are real."""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
import urllib.request
from typing import Any

import pytest

from jobmanager.faults import Kill
from jobmanager.launcher import check_slots
from jobmanager.local_launcher import LocalProcessLauncher
from jobmanager.web import DashboardServer
from runtime.config import JobConfig
from runtime.errors import InsufficientSlotsError
from tests.integration.topologies import pipeline, pipeline_expected

pytestmark = [pytest.mark.harness]

TASKS = 7  # pipeline(): numbers x2, square x2, count x2, out x1
N = 6_000


class Cluster:
    """What `check_slots` reads of a SparkContext: its master and its task slots now."""

    master = "spark://hosts:7077"

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.asked = threading.Event()  # the restart is checking the slots

    @property
    def _jsc(self) -> Cluster:
        return self

    def sc(self) -> Cluster:
        return self

    def resourceProfileManager(self) -> Cluster:
        return self

    def defaultResourceProfile(self) -> None:
        return None

    def maxNumConcurrentTasks(self, _profile: Any) -> int:
        self.asked.set()
        return self.slots


def job_now(srv: DashboardServer) -> Any:
    with urllib.request.urlopen(srv.url + "api/jobs", timeout=10) as res:
        jobs = json.loads(res.read())["jobs"]
    return jobs[-1] if jobs else None


def waited(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def lost_a_host(monkeypatch: pytest.MonkeyPatch, cluster: Cluster, wait: float | None) -> None:
    """Restarts check ``cluster``'s slots as the Spark launcher does (``wait``: seconds,
    None: the job's executor_wait)."""

    def before_restart(self: Any, tasks: int, config: JobConfig, say: Any) -> None:
        limit = config.executor_wait if wait is None else wait
        check_slots(cluster, tasks, wait=limit, say=say, poll=0.05)

    monkeypatch.setattr(LocalProcessLauncher, "before_restart", before_restart)


def test_a_restart_waits_for_slots_says_so_and_resumes_exactly(
    server: DashboardServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = Cluster(slots=4)  # the lost host took 3 of the job's 7 slots along
    lost_a_host(monkeypatch, cluster, wait=None)
    flow = pipeline(N, rate=3_000, checkpoint_interval=0.2, ui_port=server.port)
    outcome: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: outcome.update(
            result=flow.run(faults=[Kill("count[0]", after_checkpoint=2)])
        ),
        daemon=True,
    )
    with caplog.at_level(logging.WARNING, logger="absflow.jobmanager"):
        thread.start()
        assert cluster.asked.wait(120), "the restart never checked the slots"
        job = waited(
            "the dashboard to say the job waits for slots",
            lambda: (
                (j := job_now(server))
                and j["state"] == "restarting"
                and j["message"]
                and "4 of 7" in j["message"]
                and j
            ),
        )
        assert "waiting up to 60 s for executors: 4 of 7 task slots" in job["message"]
        cluster.slots = TASKS  # a worker returns
        thread.join(180)
    assert not thread.is_alive()
    result = outcome["result"]
    assert collections.Counter(result.output("out")) == pipeline_expected(N)
    assert len(result.restarts) == 1
    waits = [r.getMessage() for r in caplog.records if "task slots registered" in r.getMessage()]
    assert waits and "attempt 1: waiting up to 60 s" in waits[0], waits
    assert job_now(server)["state"] == "finished" and job_now(server)["message"] is None


def test_companion_without_the_wait_the_restart_fails_naming_the_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lost_a_host(monkeypatch, Cluster(slots=4), wait=0.0)
    flow = pipeline(N, rate=3_000, checkpoint_interval=0.2, ui=False)
    with pytest.raises(InsufficientSlotsError, match=r"cannot restart after attempt 0 failed"):
        flow.run(faults=[Kill("count[0]", after_checkpoint=2)])

"""The dashboard against running jobs: the REST API and /metrics agree with the job's own
result (on the test harness: task processes, no Spark; the launcher is not the point),
and the page in a real headless Chromium shows the graph, a checkpoint while the job
runs and a restart after a kill (on local Spark; screenshots kept: the
directory in ``ABSFLOW_TEST_ARTIFACTS``, else pytest's tmp_path)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobmanager.faults import Kill
from jobmanager.result import JobResult
from jobmanager.web import DashboardServer
from tests.integration.topologies import pipeline

pytestmark = [pytest.mark.harness]

TASKS = 7  # pipeline(): numbers x2, square x2, count x2, out x1


def api(srv: DashboardServer, path: str) -> Any:
    with urllib.request.urlopen(srv.url + "api/" + path, timeout=10) as res:
        return json.loads(res.read())


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Background:
    """Runs a job on a thread (the test drives the browser meanwhile)."""

    def __init__(self, run: Callable[[], JobResult]) -> None:
        self.result: JobResult | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(run,), daemon=True)
        self.thread.start()

    def _run(self, run: Callable[[], JobResult]) -> None:
        try:
            self.result = run()
        except BaseException as err:
            self.error = err

    def join(self) -> JobResult:
        self.thread.join(timeout=300)
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def current_job(srv: DashboardServer) -> Any:
    jobs = api(srv, "jobs")["jobs"]
    return jobs[-1] if jobs else None


def test_rest_api_and_metrics_agree_with_the_jobs_result(server: DashboardServer) -> None:
    n = 24_000
    flow = pipeline(n, rate=6_000, checkpoint_interval=0.2, ui_port=server.port)
    job = Background(flow.run)
    running = wait_for(
        "the job running", lambda: (j := current_job(server)) and j["state"] == "running" and j
    )
    tasks = wait_for(
        "task heartbeats", lambda: [t for t in api(server, "tasks")["tasks"] if t["pid"]]
    )
    assert len(api(server, "plan")["tasks"]) == TASKS
    assert {t["task_id"] for t in tasks} <= {t["task_id"] for t in api(server, "plan")["tasks"]}
    live_cp = wait_for("a checkpoint", lambda: api(server, "checkpoints")["completed"])
    assert api(server, "job")["state"] in ("running", "finished")
    result = job.join()

    final = api(server, "job")
    assert final["id"] == running["id"] and final["state"] == "finished"
    assert result.ui_url is not None and running["id"] in result.ui_url
    assert (final["records_in"], final["records_out"]) == (result.records_in, result.records_out)
    assert final["records_in"] == n
    assert final["checkpoints_completed"] == result.checkpoints_completed
    ids = [c.checkpoint_id for c in result.checkpoints]
    cps = api(server, "checkpoints?limit=1000")
    assert [c["checkpoint_id"] for c in cps["completed"]] == ids
    assert live_cp[0]["checkpoint_id"] in ids
    assert final["last_checkpoint_id"] == ids[-1]
    rows = api(server, "tasks")["tasks"]
    assert sum(t["records_in"] for t in rows if t["source"]) == n  # the Finished figures
    assert all(t["bytes_out"] > 0 for t in rows if not t["sink"])

    with urllib.request.urlopen(server.url + "metrics", timeout=10) as res:
        families = {f.name: f for f in text_string_to_metric_families(res.read().decode())}
    sources = [
        s.value
        for s in families["absflow_task_records_in"].samples
        if s.labels["step"] == "numbers" and s.name.endswith("_total")
    ]
    assert sum(sources) == n
    completed = families["absflow_checkpoints_completed"].samples[0].value
    assert completed == result.checkpoints_completed
    hist = families["absflow_checkpoint_duration_seconds"]
    assert next(s.value for s in hist.samples if s.name.endswith("_count")) == len(ids)
    assert families["absflow_checkpoint_last_completed_id"].samples[0].value == ids[-1]


# -- the page in headless Chromium ---------------------------------------------------------
def _browser(tmp_path: Path) -> Any:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip(
            "no Chromium here (needs the Debian packages chromium and chromium-driver; "
            ".ci/run installs them when apt-get is available)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1800",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(driver))


def quit_browser(browser: Any, profile: Path) -> None:
    """Quit, then wait (bounded) until chromedriver and every Chromium process of this
    profile are gone: no test leaves a process or port behind."""
    browser.quit()
    browser.service.process.wait(timeout=30)
    wait_for("Chromium to exit", lambda: not _processes_with(str(profile)), timeout=30)


def _processes_with(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if text.encode() in fh.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def artifacts(tmp_path: Path) -> Path:
    root = Path(os.environ.get("ABSFLOW_TEST_ARTIFACTS") or tmp_path / "artifacts")
    root.mkdir(parents=True, exist_ok=True)
    return root


# On local Spark: the job must still run when the browser first shows a checkpoint, and a
# job on the harness (no Spark start-up) can end before a busy machine's browser polls.
@pytest.mark.integration
@pytest.mark.slow
def test_the_dashboard_in_chromium_shows_graph_checkpoints_and_a_restart(
    server: DashboardServer, tmp_path: Path
) -> None:
    shots = artifacts(tmp_path)
    browser = _browser(tmp_path)
    try:
        n = 40_000
        flow = pipeline(n, rate=5_000, checkpoint_interval=0.3, ui_port=server.port)
        job = Background(lambda: flow.run(faults=[Kill("count[0]", after_checkpoint=2)]))
        job_id = wait_for("the job", lambda: (j := current_job(server)) and j["id"])
        browser.get(f"{server.url}?job={job_id}&poll=300")

        def js(script: str) -> Any:
            return browser.execute_script(script)

        nodes = wait_for(
            "the graph",
            lambda: js("return window.absflow.cy && window.absflow.cy.nodes('.task').length"),
        )
        assert nodes == TASKS
        assert js("return window.absflow.cy.nodes('.chain').length") == len(
            api(server, "plan")["chains"]
        )
        browser.save_screenshot(str(shots / "dashboard-graph.png"))

        row = wait_for(
            "a checkpoint row",
            lambda: js(
                "const r = document.querySelector('#checkpoints tbody tr[data-checkpoint]');"
                "return r && [r.dataset.checkpoint, document.querySelector('#job-state').textContent]"
            ),
        )
        assert row[1].startswith("running"), row  # it appeared while the job ran
        browser.save_screenshot(str(shots / "dashboard-checkpoint.png"))

        restart = wait_for(
            "a restart",
            lambda: js(
                "const r = document.querySelector('#restarts tbody tr.restart-row');"
                "return r && r.textContent"
            ),
            timeout=120,
        )
        assert "TASK_DIED" in restart
        result = job.join()
        assert len(result.restarts) == 1 and result.records_in == n
        wait_for(
            "the finished state",
            lambda: js("return document.querySelector('#job-state').textContent").startswith(
                "finished"
            ),
        )
        assert js("return document.querySelector('#timeline .restart') !== null")
        assert js("return document.querySelectorAll('#tasks tbody tr').length") == TASKS
        browser.save_screenshot(str(shots / "dashboard-restart.png"))
    finally:
        quit_browser(browser, tmp_path / "chromium-profile")
    assert (shots / "dashboard-restart.png").stat().st_size > 10_000


# -- an iteration ------------------------------------------------------------------------------
def test_a_running_iteration_shows_its_supersteps_over_rest_and_metrics(
    server: DashboardServer, tmp_path: Path
) -> None:
    """While a bulk iteration runs (each superstep takes >= 0.3 s), /api/iteration shows
    the superstep moving on and the kill's recovery; at the end the figures are the run's
    own (JobResult.iteration), and /metrics exports absflow_superstep & co."""
    import dataclasses

    from runtime.api.iterations import run_on_streaming
    from runtime.iterations import Recovery
    from tests.iterations.test_supersteps import SlowBulkComponentsStep, bulk_components

    it = bulk_components()
    it.spec = dataclasses.replace(it.spec, step=SlowBulkComponentsStep())
    job = Background(
        lambda: (
            run_on_streaming(
                it,
                Recovery("blocking", interval=2, checkpoint_dir=str(tmp_path)),
                faults=[Kill("bulk_components[1]", after_superstep=4)],
                ui_port=server.port,
            ).job
        )
    )
    wait_for("the job running", lambda: (j := current_job(server)) and j["state"] == "running")

    def iteration() -> Any:
        return api(server, "iteration")["iteration"]

    first = wait_for("superstep 2", lambda: (i := iteration()) and i["superstep"] >= 2 and i)
    assert first["phase"] in ("superstep", "checkpoint") and first["supersteps_done"] >= 1
    recovered = wait_for(
        "the recovery while it runs",
        lambda: (i := iteration()) and i["recoveries"] and i["phase"] != "finished" and i,
        timeout=120,
    )
    assert recovered["recoveries"][0]["failed_during"] == 4
    assert api(server, "job")["restarts"] == 1
    with urllib.request.urlopen(server.url + "metrics", timeout=10) as res:
        families = {f.name: f for f in text_string_to_metric_families(res.read().decode())}
    (live,) = families["absflow_superstep"].samples  # resumed after superstep 2, or later
    assert live.value >= recovered["recoveries"][0]["resumed_from"] == 2

    result = job.join()
    progress = result.iteration
    assert progress is not None and progress.converged
    final = wait_for("the finished state", lambda: (i := iteration())["phase"] == "finished" and i)
    assert final["supersteps_done"] == progress.supersteps
    assert final["supersteps_started"] == progress.supersteps_started
    assert [a["aggregate"] for a in final["aggregates"]] == [a for _, a in progress.aggregates]
    assert [(c["superstep"], c["checkpoint_id"]) for c in final["checkpoints"]] == [
        tuple(c) for c in progress.checkpoints
    ]
    assert final["recoveries"] == [
        {"failed_during": r.failed_during, "resumed_from": r.resumed_from, "rerun": r.rerun}
        for r in progress.recoveries
    ]
    assert final["aggregate"] == 0.0  # converged: no label changed in the last superstep

    # The page (headless Chromium): the Iteration section with the run's figures.
    browser = _browser(tmp_path)
    try:
        browser.get(f"{server.url}?job={api(server, 'job')['id']}&poll=300")
        summary = wait_for(
            "the iteration section",
            lambda: browser.execute_script(
                "const s = document.querySelector('#iteration');"
                "return s && !s.hidden && document.querySelector('#iteration-summary').textContent"
            ),
        )
        assert f"done {progress.supersteps}" in summary and "converged" in summary
        rows = browser.execute_script(
            "return [...document.querySelectorAll('#superstep-recoveries tbody tr')]"
            ".map((r) => [...r.cells].map((c) => c.textContent.trim()))"
        )
        assert rows == [
            [str(r.failed_during), str(r.resumed_from), str(r.rerun)] for r in progress.recoveries
        ]
        browser.save_screenshot(str(artifacts(tmp_path) / "dashboard-iteration.png"))
    finally:
        quit_browser(browser, tmp_path / "chromium-profile")

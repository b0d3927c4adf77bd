"""Faults across real host boundaries: a checkpointed keyed count into a FileSink on a Spark standalone cluster whose master, driver and three workers each run
in their own network namespace (``tests/hosts/conftest.py``). Every faulty run gives
the failure-free run's records, record for record, in the sink's files; a loop
(Collatz) and the count into PostgreSQL (a server on the driver's host) likewise, row
for row. A host lost with too few slots left makes the job wait, say so and resume."""

from __future__ import annotations

import collections
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.conftest import (
    RECORDS,
    DriverService,
    HostCluster,
    HostPostgres,
    Job,
    dashboard_job,
    task_pids,
)
from tests.integration.standalone import wait_for

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

TIMEOUT = 240.0
# The loop and PostgreSQL jobs: failure-free at full speed (a few seconds), with a kill at
# a rate that leaves time for two checkpoints and the kill (~6 s of input).
LOOP: dict[str, Any] = {"pipeline": "loop", "records": 3_000, "rate": 500.0}
PG: dict[str, Any] = {"pipeline": "postgres", "records": 9_000, "rate": 1_500.0}


def expected(records: int) -> list[list[int]]:
    """A running count per key of hosts_job.user_of (i % 53), every step once, sorted."""
    per_key = collections.Counter(i % 53 for i in range(records))
    return sorted([k, c] for k, n in per_key.items() for c in range(1, n + 1))


@pytest.fixture(scope="module")
def clean(
    hosts: HostCluster, driver_service: DriverService, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The failure-free run on the hosts: what every faulty run must give."""
    job = Job(driver_service, tmp_path_factory.mktemp("clean")).start()
    seen: set[str] = set()

    def placed() -> bool:  # where the tasks run, sampled while the job runs
        for name in ("a", "b", "c"):
            if task_pids(hosts.hosts[name].ns, hosts.driver):
                seen.add(name)
        return not job.running()

    wait_for(placed, TIMEOUT, "the failure-free run", poll=0.5)
    result = job.finish()
    result["hosts_with_tasks"] = sorted(seen)
    result["files"] = job.files()
    return result


def started(
    hosts: HostCluster, driver: DriverService, tmp_path: Path, checkpoints: int = 2, **spec: Any
) -> Job:
    """A job started by the module's driver, once it completed ``checkpoints``
    checkpoints and has a task on host b."""
    job = Job(driver, tmp_path, **spec).start()
    b = hosts.hosts["b"].ns
    wait_for(
        lambda: (
            not job.running()
            or (job.newest_checkpoint() >= checkpoints and bool(task_pids(b, hosts.driver)))
        ),
        TIMEOUT,
        f"checkpoint {checkpoints} with a task on host b",
    )
    if not job.running():
        job.finish()  # fails with the job's error, if it raised
        pytest.fail(f"the job ended before the fault\n{job.said()[-4000:]}")
    print(f"tasks before the fault: {placement(hosts)}")
    return job


def placement(hosts: HostCluster) -> dict[str, list[int]]:
    """The task processes on each worker host now."""
    return {n: task_pids(hosts.hosts[n].ns, hosts.driver) for n in ("a", "b", "c")}


def assert_exact(result: dict[str, Any], job: Job, clean: dict[str, Any]) -> None:
    assert result["records_out"] == clean["records_out"]
    assert job.files() == clean["files"], "the sink's files differ from the clean run's"


def test_the_failure_free_run_spans_the_hosts_and_is_exact(clean: dict[str, Any]) -> None:
    assert clean["restarts"] == [] and clean["checkpoints"] >= 2, clean["restarts"]
    assert len(clean["hosts_with_tasks"]) >= 2, clean["hosts_with_tasks"]
    assert clean["files"] == expected(RECORDS) and clean["records_out"] == RECORDS


def test_a_task_sigkilled_on_host_b(
    hosts: HostCluster, driver: DriverService, clean: dict[str, Any], tmp_path: Path
) -> None:
    job = started(hosts, driver, tmp_path)
    victim = task_pids(hosts.hosts["b"].ns, hosts.driver)[0]
    os.kill(victim, signal.SIGKILL)
    result = job.finish()
    assert [r["cause"] for r in result["restarts"]] == ["TASK_DIED"], result["restarts"]
    assert result["restarts"][0]["restored"] >= 2
    assert_exact(result, job, clean)


def test_host_b_partitioned_longer_than_the_heartbeat_timeout(
    hosts: HostCluster, driver: DriverService, clean: dict[str, Any], tmp_path: Path
) -> None:
    job = started(hosts, driver, tmp_path, heartbeat_timeout=3.0)
    hosts.hosts.partition("b", down=True)
    try:
        assert job.running(), f"the job ended before the partition\n{placement(hosts)}"
        # The job manager gives up on b's tasks, the attempt fails, the next one starts.
        wait_for(
            lambda: "stopped heart-beating" in job.said() or not job.running(),
            TIMEOUT,
            "the job manager to declare host b's tasks lost",
        )
    finally:
        hosts.hosts.partition("b", down=False)
    result = job.finish()
    said = job.said()[-3000:]
    assert result["restarts"] and result["restarts"][0]["cause"] == "HEARTBEAT_LOST", said
    assert_exact(result, job, clean)


def test_a_slow_lossy_link_to_host_b(
    hosts: HostCluster, driver: DriverService, clean: dict[str, Any], tmp_path: Path
) -> None:
    qdisc = hosts.hosts.slow_link("b", slow=True)
    try:
        job = started(hosts, driver, tmp_path)  # a task on b, and checkpoints complete
        result = job.finish()
    finally:
        counts = hosts.hosts.slow_link("b", slow=False)
    print(f"host b's link: {qdisc}; {counts}")
    assert result["restarts"] == [] and result["checkpoints"] >= 2, result
    assert_exact(result, job, clean)


def collatz_steps(n: int) -> int:
    k = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        k += 1
    return k


def kill_a_task_on_b(hosts: HostCluster, job: Job) -> dict[str, Any]:
    os.kill(task_pids(hosts.hosts["b"].ns, hosts.driver)[0], signal.SIGKILL)
    result = job.finish()
    assert [r["cause"] for r in result["restarts"]] == ["TASK_DIED"], result["restarts"]
    assert result["restarts"][0]["restored"] >= 2
    return result


@pytest.fixture(scope="module")
def clean_loop(driver_service: DriverService, tmp_path_factory: pytest.TempPathFactory) -> Any:
    job = Job(driver_service, tmp_path_factory.mktemp("clean-loop"), **{**LOOP, "rate": None})
    result = job.start().finish()
    assert result["restarts"] == [], result
    return result, job.files()


def test_a_loop_with_a_task_sigkilled_on_host_b(
    hosts: HostCluster, driver: DriverService, clean_loop: Any, tmp_path: Path
) -> None:
    clean_result, clean_files = clean_loop
    assert clean_files == sorted([n, collatz_steps(n)] for n in range(1, LOOP["records"] + 1))
    job = started(hosts, driver, tmp_path, **LOOP)
    result = kill_a_task_on_b(hosts, job)
    assert result["records_out"] == clean_result["records_out"]
    assert job.files() == clean_files, "the loop's output differs from the clean run's"


def pg_rows(pg: HostPostgres, table: str) -> list[tuple[Any, ...]]:
    return pg.query(f"SELECT k, c FROM {table} ORDER BY k, c")


def pg_job(driver: DriverService, pg: HostPostgres, root: Path, table: str, **spec: Any) -> Job:
    pg.query(f"DROP TABLE IF EXISTS {table}")
    pg.query(f"CREATE TABLE {table} (k int, c int)")
    return Job(driver, root, **{**PG, "dsn": pg.dsn, "table": table, **spec})


@pytest.fixture(scope="module")
def clean_pg(
    driver_service: DriverService,
    host_postgres: HostPostgres,
    tmp_path_factory: pytest.TempPathFactory,
) -> list[tuple[Any, ...]]:
    root = tmp_path_factory.mktemp("clean-pg")
    job = pg_job(driver_service, host_postgres, root, "clean_counts", rate=None)
    assert job.start().finish()["restarts"] == []
    return pg_rows(host_postgres, "clean_counts")


def test_into_postgres_with_a_task_sigkilled_on_host_b(
    hosts: HostCluster,
    driver: DriverService,
    host_postgres: HostPostgres,
    clean_pg: list[tuple[Any, ...]],
    tmp_path: Path,
) -> None:
    assert clean_pg == [tuple(r) for r in expected(PG["records"])]
    pg_job(driver, host_postgres, tmp_path, "killed_counts")  # the table, fresh
    job = started(
        hosts, driver, tmp_path, **{**PG, "dsn": host_postgres.dsn, "table": "killed_counts"}
    )
    kill_a_task_on_b(hosts, job)
    assert pg_rows(host_postgres, "killed_counts") == clean_pg, "rows differ from the clean run's"
    assert host_postgres.query("SELECT gid FROM pg_prepared_xacts") == []


def test_host_b_lost_without_enough_slots_waits_and_resumes(
    hosts: HostCluster, driver: DriverService, tmp_path: Path
) -> None:
    """Six tasks on six slots; host b goes with two: the restart waits for slots (the log
    and the dashboard say so) until a worker on b returns, then the output is exact."""
    records = 12_000
    job = started(hosts, driver, tmp_path, parallelism=3, records=records, executor_wait=240.0)
    hosts.hosts.kill_host("b")
    wait_for(
        lambda: "task slots registered" in job.said() or not job.running(),
        TIMEOUT,
        "the job to say it waits for task slots",
    )
    assert job.running(), job.said()[-3000:]
    said = job.said()
    assert "of 6 task slots registered" in said, said[-3000:]
    board = dashboard_job(hosts)
    assert board is not None and board["state"] == "restarting", board
    assert "of 6 task slots registered" in board["message"], board
    hosts.cluster.start_worker("b")  # the host is back
    result = job.finish()
    assert result["restarts"] and result["restarts"][0]["restored"] >= 2, result
    assert job.files() == expected(records) and result["records_out"] == records


# Last: host b stays lost (a new worker there would take a while to register its
# executor with the driver, and a job started before that runs on a and c only).
def test_host_b_lost_with_enough_slots_elsewhere(
    hosts: HostCluster, driver: DriverService, clean: dict[str, Any], tmp_path: Path
) -> None:
    job = started(hosts, driver, tmp_path)
    killed = hosts.hosts.kill_host("b")  # the worker, its executor, every task there
    assert len(killed) >= 3, killed
    result = job.finish()  # 4 slots left on a and c: the job needs 4
    assert len(result["restarts"]) >= 1 and result["restarts"][0]["restored"] >= 2, result
    assert_exact(result, job, clean)

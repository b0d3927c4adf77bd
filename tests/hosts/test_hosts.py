"""Faults across real host boundaries: a checkpointed keyed count into a FileSink on a Spark standalone cluster whose master, driver and three workers each run
in their own network namespace (``tests/hosts/conftest.py``). Every faulty run gives
the failure-free run's records, record for record, in the sink's files."""

from __future__ import annotations

import collections
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.conftest import Driver, HostCluster, task_pids
from tests.integration.standalone import wait_for

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

TIMEOUT = 240.0


def expected(records: int) -> list[list[int]]:
    """A running count per key of hosts_job.user_of (i % 53), every step once, sorted."""
    per_key = collections.Counter(i % 53 for i in range(records))
    return sorted([k, c] for k, n in per_key.items() for c in range(1, n + 1))


@pytest.fixture(scope="module")
def clean(hosts: HostCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The failure-free run on the hosts: what every faulty run must give."""
    root = tmp_path_factory.mktemp("clean")
    driver = Driver(hosts, root).start()
    try:
        seen: set[str] = set()

        def placed() -> bool:  # where the tasks run, sampled while the job runs
            for name in ("a", "b", "c"):
                if task_pids(hosts.hosts[name].ns, hosts.driver):
                    seen.add(name)
            return not driver.running()

        wait_for(placed, TIMEOUT, "the failure-free run", poll=0.5)
        result = driver.finish()
    finally:
        driver.kill()
    result["hosts_with_tasks"] = sorted(seen)
    result["files"] = driver.files()
    return result


def started(hosts: HostCluster, tmp_path: Path, checkpoints: int = 2, **spec: Any) -> Driver:
    """A job started on the driver's host, once it completed ``checkpoints`` checkpoints
    and has a task on host b."""
    driver = Driver(hosts, tmp_path, **spec).start()
    b = hosts.hosts["b"].ns
    wait_for(
        lambda: not driver.running()
        or (driver.newest_checkpoint() >= checkpoints and bool(task_pids(b, hosts.driver))),
        TIMEOUT,
        f"checkpoint {checkpoints} with a task on host b",
    )
    assert driver.running(), f"the job ended before the fault\n{driver.said()[-4000:]}"
    return driver


def assert_exact(result: dict[str, Any], driver: Driver, clean: dict[str, Any]) -> None:
    assert result["records_out"] == clean["records_out"]
    assert driver.files() == clean["files"], "the sink's files differ from the clean run's"


def test_the_failure_free_run_spans_the_hosts_and_is_exact(clean: dict[str, Any]) -> None:
    assert clean["restarts"] == [] and clean["checkpoints"] >= 2, clean["restarts"]
    assert len(clean["hosts_with_tasks"]) >= 2, clean["hosts_with_tasks"]
    assert clean["files"] == expected(30_000) and clean["records_out"] == 30_000

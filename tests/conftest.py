"""Shared fixtures: one SparkSession per test session, a leak check per test, and a
Spark standalone cluster on 127.0.0.1 for the tests that need a real one."""

from __future__ import annotations

import glob
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.standalone import StandaloneCluster

SLOTS_NEEDED = 18  # the biggest test job (diamond) has 16 tasks, +2 spare slots for restarts


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The embedded local SparkSession absflow creates, sized for every test job."""
    from jobmanager import launcher
    from runtime.config import JobConfig

    session = launcher.ensure_session(SLOTS_NEEDED - launcher.SPARE_SLOTS, JobConfig())
    yield session
    launcher._stop_owned()


def _listening_ports() -> set[int]:
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh)
                for line in fh:
                    parts = line.split()
                    if parts[3] == "0A":  # LISTEN
                        ports.add(int(parts[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return ports


def _absflow_tmp() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "absflow-*")))


@pytest.fixture
def no_leaks(spark: Any) -> Iterator[None]:
    """After the test: no port our tasks or job manager bound is still listening, and
    no absflow temp dir is left (Spark's own pooled workers hold no absflow socket)."""
    ports, dirs = _listening_ports(), _absflow_tmp()
    yield
    deadline = time.monotonic() + 5.0
    while True:
        extra_ports, extra_dirs = _listening_ports() - ports, _absflow_tmp() - dirs
        if not (extra_ports or extra_dirs) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not extra_ports, f"ports still listening after the job: {sorted(extra_ports)}"
    assert not extra_dirs, f"temp dirs left behind: {sorted(extra_dirs)}"


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and two workers of 2 slots each (Spark cores are slots, not CPUs), started
    on first use; at the end every process it started is gone, or the teardown fails."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"), workers=2, cores=2)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        assert not cluster.leftovers(), (
            f"processes left by the standalone cluster: {cluster.leftovers()}"
        )

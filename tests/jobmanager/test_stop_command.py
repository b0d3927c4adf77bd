"""``python -m jobmanager stop JOB`` (jobmanager/stop_command.py): finding the driver,
asking it to stop, waiting for it, and what it prints and exits with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from jobmanager import stop_command
from jobmanager.cli import main
from jobmanager.stop import JobEntry, RunningJob
from tests.jobmanager.test_coordinator import Harness

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


DRIVER = textwrap.dedent(
    """
    import sys, time
    from jobmanager.stop import JobEntry, StopRequest
    with JobEntry("etl", None) as entry:
        stop = StopRequest(entry.stop_file)
        print("registered", flush=True)
        deadline = time.monotonic() + 60
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.01)
    """
)


def test_the_stop_command_reaches_a_driver(
    tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ABSFLOW_JOBS_DIR", str(tmp_path / "jobs"))
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "registered"
        assert main(["stop", "nope"]) == 2
        err = capsys.readouterr().err
        assert "no job named 'nope'" in err and f"etl (pid {proc.pid})" in err
        assert main(["stop", "etl", "--timeout", "60"]) == 0
        out = capsys.readouterr().out
        assert "asked job 'etl'" in out and "no savepoint was kept" in out
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (tmp_path / "jobs").exists()


def test_the_stop_command_prints_the_savepoint(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.coord.stop_with_savepoint()
    h.ack(1)
    job = RunningJob("job", 1, 0.0, h.storage.root, "x.json")
    assert stop_command._outcome(job, 0.0) == (
        f"job 'job' stopped with savepoint {h.storage.location(1)}"
    )
    later = time.time() + 100  # a savepoint older than the request is not this stop's
    assert "without a savepoint" in stop_command._outcome(job, later)


def register(jobs: Path, job: str, pid: int) -> None:
    """A registry entry of a driver of ``job`` with ``pid`` (alive: this process or its parent)."""
    jobs.mkdir(exist_ok=True)
    entry = {"job": job, "pid": pid, "started": 0, "checkpoint_dir": None}
    (jobs / f"{job}.{pid}.json").write_text(json.dumps(entry))


def test_two_drivers_of_one_job_need_a_pid(
    tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = tmp_path / "jobs"
    monkeypatch.setenv("ABSFLOW_JOBS_DIR", str(jobs))
    for pid in (os.getpid(), os.getppid()):
        register(jobs, "etl", pid)
    assert main(["stop", "etl", "--no-wait"]) == 2
    assert "2 drivers run job 'etl'" in capsys.readouterr().err
    assert main(["stop", "etl", "--pid", str(os.getppid()), "--no-wait"]) == 0
    assert f"driver pid {os.getppid()}" in capsys.readouterr().out


def test_a_driver_that_does_not_exit_in_time_is_exit_code_1(
    tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ABSFLOW_JOBS_DIR", str(tmp_path / "jobs"))
    with JobEntry("etl", None) as entry:  # this process: alive for the whole wait
        assert main(["stop", "etl", "--timeout", "0.1"]) == 1
        assert Path(entry.stop_file).exists()  # asked all the same
    err = capsys.readouterr().err
    assert f"the driver (pid {os.getpid()}) did not exit within 0.1 s" in err


def test_a_job_without_a_checkpoint_dir_stops_without_a_savepoint() -> None:
    job = RunningJob("job", 1, 0.0, None, "x.json")
    assert stop_command._outcome(job, 0.0) == (
        "job 'job' stopped (it had no checkpoint_dir, so no savepoint was kept)"
    )

"""Stop with a savepoint, end to end: a driver running an unbounded job gets SIGTERM,
leaves a savepoint and exits 0; the job, changed (a step inserted, the keyed step at
another parallelism), resumes from it, and the two runs together give exactly the output
of one uninterrupted run."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobmanager.cli import main as cli
from statebackend.storage import CheckpointStorage
from tests.integration import savepoint_job

# On the test harness (ABSFLOW_LAUNCHER=local, inherited by the drivers started here):
# stopping with a savepoint is the job manager's, whatever launches the tasks.
pytestmark = [pytest.mark.harness]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 200_000  # the bounded resumed run ends here; the first run is stopped long before


def start_driver(chk: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            os.path.join(ROOT, "tests", "integration", "savepoint_job.py"),
            str(chk),
            str(out),
        ],
        env={**os.environ, "PYTHONPATH": ROOT},
        cwd=str(chk.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_checkpoint(chk: Path, proc: subprocess.Popen[str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not list(chk.glob("chk-*/_metadata")):
        assert proc.poll() is None, "the driver ended before its first checkpoint"
        assert time.monotonic() < deadline, f"no checkpoint completed within {timeout:.0f} s"
        time.sleep(0.05)


def test_sigterm_savepoint_then_resume_changed_and_rescaled_equals_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chk, out = tmp_path / "chk", tmp_path / "first.json"
    proc = start_driver(chk, out)
    try:
        wait_for_checkpoint(chk, proc)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
        stop_seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    first = json.loads(out.read_text())
    savepoint = first["savepoint"]
    assert first["stopped"] and savepoint and "stopped with savepoint" in stdout
    print(f"SIGTERM -> exit with a savepoint: {stop_seconds:.2f} s")
    storage = CheckpointStorage(str(chk))
    n = int(savepoint.rsplit("chk-", 1)[1])
    assert storage.check(n).savepoint and storage.check(n).final
    assert storage.savepoints() == [n]
    assert cli(["checkpoints", str(chk)]) == 0
    listing = capsys.readouterr().out
    row = next(line.split() for line in listing.splitlines() if line.split()[:1] == [str(n)])
    assert row[1:4] == ["completed", "yes", "yes"], listing
    emitted = len(first["output"])
    assert 0 < emitted < N, "the stop must land in the middle of the input"

    # Version 2: a step inserted before the keyed one, which runs at parallelism 3.
    resumed = savepoint_job.build(N, 3, inserted=True, checkpoint_dir=str(tmp_path / "chk2"))
    second = resumed.run(restore_from=savepoint, progress=False)
    reference = savepoint_job.build(N, checkpoint_dir=str(tmp_path / "chk3")).run(progress=False)
    both = [tuple(r) for r in first["output"]] + list(second.output("out"))
    assert len(both) == N
    assert collections.Counter(both) == collections.Counter(reference.output("out"))
    last = {k: c for k, c in sorted(both, key=lambda r: r[1])}
    assert last == {f"user{k}": len(range(k, N, savepoint_job.KEYS)) for k in range(37)}


def test_restoring_the_savepoint_into_another_job_is_refused(tmp_path: Path) -> None:
    """A savepoint of job 'clicks' restored into a job named otherwise, before any task."""
    from runtime import Dataflow, IncompatibleCheckpointError

    chk = str(tmp_path / "chk")
    flow = savepoint_job.build(2_000, checkpoint_dir=chk)
    flow.run(progress=False)
    other = Dataflow("billing", parallelism=2, checkpoint_interval=0.2)
    other.graph = flow.graph  # the same steps: only the job differs
    with pytest.raises(IncompatibleCheckpointError) as info:
        other.run(restore_from=chk, progress=False)
    message = str(info.value)
    assert "of job 'clicks' into job 'billing'" in message
    assert "Dataflow('clicks', ...)" in message


def test_the_stop_command_stops_a_running_driver_with_a_savepoint(tmp_path: Path) -> None:
    chk, out = tmp_path / "chk", tmp_path / "first.json"
    proc = start_driver(chk, out)
    try:
        wait_for_checkpoint(chk, proc)
        stop = subprocess.run(
            [sys.executable, "-m", "jobmanager", "stop", "clicks", "--timeout", "120"],
            env={**os.environ, "PYTHONPATH": ROOT},
            capture_output=True,
            text=True,
            timeout=180,
        )
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert proc.returncode == 0
    savepoint = json.loads(out.read_text())["savepoint"]
    assert f"job 'clicks' stopped with savepoint {savepoint}" in stop.stdout, stop.stdout
    assert CheckpointStorage(str(chk)).savepoints() == [int(savepoint.rsplit("chk-", 1)[1])]

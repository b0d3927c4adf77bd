"""A job with a loop stops with a savepoint (cyclic ABS: the final checkpoint holds the
records in flight on the back-edge, logged by the loop head) and the resumed job replays
them: Collatz stopped mid-run through the registry `python -m jobmanager stop` uses, then
resumed, gives exactly the output of one uninterrupted run."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobmanager.stop import request_stop, running_jobs
from runtime.api.testing import run_local
from statebackend.storage import CheckpointStorage
from tests.integration.loops import collatz, collatz_expected

pytestmark = [pytest.mark.harness, pytest.mark.slow]

N = 3_000


def wait_for(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def logged_back_edge_records(chk: Path, savepoint: str) -> int:
    """How many in-flight records the savepoint's loop heads logged on their back-edges."""
    storage, n = CheckpointStorage(str(chk)), int(savepoint.rsplit("chk-", 1)[1])
    meta = storage.check(n)
    assert meta.savepoint and meta.final
    return sum(m.backedge_records for m in meta.task_metrics.values())


def stop_mid_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Collatz (its input rate-limited to 6 s), stopped with a savepoint while records
    circulate."""
    monkeypatch.setenv("ABSFLOW_JOBS_DIR", str(tmp_path / "jobs"))
    chk = tmp_path / "chk"
    result: dict[str, Any] = {}

    def run() -> None:
        flow = collatz(N, rate=500, checkpoint_interval=0.2, checkpoint_dir=str(chk), ui=False)
        try:
            result["run"] = flow.run(launcher="local", progress=False)
        except BaseException as err:
            result["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    storage = CheckpointStorage(str(chk))
    try:
        wait_for(
            lambda: "error" in result or len(storage.completed_checkpoints()) >= 2, "checkpoints"
        )
        wait_for(lambda: [j for j in running_jobs() if j.job == "collatz"], "the registry entry")
        (job,) = [j for j in running_jobs() if j.job == "collatz"]
        request_stop(job)
    finally:
        thread.join(timeout=120)
    assert "error" not in result, result.get("error")
    first = result["run"]
    assert first.stopped and first.savepoint
    assert logged_back_edge_records(chk, first.savepoint) > 0  # records were in the loop
    assert 0 < len(first.output("steps")) < N
    return first


def resume(tmp_path: Path, first: Any, **config: Any) -> collections.Counter[Any]:
    chk = str(tmp_path / "chk2")
    resumed = collatz(N, checkpoint_interval=0.2, checkpoint_dir=chk, ui=False, **config)
    second = run_local(resumed, restore_from=first.savepoint, progress=False)
    return collections.Counter(map(tuple, first.output("steps") + second.output("steps")))


def test_a_loop_stops_with_a_savepoint_and_resumes_to_one_runs_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = stop_mid_run(tmp_path, monkeypatch)
    assert resume(tmp_path, first) == collatz_expected(N)


@pytest.mark.parametrize("parallelism", [1, 3])
def test_a_loop_savepoint_resumes_at_another_parallelism(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallelism: int
) -> None:
    """The back-edge is keyed: the logged records are routed again by their key to the
    new loop heads (each old log read by every new head, each record kept by one), so the
    rescaled run still gives exactly one run's output."""
    first = stop_mid_run(tmp_path, monkeypatch)
    assert resume(tmp_path, first, parallelism=parallelism) == collatz_expected(N)


def test_companion_resuming_without_the_back_edge_log_loses_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = stop_mid_run(tmp_path, monkeypatch)
    got = resume(tmp_path, first, debug_drop_in_flight_log=True)
    assert got != collatz_expected(N) and not got - collatz_expected(N)  # only missing

"""Stop with a savepoint, piece by piece and without Spark: the coordinator's final
checkpoint kept as a savepoint, retention that never deletes one, an attempt that turns a
stop request into the final barrier, the request's sources (a signal, the stop file the
CLI writes, the registry of running drivers); ``python -m jobmanager stop``: test_stop_command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobmanager.cli import main
from jobmanager.stop import (
    POLL_SECONDS,
    JobEntry,
    StopRequest,
    request_stop,
    running_jobs,
    stop_signals,
)
from runtime import control as P
from runtime.control import CheckpointFailureReason
from statebackend.incremental import StateRef
from statebackend.metadata import TaskStateHandle
from statebackend.metrics import AckMetrics
from tests.jobmanager.fakes import Clock
from tests.jobmanager.test_attempt import ack, finished, harness, registers
from tests.jobmanager.test_coordinator import ALL, Harness, triggers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- the coordinator --------------------------------------------------------------------------
def test_a_stop_triggers_the_final_checkpoint_kept_as_a_savepoint(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    n = h.coord.stop_with_savepoint()
    assert n == 1 and triggers(h.sent.new()) == [(0, 1, True), (1, 1, True)]
    assert h.coord.stop_with_savepoint() is None  # asked twice: one final checkpoint
    done = h.ack(1)
    assert done is not None and done.final and done.savepoint
    assert h.storage.read_metadata(1).savepoint and h.coord.final_completed


def test_a_stop_after_the_input_ended_makes_the_pending_final_checkpoint_the_savepoint(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    h.coord.on_sources_ended()
    assert h.coord.stop_with_savepoint() is None
    assert len(triggers(h.sent.new())) == 2  # no second final trigger
    done = h.ack(1)
    assert done is not None and done.savepoint and h.storage.read_metadata(1).savepoint


def test_only_a_savepoint_is_triggered_whole(tmp_path: Path) -> None:
    """The final checkpoint at the end of the input is a checkpoint like any other (its
    keyed state incremental); a stop's is triggered as a savepoint (whole)."""
    ended, stopped = Harness(tmp_path / "a"), Harness(tmp_path / "b")
    ended.coord.on_sources_ended()
    stopped.coord.stop_with_savepoint()
    for h, whole in ((ended, False), (stopped, True)):
        sent = [m for _, m in h.sent.new() if isinstance(m, P.Trigger)]
        assert sent and all(m.final and m.savepoint is whole for m in sent)


def test_a_late_stop_keeps_an_incremental_final_checkpoint_as_a_checkpoint(
    tmp_path: Path,
) -> None:
    """A stop after the input ended makes the final checkpoint a savepoint only if it is
    self-contained: one whose state refers to chain files of earlier checkpoints stays a
    checkpoint (a savepoint must survive the deletion of the checkpoints behind it)."""
    h = Harness(tmp_path)
    h.coord.on_sources_ended()
    assert h.coord.stop_with_savepoint() is None
    chain = (StateRef("shared/t0/1.chk", 10, 1, True, (0, 4), (0, 4)),)
    done = None
    for index in ALL:
        state = TaskStateHandle(f"t{index}.state", 10, 1, chains={"count": chain})
        done = h.coord.on_ack(P.Ack(index, 0, 1, state, AckMetrics())) or done
    assert done is not None and done.final and not done.savepoint
    assert not h.storage.read_metadata(1).savepoint


def test_a_stop_while_a_synchronous_checkpoint_drains_subsumes_it(tmp_path: Path) -> None:
    h = Harness(tmp_path, snapshot_mode="synchronous")
    h.tick(10.0)  # checkpoint 1: sources halted, draining
    assert h.coord.stop_with_savepoint() == 2
    assert h.coord.failed[-1].reason is CheckpointFailureReason.SUBSUMED
    assert triggers(h.sent.new()) == [(0, 2, True), (1, 2, True)]  # aligned, as always
    done = h.ack(2)
    assert done is not None and done.savepoint


def test_retention_keeps_savepoints(tmp_path: Path) -> None:
    """A job resumed from a savepoint checkpoints into the same root: retention
    (retained_checkpoints=1) deletes its older checkpoints but never the savepoint."""
    first = Harness(tmp_path, retained_checkpoints=1)
    first.coord.stop_with_savepoint()
    first.ack(1)
    resumed = Harness(tmp_path, retained_checkpoints=1)
    resumed.coord.next_id = 2
    for n in (2, 3, 4):
        resumed.coord.trigger(final=False)
        resumed.ack(n)
    assert resumed.storage.completed_checkpoints() == [1, 4]
    assert resumed.storage.savepoints() == [1]


def test_without_the_savepoint_flag_retention_deletes_the_final_checkpoint(tmp_path: Path) -> None:
    """Companion: the same runs with a plain final checkpoint lose it."""
    first = Harness(tmp_path, retained_checkpoints=1)
    first.coord.on_sources_ended()
    first.ack(1)
    resumed = Harness(tmp_path, retained_checkpoints=1)
    resumed.coord.next_id = 2
    for n in (2, 3):
        resumed.coord.trigger(final=False)
        resumed.ack(n)
    assert resumed.storage.completed_checkpoints() == [3]


# -- the attempt ------------------------------------------------------------------------------
def test_an_attempt_stops_once_every_task_registered_and_finishes() -> None:
    h = harness()
    stop = StopRequest()
    stop.request("SIGTERM")  # before the tasks registered: waits for them
    h.attempt.run_services.stop = stop
    h.link.then(*registers()[:3])
    h.link.then_do(lambda: None)
    h.link.then(registers()[3])
    h.link.then(ack(0, 1, 5, 5), ack(1, 1, 5, 5), ack(2, 1, 6, 6), ack(3, 1, 4, 4))
    h.link.then(finished(0, 5, 5), finished(1, 5, 5), finished(2, 6, 6), finished(3, 4, 4))
    assert h.attempt.run(h.stage) is None
    sent = [m for _i, m in h.link.sent_of(P.Trigger) if isinstance(m, P.Trigger)]
    assert [(m.checkpoint_id, m.final) for m in sent] == [(1, True), (1, True)]
    assert h.attempt.stopping_with == 1 and not h.stage.cancelled
    assert h.attempt.coordinator.completed[-1].savepoint
    assert len(h.link.sent_of(P.Complete)) == 4


def test_an_attempt_without_a_request_never_stops() -> None:
    h = harness()
    h.link.then(*registers())
    for _ in range(50):
        h.link.then_do(lambda: None)
    h.link.then(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        h.attempt.run(h.stage)
    assert not h.link.sent_of(P.Trigger) and h.attempt.stopping_with is None


# -- where requests come from -----------------------------------------------------------------
def test_signals_request_a_stop_and_a_second_one_aborts() -> None:
    stop = StopRequest()
    before = signal.getsignal(signal.SIGTERM)
    with stop_signals(stop, "job"):
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not stop.requested:  # the handler runs between bytecodes of this thread
            assert time.monotonic() < deadline
        assert stop.reason == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            while True:  # pragma: no branch - left by the KeyboardInterrupt
                time.sleep(0.01)
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_registry_and_the_stop_file(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    with JobEntry("click stream", "/chk", directory=str(jobs)) as entry:
        clock = Clock()
        stop = StopRequest(entry.stop_file, clock=clock)
        (found,) = running_jobs(str(jobs))
        assert (found.job, found.pid, found.checkpoint_dir) == ("click stream", os.getpid(), "/chk")
        assert not stop.requested
        request_stop(found)
        assert not stop.requested  # looked for at most every POLL_SECONDS
        clock.advance(POLL_SECONDS)
        assert stop.requested and "jobmanager stop" in str(stop.reason)
        assert not stop.drain
    assert not jobs.exists()  # entry, stop file and the emptied directory removed


def test_a_drain_request_reaches_the_sources_trigger(tmp_path: Path, monkeypatch: Any) -> None:
    """`stop --drain` (a stop file that says so) -> StopRequest.drain -> the final
    Trigger carries drain; a plain stop's does not."""
    jobs = tmp_path / "jobs"
    monkeypatch.setenv("ABSFLOW_JOBS_DIR", str(jobs))
    with JobEntry("etl", None) as entry:
        stop = StopRequest(entry.stop_file, clock=Clock())
        assert main(["stop", "etl", "--drain", "--no-wait"]) == 0
        assert stop.requested and stop.drain
    for drain in (False, True):
        h = Harness(tmp_path / f"h{drain}")
        h.coord.stop_with_savepoint(drain)
        sent = [m for _, m in h.sent.log if isinstance(m, P.Trigger)]
        assert sent and all(t.final and t.drain is drain for t in sent)


def test_entries_of_dead_drivers_are_dropped(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = int(proc.stdout)
    (tmp_path / f"old.{dead}.json").write_text(
        f'{{"job": "old", "pid": {dead}, "started": 0, "checkpoint_dir": null}}'
    )
    assert running_jobs(str(tmp_path)) == [] and os.listdir(tmp_path) == []

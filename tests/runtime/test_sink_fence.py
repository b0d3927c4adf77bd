"""Sinks are fenced by attempt: once an attempt restored a sink subtask, a task of an
earlier attempt that lives on (behind a network partition) can seal and commit nothing.
The companions switch the fence off and show the stale task's records in the output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.sinks import FileSink, SinkContext, SinkSnapshot
from runtime.transactions import Epoch, StaleAttemptError


def opened(directory: Path, attempt: int, run: str = "r1") -> FileSink:
    sink = FileSink(str(directory))
    sink.open(SinkContext("out", 0, 1, attempt, lambda n, r: None, job="j", run=run))
    sink.restore_state(None)  # a fresh start: nothing to restore, but the subtask is claimed
    return sink


def lines(directory: Path) -> list[int]:
    return [json.loads(x) for x in (directory / "part-0").read_text().splitlines()]


def stale_and_new(directory: Path) -> tuple[FileSink, FileSink]:
    """Attempt 0 wrote records 1..3 and then lost its host's link; attempt 1 restored the
    subtask (from scratch), replayed 1..3 and committed them with checkpoint 4."""
    stale = opened(directory, attempt=0)
    stale.write_batch([1, 2, 3])
    new = opened(directory, attempt=1)
    new.write_batch([1, 2, 3])
    new.snapshot_state(4)
    new.notify_checkpoint_complete(4)
    return stale, new


def test_a_stale_attempt_can_neither_seal_nor_commit(tmp_path: Path) -> None:
    stale, new = stale_and_new(tmp_path)
    with pytest.raises(StaleAttemptError, match=r"attempt 0 will not seal checkpoint 3"):
        stale.snapshot_state(3)  # the barrier it was handling when the link went down
    assert lines(tmp_path) == [1, 2, 3]
    new.write_batch([4])
    new.snapshot_state(5)
    new.notify_checkpoint_complete(5)
    assert lines(tmp_path) == [1, 2, 3, 4]
    assert new.owner() == Epoch("r1", 1)


def test_a_transaction_sealed_before_the_takeover_is_not_committed(tmp_path: Path) -> None:
    stale = opened(tmp_path, attempt=0)
    stale.write_batch([1, 2, 3])
    stale.snapshot_state(3)  # sealed, then the link went down before its ack arrived
    new = opened(tmp_path, attempt=1)  # restores from scratch: 1..3 are replayed
    with pytest.raises(StaleAttemptError, match=r"will not commit checkpoint 3"):
        stale.notify_checkpoint_complete(3)  # a late completion notice
    new.write_batch([1, 2, 3])
    new.snapshot_state(4)
    new.notify_checkpoint_complete(4)
    assert lines(tmp_path) == [1, 2, 3]


def test_the_next_run_of_the_job_takes_over_from_the_last_one(tmp_path: Path) -> None:
    last = opened(tmp_path, attempt=3, run="r1")
    last.write_batch([1])
    last.snapshot_state(1)
    last.notify_checkpoint_complete(1)
    state = last.snapshot_state(2)
    nxt = FileSink(str(tmp_path))  # run r2 restores r1's savepoint: its attempt 0 owns now
    nxt.open(SinkContext("out", 0, 1, 0, lambda n, r: None, job="j", run="r2"))
    nxt.restore_state(state)
    nxt.write_batch([2])
    nxt.snapshot_state(3)
    nxt.notify_checkpoint_complete(3)
    assert lines(tmp_path) == [1, 2] and nxt.owner() == Epoch("r2", 0)
    with pytest.raises(StaleAttemptError):
        last.notify_checkpoint_complete(2)


def race(directory: Path, monkeypatch: pytest.MonkeyPatch) -> list[Exception]:
    """Attempt 0 sealed records 1..3 at checkpoint 3, then lost its host's link; its late
    completion notice lands while attempt 1 restores the subtask (after the claim, before
    the recovery); attempt 1 replays 1..3 and commits them. What attempt 0 raised."""
    stale = opened(directory, attempt=0)
    stale.write_batch([1, 2, 3])
    stale.snapshot_state(3)
    raised: list[Exception] = []
    recover = FileSink.recover

    def racing(self: FileSink, snapshot: SinkSnapshot) -> None:
        try:
            stale.notify_checkpoint_complete(3)
        except StaleAttemptError as err:
            raised.append(err)
        recover(self, snapshot)

    monkeypatch.setattr(FileSink, "recover", racing)
    new = opened(directory, attempt=1)
    monkeypatch.setattr(FileSink, "recover", recover)
    new.write_batch([1, 2, 3])
    new.snapshot_state(4)
    new.notify_checkpoint_complete(4)
    return raised


def test_a_commit_racing_the_takeover_is_fenced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raised = race(tmp_path, monkeypatch)
    assert [type(e) for e in raised] == [StaleAttemptError]
    assert lines(tmp_path) == [1, 2, 3]


def test_companion_without_the_fence_the_racing_commit_duplicates_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FileSink, "owner", lambda self: None)  # the fence off
    assert race(tmp_path, monkeypatch) == []
    assert lines(tmp_path) == [1, 2, 3, 1, 2, 3]  # what the fence prevents


def test_epochs_round_trip() -> None:
    assert Epoch.parse(str(Epoch("a/b", 7))) == Epoch("a/b", 7)
    assert Epoch.parse(None) is None and Epoch.parse("x") is None and Epoch.parse("r/x") is None

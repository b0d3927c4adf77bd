"""CheckpointCoordinator driven by scripted events: a fake clock, a recording send,
real checkpoint storage."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from jobmanager.coordinator import (
    CheckpointCoordinator,
    CompletedCheckpoint,
)
from runtime import control as P
from runtime.api.dataflow import Dataflow
from runtime.config import JobConfig
from runtime.control import CheckpointFailureReason
from runtime.control import CheckpointFailureReason as R
from runtime.plan import JobPlan
from runtime.sources import GeneratorSource
from statebackend.errors import StorageAccessError
from statebackend.metadata import CheckpointMetadata, OperatorLayout, StepState, TaskStateHandle
from statebackend.metrics import AckMetrics
from statebackend.storage import CheckpointStorage

SOURCES = [0, 1]
ALL = [0, 1, 2, 3]
SINK_TASKS = [2, 3]  # count[i] chains the collect sink: told of completed checkpoints


def ident(x: Any) -> Any:
    return x


def last(a: Any, b: Any) -> Any:
    return b


def small_plan() -> JobPlan:
    """src[0], src[1] --hash--> count[0], count[1] (task indexes 0..3)."""
    flow = Dataflow("job", parallelism=2)
    flow.source(GeneratorSource(ident, 10), name="src").key_by(ident).reduce(
        last, name="count"
    ).collect("out")
    plan = flow.plan()
    assert [t.task_id for t in plan.tasks] == ["src[0]", "src[1]", "count[0]", "count[1]"]
    return plan


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Sent:
    """Records (task_index, message) and hands out the messages since the last look."""

    def __init__(self) -> None:
        self.log: list[tuple[int, P.Message]] = []
        self.seen = 0

    def __call__(self, index: int, message: P.Message) -> None:
        self.log.append((index, message))

    def new(self) -> list[tuple[int, P.Message]]:
        out = self.log[self.seen :]
        self.seen = len(self.log)
        return out


class Harness:
    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        settings.setdefault("checkpoint_interval", 10.0)
        settings.setdefault("checkpoint_timeout", 60.0)
        self.config = JobConfig(**settings)
        self.clock = Clock()
        self.sent = Sent()
        self.storage = CheckpointStorage(str(tmp_path / "chk"))
        self.completed: list[CompletedCheckpoint] = []
        self.coord = CheckpointCoordinator(
            small_plan(),
            self.config,
            self.storage,
            self.sent,
            first_id=1,
            attempt=0,
            on_complete=self.completed.append,
            clock=self.clock,
        )

    def tick(self, advance: float = 0.0) -> list[tuple[int, P.Message]]:
        self.clock.advance(advance)
        self.coord.on_tick()
        return self.sent.new()

    def ack(self, n: int, *tasks: int, state: bool = True) -> CompletedCheckpoint | None:
        done = None
        for index in tasks or ALL:
            info = TaskStateHandle(f"t{index}.state", 10, 1) if state else None
            metrics = AckMetrics(
                alignment_ms=float(index),
                sync_ms=1.0,
                async_ms=2.0,
                state_bytes=100,
                spilled_bytes=0,
                keys=index,
                start_delay_ms=0.5,
            )
            done = self.coord.on_ack(P.Ack(index, 0, n, info, metrics)) or done
        return done


def triggers(sent: list[tuple[int, P.Message]]) -> list[tuple[int, int, bool]]:
    return [(i, m.checkpoint_id, m.final) for i, m in sent if isinstance(m, P.Trigger)]


def of_type(sent: list[tuple[int, P.Message]], cls: type) -> list[tuple[int, Any]]:
    return [(i, m) for i, m in sent if isinstance(m, cls)]


def test_triggers_only_sources_after_the_interval(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    assert h.tick(9.9) == []
    sent = h.tick(0.2)
    assert triggers(sent) == [(0, 1, False), (1, 1, False)]
    assert sent == [(i, m) for i, m in sent if i in SOURCES]
    assert set(h.coord.pending) == {1}


def test_no_trigger_without_interval(tmp_path: Path) -> None:
    h = Harness(tmp_path, checkpoint_interval=None)
    assert h.tick(1e6) == []


def test_no_trigger_while_max_concurrent_pending(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_concurrent_checkpoints=1)
    assert len(triggers(h.tick(10))) == 2
    assert h.tick(10) == []
    assert h.tick(30) == []
    h.ack(1)
    h.sent.new()
    assert triggers(h.tick(10)) == [(0, 2, False), (1, 2, False)]


def test_two_concurrent_checkpoints(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_concurrent_checkpoints=2)
    assert len(triggers(h.tick(10))) == 2
    assert h.tick(5) == []  # the interval counts from the last trigger
    assert [n for _, n, _ in triggers(h.tick(5))] == [2, 2]
    assert h.tick(20) == []
    assert set(h.coord.pending) == {1, 2}


def test_min_pause_is_measured_from_the_last_completion(tmp_path: Path) -> None:
    h = Harness(tmp_path, checkpoint_interval=2.0, min_pause_between_checkpoints=8.0)
    assert h.tick(2) == []  # the pause also counts from the start of the job
    assert len(triggers(h.tick(6))) == 2
    h.clock.advance(7)  # checkpoint 1 takes 7 s
    h.ack(1)
    h.sent.new()
    assert h.tick(3) == []  # the interval has passed since trigger and completion, but
    assert h.tick(4.9) == []  # ... 7.9 s after completion: the pause is not over
    assert len(triggers(h.tick(0.2))) == 2  # 8.1 s after completion


def test_completes_when_all_tasks_acked(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.tick(10)
    assert h.ack(1, 0, 1, 2) is None
    assert 1 in h.coord.pending
    assert h.sent.new() == []
    h.clock.advance(0.25)
    done = h.ack(1, 3)
    assert done is not None and done.checkpoint_id == 1 and not done.final
    assert done.duration_ms == pytest.approx(250.0)
    assert h.completed == [done]
    assert h.coord.pending == {}
    # Only the tasks whose operators act on it (the sinks commit) hear of it.
    assert of_type(h.sent.new(), P.Complete) == [(i, P.Complete(1)) for i in SINK_TASKS]
    assert done.path == os.path.join(h.storage.root, "chk-1", "_metadata")
    meta = h.storage.read_metadata(1)
    assert meta.checkpoint_id == 1 and meta.job == "job" and meta.attempt == 0
    assert meta.final is False
    assert meta.duration_ms == pytest.approx(250.0)
    assert meta.tasks["count[1]"] == TaskStateHandle("t3.state", 10, 1, {})
    assert set(meta.task_metrics) == {"src[0]", "src[1]", "count[0]", "count[1]"}
    m = meta.metrics
    assert m.tasks == 4 and m.max_alignment_ms == 3.0 and m.mean_alignment_ms == 1.5
    assert m.state_bytes == 400 and m.keys == 6
    assert h.storage.completed_checkpoints() == [1]


def test_ack_without_state_is_not_listed_in_tasks(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.tick(10)
    h.ack(1, 0, 1, state=False)
    h.ack(1, 2, 3)
    assert set(h.storage.read_metadata(1).tasks) == {"count[0]", "count[1]"}


def test_metadata_records_the_steps_whose_state_it_holds(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.tick(10)
    for index, (op, groups) in enumerate(
        [("src", None), ("src", None), ("count", (0, 64)), ("count", (64, 128))]
    ):
        layout = OperatorLayout(index % 2, 2, groups)
        state = TaskStateHandle(f"t{index}.state", 10, 1, {op: layout})
        h.coord.on_ack(P.Ack(index, 0, 1, state, AckMetrics()))
    meta = h.storage.read_metadata(1)
    # "out" (the collect sink) is not listed: no task acked state for it
    assert meta.steps == (
        StepState("count", "reduce", 2, True),
        # the source's positions redistribute on a rescaled restore (runtime.strided)
        StepState("src", "source", 2, False, redistribute=True),
    )


def test_late_ack_is_ignored(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.tick(10)
    h.ack(1)
    h.sent.new()
    assert h.ack(1, 2) is None
    assert h.ack(99, 0) is None
    assert h.sent.new() == []
    assert len(h.completed) == 1


def test_timeout_aborts_expired(tmp_path: Path) -> None:
    h = Harness(tmp_path, checkpoint_timeout=5.0)
    h.tick(10)
    h.ack(1, 0, 1, 2)
    os.makedirs(os.path.join(h.storage.root, "chk-1"), exist_ok=True)  # a task's state file
    open(os.path.join(h.storage.root, "chk-1", "src[0].state"), "wb").close()
    assert h.tick(5.0) == []  # exactly the timeout: not yet
    sent = h.tick(0.1)
    assert of_type(sent, P.Abort) == [(i, P.Abort(1, R.EXPIRED)) for i in ALL]
    assert 1 not in h.coord.pending
    assert triggers(sent) == []  # the interval runs from the last trigger (t=10): due at 20
    (failed,) = h.coord.failed
    assert (
        failed.reason is CheckpointFailureReason.EXPIRED
        and "1 task(s) did not ack" in failed.detail
    )
    assert not os.path.exists(os.path.join(h.storage.root, "chk-1"))
    assert h.coord.consecutive_failures == 1
    assert h.ack(1, 3) is None  # the straggler's ack is late now
    assert triggers(h.tick(5.0)) == [(0, 2, False), (1, 2, False)]


def test_decline_aborts_declined(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.tick(10)
    h.coord.on_decline(P.Decline(2, 0, 1, R.STATE_WRITE_FAILED, "disk full"))
    assert of_type(h.sent.new(), P.Abort) == [(i, P.Abort(1, R.STATE_WRITE_FAILED)) for i in ALL]
    (failed,) = h.coord.failed
    assert failed.reason is CheckpointFailureReason.STATE_WRITE_FAILED
    assert failed.detail == "declined by task count[0]: disk full"
    assert h.coord.consecutive_failures == 1
    h.coord.on_decline(P.Decline(3, 0, 1, R.DECLINED, "again"))  # already aborted: nothing
    assert h.sent.new() == [] and len(h.coord.failed) == 1


def test_completing_n_subsumes_older_pending(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_concurrent_checkpoints=3)
    h.tick(10)
    h.tick(10)
    h.tick(10)
    assert set(h.coord.pending) == {1, 2, 3}
    h.sent.new()
    h.ack(2)
    assert set(h.coord.pending) == {3}
    sent = h.sent.new()
    assert of_type(sent, P.Abort) == [(i, P.Abort(1, R.SUBSUMED)) for i in ALL]
    assert of_type(sent, P.Complete) == [(i, P.Complete(2)) for i in SINK_TASKS]
    assert [f.reason for f in h.coord.failed] == [CheckpointFailureReason.SUBSUMED]
    assert h.coord.consecutive_failures == 0  # subsumption is not a failure
    assert h.ack(1) is None


def test_consecutive_failures_beyond_tolerable(tmp_path: Path) -> None:
    h = Harness(tmp_path, tolerable_checkpoint_failures=2, checkpoint_timeout=1.0)
    for n in (1, 2, 3):
        h.tick(10)
        h.coord.on_decline(P.Decline(0, 0, n, R.DECLINED, "no"))
        assert h.coord.too_many_failures is (n > 2)
    assert h.coord.consecutive_failures == 3


def test_a_completion_resets_the_failure_count(tmp_path: Path) -> None:
    h = Harness(tmp_path, tolerable_checkpoint_failures=1)
    h.tick(10)
    h.coord.on_decline(P.Decline(0, 0, 1, R.DECLINED, "no"))
    h.tick(10)
    h.ack(2)
    assert h.coord.consecutive_failures == 0
    h.tick(10)
    h.coord.on_decline(P.Decline(0, 0, 3, R.DECLINED, "no"))
    assert not h.coord.too_many_failures


def test_task_failure_abort_does_not_count_or_notify(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.tick(10)
    h.sent.new()
    h.coord.abort_all(CheckpointFailureReason.TASK_FAILURE, "count[1] died")
    assert h.sent.new() == []
    assert h.coord.consecutive_failures == 0
    assert h.coord.pending == {}


def test_retains_the_last_k(tmp_path: Path) -> None:
    h = Harness(tmp_path, retained_checkpoints=2)
    for n in range(1, 6):
        h.tick(10)
        h.ack(n)
    assert h.storage.completed_checkpoints() == [4, 5]
    assert [c.checkpoint_id for c in h.completed] == [1, 2, 3, 4, 5]


def test_final_checkpoint_triggers_exactly_once(tmp_path: Path) -> None:
    h = Harness(tmp_path, checkpoint_timeout=1000.0)
    h.tick(3)
    h.coord.on_sources_ended()
    assert triggers(h.sent.new()) == [(0, 1, True), (1, 1, True)]
    h.coord.on_sources_ended()
    assert h.tick(100) == []  # no further periodic checkpoints either
    h.ack(1)
    assert h.coord.final_completed
    assert h.storage.read_metadata(1).final is True
    # Every task hears of the final checkpoint: each ends on it.
    assert of_type(h.sent.new(), P.Complete) == [(i, P.Complete(1)) for i in ALL]
    h.coord.on_sources_ended()
    assert triggers(h.sent.new()) == []


def test_final_checkpoint_without_periodic_checkpoints(tmp_path: Path) -> None:
    h = Harness(tmp_path, checkpoint_interval=None)
    h.coord.on_sources_ended()
    assert triggers(h.sent.new()) == [(0, 1, True), (1, 1, True)]
    h.ack(1)
    assert h.coord.final_completed


def test_final_checkpoint_after_a_periodic_one_is_pending(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.tick(10)
    h.coord.on_sources_ended()
    assert triggers(h.sent.new())[-2:] == [(0, 2, True), (1, 2, True)]
    h.ack(2)
    assert h.coord.final_completed and h.coord.pending == {}  # 1 was subsumed


def test_expired_final_checkpoint_fails_the_attempt(tmp_path: Path) -> None:
    # Sources sent end-of-input after the final barrier, so the final checkpoint cannot be
    # repeated within the attempt: the coordinator reports it and the job manager restarts.
    h = Harness(tmp_path, checkpoint_interval=None, checkpoint_timeout=5.0)
    h.coord.on_sources_ended()
    h.sent.new()
    sent = h.tick(6)
    assert of_type(sent, P.Abort)
    failed = h.coord.final_failed
    assert failed is not None and failed.reason is CheckpointFailureReason.EXPIRED
    assert not h.coord.final_completed
    assert triggers(h.tick(20)) == []  # not re-triggered


def test_checkpoint_ids_start_at_first_id(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    coord = CheckpointCoordinator(
        small_plan(), h.config, None, h.sent, first_id=17, attempt=2, clock=h.clock
    )
    h.clock.advance(10)
    coord.on_tick()
    assert {m.checkpoint_id for _, m in h.sent.new() if isinstance(m, P.Trigger)} == {17}
    done = coord.on_ack(P.Ack(0, 2, 17, None, AckMetrics()))
    assert done is None
    for i in (1, 2, 3):
        done = coord.on_ack(P.Ack(i, 2, 17, None, AckMetrics())) or done
    assert done is not None and done.path is None  # no storage: nothing written


def test_a_failed_metadata_write_is_a_failed_checkpoint_not_an_error(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.tick(10)

    def full_disk(metadata: CheckpointMetadata) -> str:
        raise OSError(28, "No space left on device")

    h.storage.write_metadata = full_disk  # type: ignore[method-assign]
    assert h.ack(1) is None
    (failed,) = h.coord.failed
    assert failed.reason is CheckpointFailureReason.METADATA_WRITE_FAILED
    assert "No space left" in failed.detail
    assert h.coord.consecutive_failures == 1 and h.completed == []
    assert of_type(h.sent.new(), P.Abort) == [(i, P.Abort(1, R.METADATA_WRITE_FAILED)) for i in ALL]


def test_a_failed_deletion_is_logged_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(tmp_path, retained_checkpoints=1)

    def unreachable(*_args: Any) -> Any:
        raise StorageAccessError("cannot remove 's3://b/chk/chk-1': EndpointConnectionError")

    h.storage.discard = unreachable  # type: ignore[method-assign,assignment]
    h.storage.retain = unreachable  # type: ignore[method-assign,assignment]
    h.tick(10)
    h.coord.on_decline(P.Decline(2, 0, 1, R.STATE_WRITE_FAILED, "disk full"))
    assert [f.checkpoint_id for f in h.coord.failed] == [1]  # aborted all the same
    h.tick(10)
    assert h.ack(2) is not None and h.coord.completed[-1].checkpoint_id == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("could not delete checkpoint 1" in w and "s3://b/chk/chk-1" in w for w in warnings)
    assert any("could not delete old ones" in w for w in warnings)


# -- the attempt fence --------------------------------------------------------------------
def stale_ack_then_current_acks(tmp_path: Path) -> tuple[CheckpointCoordinator, list[bool]]:
    """Attempt 2's checkpoint 17 is pending; task 0 of attempt 1 (alive behind a
    partition) acks it, then tasks 1..3 of attempt 2 do. Whether each ack completed it."""
    h = Harness(tmp_path)
    coord = CheckpointCoordinator(
        small_plan(), h.config, None, h.sent, first_id=17, attempt=2, clock=h.clock
    )
    h.clock.advance(10)
    coord.on_tick()
    done = [coord.on_ack(P.Ack(0, 1, 17, None, AckMetrics())) is not None]
    done += [coord.on_ack(P.Ack(i, 2, 17, None, AckMetrics())) is not None for i in (1, 2, 3)]
    return coord, done


def test_an_ack_of_another_attempt_never_completes_a_checkpoint(tmp_path: Path) -> None:
    coord, done = stale_ack_then_current_acks(tmp_path)
    assert done == [False, False, False, False] and coord.fenced == 1
    assert coord.pending[17].not_yet_acked == {0}
    coord.on_decline(P.Decline(0, 1, 17, R.DECLINED, "stale"))  # nor aborts one
    assert 17 in coord.pending and coord.fenced == 2
    assert coord.on_ack(P.Ack(0, 2, 17, None, AckMetrics())) is not None


def test_companion_without_the_fence_a_stale_ack_completes_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(P, "of_attempt", lambda msg, attempt: True)  # the fence off
    _coord, done = stale_ack_then_current_acks(tmp_path)
    assert done == [False, False, False, True]  # completed without task 0's own ack

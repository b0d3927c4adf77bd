"""Watermarks through a task on fakes (no Spark): the input side's min over channels,
sides of a union, ended channels, idleness, broadcast on every output channel, and the
build-time errors of event time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from channels.messages import Barrier, EndOfInput, Watermark
from runtime.api.dataflow import Dataflow
from runtime.config import JobConfig
from runtime.plan import JobPlan
from runtime.sources import CollectionSource
from runtime.task import Task
from runtime.task_environment import TaskEnvironment
from tests.runtime.test_task import FakeIO, data, event


def ts(record: Any) -> Any:
    return record[1]


def first(record: Any) -> Any:
    return record[0]


def sided(key: Any, record: Any, state: Any, ctx: Any) -> list[Any]:
    return [(key, record[1], ctx.timestamp, ctx.watermark)]


def merge_plan() -> JobPlan:
    """Two sources with timestamps -> union "merge" (x1) -> hash -> process (x2)."""
    flow = Dataflow("et", parallelism=1)
    a = flow.source(CollectionSource([("a", 1)]), name="a").assign_timestamps(ts, name="ts_a")
    b = flow.source(CollectionSource([("b", 2)]), name="b").assign_timestamps(ts, name="ts_b")
    (
        a.union(b, name="merge")
        .key_by(first)
        .process(sided, name="proc", parallelism=2)
        .collect("out")
    )
    return flow.plan()


def merge_task(tmp_path: Path) -> tuple[Task, FakeIO]:
    plan = merge_plan()
    spec = next(t for t in plan.tasks if t.task_id == "merge[0]")
    env = TaskEnvironment(
        jm_endpoint="fake://jm",
        attempt=0,
        config=JobConfig(heartbeat_interval=3600),
        checkpoint_root=None,
        restore_root=None,
        restore_metadata=None,
        run_id="test",
    )
    io = FakeIO()
    return Task(plan, spec, env, io, "127.0.0.1"), io


def test_a_task_forwards_the_min_watermark_on_every_output_channel(tmp_path: Path) -> None:
    task, io = merge_task(tmp_path)
    task.open()
    final = Barrier(1, 0.0, final=True)
    io.gate.frames.extend(
        [
            data(0, ("a", 5)),
            event(0, Watermark(4)),  # channel 1 still holds it at -inf
            event(1, Watermark(2)),  # -> 2
            event(1, Watermark(9)),  # -> 4
            event(1, Watermark(1)),  # backwards on its channel: nothing
            event(0, Watermark(3, idle=True)),  # channel 0 idle: -> 9
            event(0, Watermark(6)),  # resumes: holds again, but never backwards
            event(0, final),
            event(0, EndOfInput()),  # (blocked behind the final barrier until aligned)
            event(1, Watermark(12)),  # min(6, 12): nothing
            event(1, final),
            event(1, EndOfInput()),  # every input ended, after the final snapshot
        ]
    )
    task.run()
    sent = [(name, e) for name, e in io.log if name == "forward"]
    marks = [e.timestamp for _, e in sent if isinstance(e, Watermark)]
    # each watermark goes to both output channels (the hash edge has two); the input
    # ended after the final barrier (a stop with a savepoint): event time stays where the
    # snapshot has it (a source that ends sends the end of time before that barrier)
    assert marks == [m for m in (2, 4, 9) for _ in range(2)]
    assert task.input_side.watermark == float("inf") and task.chain.watermark == 9
    # the task's watermark at the (final) checkpoint is in its ack: checkpoints --show
    from runtime import control as P

    assert io.jm.of_type(P.Ack)[0].metrics.watermark == 9
    task.close(graceful=True)


def test_a_task_with_every_input_idle_forwards_idleness(tmp_path: Path) -> None:
    task, io = merge_task(tmp_path)
    task.open()
    for ch in (0, 1):
        task.input_side.dispatch(ch, 4, event(ch, Watermark(7, idle=True)))
    idle = [e for name, e in io.log if isinstance(e, Watermark)]
    assert idle == [Watermark(float("-inf"), idle=True)] * 2
    task.input_side.dispatch(0, 4, event(0, Watermark(8)))  # active again
    assert [e for name, e in io.log if isinstance(e, Watermark)][-2:] == [Watermark(8)] * 2
    task.close(graceful=False)


def test_an_abort_from_the_job_manager_reaches_the_operators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime import control as P
    from runtime.operators import Operator

    told: list[int] = []
    monkeypatch.setattr(Operator, "notify_checkpoint_aborted", lambda self, n: told.append(n))
    task, io = merge_task(tmp_path)
    task.open()
    io.jm.tell(P.Abort(5, P.CheckpointFailureReason.EXPIRED))
    task._serve_control()
    assert told == [5] * len(task.chain.operators)
    task.close(graceful=False)


def test_explain_shows_where_watermarks_are_generated() -> None:
    text = merge_plan().explain()
    assert "'ts_a' assigns timestamps and generates watermarks here (max_delay 0" in text


def test_a_bad_timestamp_at_a_source_fails_the_job_naming_the_step(tmp_path: Path) -> None:
    """Fatal: a restart would replay the same record into the same error."""
    from runtime import control as P
    from runtime.errors import TaskCancelled

    flow = Dataflow("bad_ts")
    src = flow.source(CollectionSource([("a", 1), ("b", "noon")]), name="src")
    src.assign_timestamps(ts, name="stamps").collect("out")
    plan = flow.plan()
    spec = plan.tasks[0]
    env = TaskEnvironment(
        jm_endpoint="fake://jm",
        attempt=0,
        config=JobConfig(heartbeat_interval=3600),
        checkpoint_root=None,
        restore_root=None,
        restore_metadata=None,
        run_id="test",
    )
    io = FakeIO()
    task = Task(plan, spec, env, io, "127.0.0.1")
    task.open()
    with pytest.raises(TaskCancelled, match="operator 'stamps' failed"):
        task.run()
    failed = io.jm.of_type(P.Failed)[0]
    assert failed.fatal and failed.operator == "stamps"
    assert "step 'stamps': the timestamp function returned 'noon' (str)" in failed.error
    task.close(graceful=False)

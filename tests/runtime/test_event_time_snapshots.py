"""Event time and snapshots, on fakes (no Spark). Watermarks in every snapshot: a
restored task starts from the watermark its ack recorded, also without an event-time
operator, and a chain restored at another parallelism from the minimum over its old
subtasks; the companion (``debug_drop_event_time``) starts from minus infinity.
Synchronous snapshots: no processing-time timer fires while the job is halted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from channels.messages import Watermark
from runtime.api.dataflow import Dataflow
from runtime.config import JobConfig
from runtime.plan import JobPlan
from runtime.sources import CollectionSource
from runtime.task import Task
from runtime.task_environment import TaskEnvironment
from runtime.window_kinds import Tumbling
from statebackend.metadata import CheckpointMetadata
from tests.runtime.test_event_time_task import merge_plan
from tests.runtime.test_restored_watermark import NO, metadata
from tests.runtime.test_task import FakeIO, event


def task_of(plan: JobPlan, task_id: str, meta: CheckpointMetadata, **settings: Any) -> Task:
    spec = next(t for t in plan.tasks if t.task_id == task_id)
    env = TaskEnvironment(
        jm_endpoint="fake://jm",
        attempt=1,
        config=JobConfig(heartbeat_interval=3600, **settings),
        checkpoint_root=None,
        restore_root=None,
        restore_metadata=meta,
        run_id="test",
    )
    return Task(plan, spec, env, FakeIO(), "127.0.0.1")


def test_a_task_without_event_time_operators_resumes_at_its_watermark(tmp_path: Path) -> None:
    """'merge' (a union: no event-time operator) acked watermark 42: restored, it tells
    downstream 42 when it goes idle, and forwards nothing until its input passes 42."""
    for drop, start in ((False, 42.0), (True, NO)):
        task = task_of(merge_plan(), "merge[0]", metadata(merge_0=42.0), debug_drop_event_time=drop)
        io: Any = task.io
        task.open()
        assert task.chain.watermark == start and task.input_side.watermark == start
        for ch in (0, 1):
            task.input_side.dispatch(ch, 4, event(ch, Watermark(30)))
        for ch in (0, 1):
            task.input_side.dispatch(ch, 4, event(ch, Watermark(50)))
        marks = [e.timestamp for _, e in io.log if isinstance(e, Watermark)]
        # the first watermark it emits after the restore is past the one it had
        assert marks == ([50, 50] if not drop else [30, 30, 50, 50])
        task.close(graceful=False)


def test_a_window_restored_at_another_parallelism_starts_from_the_minimum() -> None:
    flow = Dataflow("et", parallelism=1)
    (
        flow.source(CollectionSource([("a", 1)]), name="src")
        .assign_timestamps(lambda r: r[1], name="ts")
        .key_by(lambda r: r[0])
        .window(Tumbling(10), name="win", parallelism=3)
        .count()
        .collect("out")
    )
    plan = flow.plan()
    task = task_of(plan, "win[2]", metadata(win_0=40.0, win_1=70.0))  # was at p=2
    task.open()
    (op,) = [o for o in task.chain.operators if o.uses_event_time]
    assert op.watermark == 40.0 and task.chain.watermark == 40.0
    # a record below the restored watermark is late: its window fired before the rescale
    assert task.chain.process([("a", 35)], 0) == []
    assert op.late_records == 1  # type: ignore[attr-defined]
    task.close(graceful=False)


def test_processing_time_timers_do_not_fire_while_the_job_is_halted() -> None:
    """Synchronous snapshots: from the Halt until its checkpoint ends, a task fires no
    processing-time timer (the snapshot must capture a state that does not change under
    it); once the checkpoint ends (here: aborted), the due window fires."""
    from runtime import control as P
    from runtime.window_kinds import TumblingProcessingTime

    flow = Dataflow("pt", parallelism=1)
    (
        flow.source(CollectionSource([("a", 1)]), name="src")
        .key_by(lambda r: r[0])
        .window(TumblingProcessingTime(1), name="win", parallelism=2)
        .count()
        .collect("out")
    )
    plan = flow.plan()
    for synchronous in (True, False):
        mode = "synchronous" if synchronous else "exactly_once"
        task = task_of(plan, "win[0]", metadata(), snapshot_mode=mode)
        io: Any = task.io
        task.open()
        (op,) = [o for o in task.chain.operators if o.step.name == "win"]
        op.clock = lambda: 1_000.0  # type: ignore[attr-defined]  # the window [1000, 1001)
        task.chain.process([("a", 1)], 0)
        if synchronous:
            io.jm.tell(P.Halt(3))
            task._serve_control()
        task._housekeeping(0.0)  # the wall clock is far past 1001: the window is due
        assert len(op.state) == (1 if synchronous else 0)  # type: ignore[attr-defined]
        if synchronous:
            io.jm.tell(P.Abort(3, P.CheckpointFailureReason.EXPIRED))
            task._serve_control()
            task._housekeeping(0.0)
            assert len(op.state) == 0  # type: ignore[attr-defined]
        task.close(graceful=False)

"""Restore compatibility (by step identity) and restore planning, as pure functions."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from statebackend import (
    CheckpointMetadata,
    IncompatibleCheckpointError,
    OperatorLayout,
    RestoreTarget,
    StepState,
    TaskStateHandle,
    check_compatible,
    plan_restore,
)
from statebackend.metrics import CheckpointSummary

LINES = StepState("lines", "source", 2, False)
COUNT = StepState("count", "aggregate", 2, True)
OUT = StepState("counts", "sink", 2, False)


def handle(task: str, **operators: OperatorLayout) -> TaskStateHandle:
    return TaskStateHandle(f"{task}.state", 100, 1, operators)


def wordcount_checkpoint(max_parallelism: int = 128) -> CheckpointMetadata:
    """lines[0..1] (source offsets), count[0..1] (keyed, two halves) + counts (sink)."""
    tasks = {
        "lines[0]": handle("lines[0]", lines=OperatorLayout(0, 2)),
        "lines[1]": handle("lines[1]", lines=OperatorLayout(1, 2)),
        "count[0]": handle(
            "count[0]", count=OperatorLayout(0, 2, (0, 64)), counts=OperatorLayout(0, 2)
        ),
        "count[1]": handle(
            "count[1]", count=OperatorLayout(1, 2, (64, 128)), counts=OperatorLayout(1, 2)
        ),
    }
    return CheckpointMetadata(
        checkpoint_id=7,
        job="wordcount",
        attempt=0,
        final=True,
        trigger_time=0.0,
        completed_time=1.0,
        duration_ms=1000.0,
        max_parallelism=max_parallelism,
        tasks=tasks,
        task_metrics={},
        metrics=CheckpointSummary(),
        steps=(COUNT, OUT, LINES),
    )


# -- check_compatible -------------------------------------------------------------------------
def test_the_same_job_is_compatible() -> None:
    assert check_compatible(wordcount_checkpoint(), [LINES, COUNT, OUT], "wordcount", 128) == []


def test_keyed_steps_may_change_their_parallelism() -> None:
    rescaled = StepState("count", "aggregate", 5, True)
    assert check_compatible(wordcount_checkpoint(), [LINES, rescaled, OUT], "wordcount", 128) == []


def with_in_flight_log(what: str) -> CheckpointMetadata:
    """The wordcount checkpoint with records in flight logged by both count tasks, as
    ``count#<what>`` (an unaligned checkpoint's channel state, a loop's back-edge log)."""
    meta = wordcount_checkpoint()
    tasks = dict(meta.tasks)
    for i in range(2):
        ops = dict(tasks[f"count[{i}]"].operators)
        ops[f"count#{what}"] = OperatorLayout(i, 2)
        tasks[f"count[{i}]"] = handle(f"count[{i}]", **ops)
    return dataclasses.replace(meta, tasks=tasks)


def test_channel_state_restores_only_at_the_parallelism_it_was_logged_at() -> None:
    unaligned = with_in_flight_log("channel-state")
    assert check_compatible(unaligned, [LINES, COUNT, OUT], "wordcount", 128) == []
    rescaled = StepState("count", "aggregate", 3, True)
    with pytest.raises(IncompatibleCheckpointError, match=r"in-flight records \(channel-state\)"):
        check_compatible(unaligned, [LINES, rescaled, OUT], "wordcount", 128)


def test_a_back_edge_log_rescales_only_where_the_job_can_route_it_again() -> None:
    """A loop head's back-edge log is refused at another parallelism unless the job names
    it redistributable (a keyed feedback, `runtime.snapshot_modes.redistributable_logs`)."""
    looped = with_in_flight_log("backedge-log")
    rescaled = StepState("count", "aggregate", 3, True)
    with pytest.raises(IncompatibleCheckpointError, match=r"\(backedge-log\) at parallelism 2"):
        check_compatible(looped, [LINES, rescaled, OUT], "wordcount", 128)
    routed = check_compatible(
        looped,
        [LINES, rescaled, OUT],
        "wordcount",
        128,
        redistributable_logs={"count#backedge-log"},
    )
    assert routed == []


def test_state_without_a_step_of_that_name_is_refused() -> None:
    tally = StepState("tally", "aggregate", 2, True)
    with pytest.raises(IncompatibleCheckpointError) as info:
        check_compatible(wordcount_checkpoint(), [LINES, tally, OUT], "other", 128)
    message = str(info.value)
    assert "state of step 'count' has no step of that name in job 'other'" in message
    assert "pass allow_non_restored_state=True to drop it" in message
    assert "checkpoint 7 of job 'wordcount'" in message
    assert "'lines'" not in message  # matched steps are not blamed


def test_state_of_a_step_of_another_kind_is_refused() -> None:
    reduce = StepState("count", "reduce", 2, True)
    with pytest.raises(
        IncompatibleCheckpointError, match=r"no aggregate step.*'count' is a reduce"
    ):
        check_compatible(wordcount_checkpoint(), [LINES, reduce, OUT], "other", 128)


def test_allow_non_restored_state_drops_unmatched_state_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tally = StepState("tally", "aggregate", 2, True)
    with caplog.at_level(logging.WARNING, logger="absflow.statebackend"):
        dropped = check_compatible(
            wordcount_checkpoint(), [LINES, tally], "wordcount", 128, allow_non_restored_state=True
        )
    assert dropped == [COUNT, OUT]
    messages = [r.getMessage() for r in caplog.records]
    assert any("'count'" in m and "dropped" in m for m in messages)
    assert any("'counts'" in m and "dropped" in m for m in messages)


def test_a_non_keyed_step_must_keep_its_parallelism_even_when_allowed() -> None:
    wider = StepState("lines", "source", 3, False)
    for allow in (False, True):
        with pytest.raises(IncompatibleCheckpointError) as info:
            check_compatible(wordcount_checkpoint(), [wider, COUNT, OUT], "wordcount", 128, allow)
        message = str(info.value)
        assert "step 'lines' has parallelism 3" in message
        assert "run 'lines' with parallelism 2" in message


def test_keyed_state_needs_the_same_max_parallelism() -> None:
    with pytest.raises(IncompatibleCheckpointError, match=r"128 key groups.*max_parallelism=128"):
        check_compatible(wordcount_checkpoint(), [LINES, COUNT, OUT], "wordcount", 64)


# -- plan_restore -----------------------------------------------------------------------------
def test_plan_for_the_same_parallelism() -> None:
    meta = wordcount_checkpoint()
    plan = plan_restore(
        meta,
        1,
        [RestoreTarget(COUNT, range(64, 128)), RestoreTarget(OUT)],
    )
    assert plan.checkpoint_id == 7
    count = plan.operators["count"]
    assert count.operator_state == meta.tasks["count[1]"]  # (keyed steps hold none)
    assert count.keyed_state == (meta.tasks["count[1]"],)
    assert plan.operators["counts"].operator_state == meta.tasks["count[1]"]
    assert plan.operators["counts"].keyed_state == ()


def test_plan_at_another_parallelism_reads_every_overlapping_file() -> None:
    meta = wordcount_checkpoint()
    rescaled = StepState("count", "aggregate", 3, True)
    middle = plan_restore(meta, 1, [RestoreTarget(rescaled, range(42, 85))])
    assert middle.operators["count"].keyed_state == (meta.tasks["count[0]"], meta.tasks["count[1]"])
    assert middle.operators["count"].operator_state is None  # other parallelism: no own file
    last = plan_restore(meta, 2, [RestoreTarget(rescaled, range(85, 128))])
    assert last.operators["count"].keyed_state == (meta.tasks["count[1]"],)


def test_plan_skips_state_of_another_kind_and_new_steps_start_empty() -> None:
    meta = wordcount_checkpoint()
    reduce = StepState("count", "reduce", 2, True)
    fresh = StepState("extra", "map", 2, False)
    plan = plan_restore(meta, 0, [RestoreTarget(reduce, range(0, 64)), RestoreTarget(fresh)])
    assert "count" not in plan.operators
    assert plan.operators["extra"].operator_state is None
    assert plan.operators["extra"].keyed_state == ()


def test_plan_refuses_non_keyed_state_at_another_parallelism() -> None:
    with pytest.raises(IncompatibleCheckpointError, match=r"'lines' at parallelism 3.*run 'lines'"):
        plan_restore(
            wordcount_checkpoint(), 0, [RestoreTarget(StepState("lines", "source", 3, False))]
        )


def test_a_checkpoint_of_another_job_is_refused_naming_both_jobs_and_the_fix() -> None:
    """Even when every step would fit (jobs share step names such as 'lines')."""
    with pytest.raises(IncompatibleCheckpointError) as info:
        check_compatible(wordcount_checkpoint(), [LINES, COUNT, OUT], "clicks", 128)
    message = str(info.value)
    assert message.startswith("cannot restore checkpoint 7 of job 'wordcount' into job 'clicks'")
    assert "it was written by job 'wordcount', not 'clicks'" in message
    assert "Dataflow('wordcount', ...)" in message and "jobmanager checkpoints" in message
    with pytest.raises(IncompatibleCheckpointError):  # allowing dropped state does not help
        check_compatible(
            wordcount_checkpoint(),
            [LINES, COUNT, OUT],
            "clicks",
            128,
            allow_non_restored_state=True,
        )
    check_compatible(wordcount_checkpoint(), [LINES, COUNT, OUT], "wordcount", 128)  # companion

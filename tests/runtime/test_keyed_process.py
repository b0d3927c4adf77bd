"""Keyed process (runtime/keyed_process.py), without Spark: the state handle, event- and
processing-time timers, the context, exactly once across snapshot/restore, and the debug
switch that drops them (companion); on both keyed state backends."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.errors import GraphError
from runtime.graph import Step, StepKind
from runtime.keyed_process import process_args
from runtime.operators import Operator, build_operator
from tests.runtime.backends import state_backend  # noqa: F401  (a fixture)
from tests.runtime.test_operators import keyed_step

pytestmark = pytest.mark.usefixtures("state_backend")


def ts_of(record: Any) -> Any:
    return record[1]


def count_until_timer(key: Any, record: Any, state: Any, ctx: Any) -> None:
    """Counts records per key; emits (key, count, timer time) at timestamp + 10."""
    state.value = (state.value or 0) + 1
    ctx.register_event_time_timer(ctx.timestamp + 10)


def on_timer(key: Any, ts: float, state: Any, ctx: Any) -> list[Any]:
    count, state.value = state.value, None
    return [(key, count, ts, ctx.time_domain)]


def timer_step() -> Step:
    args = process_args(count_until_timer, "counts", on_timer, None)
    args["timestamp_fn"] = ts_of
    return Step(
        0, "counts", StepKind.PROCESS, 1, fn=count_until_timer, args=args, key_fn=lambda r: r[0]
    )


def snapshot(op: Operator) -> tuple[bytes, Any]:
    assert op.keyed_state is not None
    return op.keyed_state.snapshot(), op.snapshot_state(1)


def restore(blob: bytes, state: Any, drop: bool = False) -> Operator:
    op = build_operator(timer_step(), 0, 128, None, debug_drop_event_time=drop)
    assert op.keyed_state is not None
    op.keyed_state.restore([blob])
    op.after_keyed_restore()
    op.restore_state(state)
    return op


def test_event_time_timers_fire_when_the_watermark_passes_them() -> None:
    op = build_operator(timer_step(), 0, 128, None)
    assert op.process([("a", 1), ("b", 5), ("a", 3)]) == []
    assert op.on_watermark(11) == [("a", 2, 11, "event")]  # a's timers at 11 and 13
    assert op.on_watermark(12) == []
    assert op.on_watermark(20) == [("a", None, 13, "event"), ("b", 1, 15, "event")]


def test_timers_fire_exactly_once_across_a_restore() -> None:
    op = build_operator(timer_step(), 0, 128, None)
    op.process([("a", 1), ("b", 50)])
    assert op.on_watermark(30) == [("a", 1, 11, "event")]  # fired before the checkpoint
    blob, state = snapshot(op)
    restored = restore(blob, state)
    assert restored.watermark == 30
    assert restored.on_watermark(30) == []  # a's timer never fires again
    assert restored.on_watermark(100) == [("b", 1, 60, "event")]  # b's fires once
    assert restored.on_watermark(200) == []


def test_companion_restoring_without_timers_loses_the_pending_ones() -> None:
    op = build_operator(timer_step(), 0, 128, None)
    op.process([("b", 50)])
    blob, state = snapshot(op)
    dropped = restore(blob, state, drop=True)
    assert dropped.watermark != 30 and dropped.on_watermark(100) == []  # b's window is lost


def test_processing_time_timers_and_delete() -> None:
    def fn(key: Any, record: Any, state: Any, ctx: Any) -> None:
        ctx.register_processing_time_timer(1000.0 + record[1])
        if record[1] == 2:
            ctx.delete_processing_time_timer(1001.0)

    args = process_args(fn, "p", on_timer, None)
    op = build_operator(
        Step(0, "p", StepKind.PROCESS, 1, fn=fn, args=args, key_fn=lambda r: r[0]), 0, 128
    )
    assert op.wants_processing_time
    op.process([("k", 1), ("k", 2), ("j", 3)])
    assert op.on_processing_time(999.0) == []
    assert op.on_processing_time(1002.5) == [("k", None, 1002.0, "processing")]
    assert op.on_processing_time(5000.0) == [("j", None, 1003.0, "processing")]


def test_a_non_number_timestamp_is_a_clear_error_naming_the_step() -> None:
    op = build_operator(timer_step(), 0, 128, None)
    with pytest.raises(GraphError, match=r"step 'counts'.*returned 'late'.*str"):
        op.process([("a", "late")])


def test_three_argument_process_functions_are_unchanged_and_checked() -> None:
    assert process_args(lambda k, r, s: None, "p", None, None)["with_ctx"] is False
    with pytest.raises(GraphError, match="step 'p': on_timer needs a process function"):
        process_args(lambda k, r, s: None, "p", on_timer, None)
    with pytest.raises(GraphError, match="takes \\(key, record, state\\)"):
        process_args(lambda k, r: None, "p", None, None)


def test_timers_of_a_process_step_rescale_from_one_subtask_to_two() -> None:
    op = build_operator(timer_step(), 0, 128, None)
    keys = [f"k{i}" for i in range(20)]
    op.process([(k, i) for i, k in enumerate(keys)])
    blob, state = snapshot(op)
    fired: list[Any] = []
    for subtask in range(2):
        step = timer_step()
        step.parallelism = 2
        part = build_operator(step, subtask, 128, None)
        assert part.keyed_state is not None
        part.keyed_state.restore([blob])
        part.after_keyed_restore()
        part.restore_state(state)
        got: list[Any] = part.on_watermark(1000)  # (key, ...) records
        assert all(part.keyed_state.key_group_of(k) in part.keyed_state.key_groups for k, *_ in got)
        fired += got
    assert sorted(fired) == sorted((k, 1, i + 10, "event") for i, k in enumerate(keys))


def test_process_state_handle_value_list_map_and_clear() -> None:
    def fn(key: Any, record: Any, state: Any) -> list[Any]:
        if record[1] == "reset":
            state.clear()
            return [(key, "cleared")]
        state.value = (state.value or 0) + 1
        state.list("seen").append(record[1])
        state.map("last")["v"] = record[1]
        return [(key, state.value, list(state.list("seen")), state.map("last")["v"])]

    op = build_operator(keyed_step(StepKind.PROCESS, fn), 0, 128, None)
    assert op.process([("a", "x"), ("b", "y"), ("a", "z")]) == [
        ("a", 1, ["x"], "x"),
        ("b", 1, ["y"], "y"),
        ("a", 2, ["x", "z"], "z"),
    ]
    assert op.process([("a", "reset"), ("a", "w")]) == [("a", "cleared"), ("a", 1, ["w"], "w")]
    assert op.process([("b", "q")]) == [("b", 2, ["y", "q"], "q")]  # other keys untouched

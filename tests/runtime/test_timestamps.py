"""Event time in the logical graph (runtime/timestamps.py): the assigner's arguments and
position, which timestamp function a step's records carry, and the build-time checks of
event-time steps, each error naming the step and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.api.dataflow import Dataflow
from runtime.errors import GraphError
from runtime.graph import LogicalGraph, Step
from runtime.sources import CollectionSource
from runtime.timestamps import (
    TimestampError,
    check_assigner_args,
    has_watermarks,
    timestamp_fn_of,
)
from runtime.window_kinds import Tumbling


def ts(record: Any) -> Any:
    return record[1]


def other_ts(record: Any) -> Any:
    return record[2]


def first(record: Any) -> Any:
    return record[0]


def step(graph: LogicalGraph, name: str) -> Step:
    return next(s for s in graph.steps if s.name == name)


def build(**kw: Any) -> Dataflow:
    flow = Dataflow("bad")
    src = flow.source(CollectionSource([("a", 1)]), name="src")
    if kw.get("after_map"):
        src.map(lambda r: r, name="m").assign_timestamps(ts, name="late_ts")
    else:
        src.assign_timestamps(ts, max_delay=kw.get("max_delay", 0), name="ts").collect("out")
    return flow


def test_build_time_errors_name_the_step() -> None:
    with pytest.raises(GraphError, match=r"step 'ts': max_delay must be a number >= 0.*-1"):
        build(max_delay=-1)
    with pytest.raises(
        GraphError, match=r"step 'late_ts': assign_timestamps\(...\) must follow a source"
    ):
        build(after_map=True)
    flow = Dataflow("bad2")
    src = flow.source(CollectionSource([("a", 1)]), name="src")
    with pytest.raises(GraphError, match=r"step 'ts2': idle_timeout"):
        src.assign_timestamps(ts, idle_timeout=0, name="ts2")


@pytest.mark.parametrize("max_delay", [-1, -0.5, True, float("inf"), float("nan"), "5", None])
def test_max_delay_must_be_a_finite_number_at_least_zero(max_delay: Any) -> None:
    with pytest.raises(GraphError, match=rf"step 'ts': max_delay must be .*got {max_delay!r}"):
        check_assigner_args("ts", max_delay, None)


@pytest.mark.parametrize("idle_timeout", [0, -1, False, "1", float("nan")])
def test_idle_timeout_must_be_positive_seconds_or_none(idle_timeout: Any) -> None:
    with pytest.raises(GraphError, match=r"step 'ts': idle_timeout must be .* or None"):
        check_assigner_args("ts", 0, idle_timeout)


@pytest.mark.parametrize("max_drift", [0, -5, True, float("inf"), float("nan"), "1s"])
def test_max_drift_must_be_a_positive_finite_number_or_none(max_drift: Any) -> None:
    with pytest.raises(GraphError, match=r"step 'ts': max_drift must be a number > 0 .*None"):
        check_assigner_args("ts", 0, None, max_drift)


@pytest.mark.parametrize(
    ("max_delay", "idle_timeout", "max_drift"),
    [(0, None, None), (2.5, 0.1, 1), (10**12, 30, 60_000.5)],
)
def test_valid_assigner_arguments_pass(max_delay: Any, idle_timeout: Any, max_drift: Any) -> None:
    check_assigner_args("ts", max_delay, idle_timeout, max_drift)


def two_timestamped_sources(right_ts: Any = ts) -> tuple[Dataflow, LogicalGraph]:
    """a, b (timestamps) -> union u -> filter f -> window w; f -> map m; plain source c."""
    flow = Dataflow("t")
    a = flow.source(CollectionSource([("a", 1, 2)]), name="a").assign_timestamps(ts, name="ts_a")
    b = flow.source(CollectionSource([("b", 1, 2)]), name="b")
    merged = a.union(b.assign_timestamps(right_ts, name="ts_b"), name="u").filter(bool, name="f")
    merged.key_by(first).window(Tumbling(5), name="w").count().collect("out")
    merged.map(lambda r: r, name="m").collect("o2")
    flow.source(CollectionSource([("c", 1, 2)]), name="c").collect("o3")
    return flow, flow.graph


def test_shape_keeping_steps_carry_the_assigners_function_and_a_map_drops_it() -> None:
    _, graph = two_timestamped_sources()
    for name in ("ts_a", "u", "f"):
        assert timestamp_fn_of(graph, step(graph, name)) is ts, name
    assert timestamp_fn_of(graph, step(graph, "m")) is None
    assert timestamp_fn_of(graph, step(graph, "c")) is None


def test_a_union_of_streams_with_different_functions_has_none() -> None:
    _, graph = two_timestamped_sources(right_ts=other_ts)
    assert timestamp_fn_of(graph, step(graph, "ts_b")) is other_ts
    assert timestamp_fn_of(graph, step(graph, "u")) is None
    assert timestamp_fn_of(graph, step(graph, "f")) is None


def test_watermarks_reach_a_step_only_if_every_input_has_an_assigner_upstream() -> None:
    _, graph = two_timestamped_sources()
    assert has_watermarks(graph, step(graph, "w")) and has_watermarks(graph, step(graph, "m"))
    assert not has_watermarks(graph, step(graph, "c"))
    assert not has_watermarks(graph, step(graph, "a"))  # the source itself is before the assigner


def test_validation_gives_an_event_time_step_its_inputs_timestamp_function() -> None:
    flow, graph = two_timestamped_sources()
    assert step(graph, "w").args["timestamp_fn"] is None
    flow.validate()
    assert step(graph, "w").args["timestamp_fn"] is ts


def test_a_union_of_different_functions_needs_an_explicit_timestamp() -> None:
    flow, _ = two_timestamped_sources(right_ts=other_ts)
    with pytest.raises(GraphError, match=r"step 'w' uses event time.*pass timestamp=fn to 'w'"):
        flow.validate()


def test_a_non_number_timestamp_names_the_step_the_value_and_the_unit() -> None:
    err = TimestampError.of("ts", ("a", "7"), "7")
    assert isinstance(err, GraphError)
    assert str(err).startswith("step 'ts': the timestamp function returned '7' (str)")
    assert "for record ('a', '7')" in str(err) and "an int or a float" in str(err)


def test_explain_says_where_sources_are_aligned() -> None:
    flow = Dataflow("aligned", parallelism=2)
    flow.source(CollectionSource([("a", 1)]), name="src").assign_timestamps(
        ts, max_drift=250, name="ts"
    ).collect("out")
    assert "pauses while more than 250 ahead of the lowest aligned source" in flow.explain()
    assert flow.plan().aligned_sources == {0, 1}
    assert "pauses" not in build().explain() and build().plan().aligned_sources == frozenset()

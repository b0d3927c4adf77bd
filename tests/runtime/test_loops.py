"""Loops in the DAG API: building, validation, back-edge detection, planning."""

from __future__ import annotations

from typing import Any

import pytest

from runtime import Dataflow
from runtime.api.dataflow import Loop, Stream
from runtime.errors import GraphError
from runtime.graph import EdgeKind, StepKind
from runtime.plan import JobPlan
from runtime.sources import CollectionSource


def ident(x: Any) -> Any:
    return x


def is_one(x: Any) -> bool:
    return bool(x == 1)


def not_one(x: Any) -> bool:
    return bool(x != 1)


def numbers(flow: Dataflow, name: str = "numbers") -> Stream:
    return flow.source(CollectionSource(list(range(1, 10))), name=name)


def collatz_flow(parallelism: int = 2, keyed_feedback: bool = False) -> Dataflow:
    flow = Dataflow("collatz", parallelism=parallelism)
    loop = numbers(flow).iterate(name="loop")
    step = loop.stream.map(ident, name="step")
    back = step.filter(not_one, name="again")
    loop.feedback(back.key_by(ident) if keyed_feedback else back)
    step.filter(is_one, name="done").collect("out")
    return flow


def back_edge_steps(plan: JobPlan) -> set[tuple[str, str]]:
    return {
        (plan.steps[c.source_step].name, plan.steps[c.target_step].name)
        for c in plan.channels
        if c.back_edge
    }


def assert_acyclic_without_back_edges(plan: JobPlan) -> None:
    """Kahn's algorithm over the task graph minus back-edge channels."""
    succ: dict[int, list[int]] = {t.index: [] for t in plan.tasks}
    indegree = dict.fromkeys(succ, 0)
    for c in plan.channels:
        if not c.back_edge:
            succ[c.source_task].append(c.target_task)
            indegree[c.target_task] += 1
    ready = [t for t, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        t = ready.pop()
        seen += 1
        for u in succ[t]:
            indegree[u] -= 1
            if indegree[u] == 0:
                ready.append(u)
    assert seen == len(plan.tasks), "the task graph minus back-edges has a cycle"


# -- building -------------------------------------------------------------------------
def test_a_loop_head_merges_entry_and_feedback() -> None:
    plan = collatz_flow().plan()
    head = next(s for s in plan.steps if s.name == "loop")
    assert head.kind is StepKind.ITERATE
    assert [(plan.steps[e.source].name, e.kind) for e in head.inputs] == [
        ("numbers", EdgeKind.REGULAR),
        ("again", EdgeKind.FEEDBACK),
    ]


def test_iterate_returns_a_loop_with_the_body_input() -> None:
    flow = Dataflow("f")
    loop = numbers(flow).iterate(name="l", parallelism=3)
    assert isinstance(loop, Loop) and loop.stream.step is loop.head
    assert loop.head.parallelism == 3 and repr(loop) == "Loop('l')"


# -- build-time errors ------------------------------------------------------------------
def test_a_loop_never_closed_is_rejected_at_validation() -> None:
    flow = Dataflow("f")
    loop = numbers(flow).iterate(name="open_loop")
    loop.stream.collect("out")
    with pytest.raises(GraphError, match=r"loop .open_loop. is never closed: call loop\.feedback"):
        flow.validate()


def test_feedback_from_a_stream_outside_the_loop_is_rejected() -> None:
    flow = Dataflow("f")
    src = numbers(flow)
    other = numbers(flow, "other").map(ident, name="outside")
    loop = src.iterate(name="l")
    with pytest.raises(
        GraphError, match=r"feedback stream .outside. is not built from loop\.stream"
    ):
        loop.feedback(other)


def test_feedback_from_before_the_loop_is_rejected() -> None:
    flow = Dataflow("f")
    src = numbers(flow).map(ident, name="before")
    loop = src.iterate(name="l")
    with pytest.raises(GraphError, match=r"'before' is not built from loop\.stream"):
        loop.feedback(src)


def test_a_loop_closed_twice_is_rejected() -> None:
    flow = Dataflow("f")
    loop = numbers(flow).iterate(name="l")
    body = loop.stream.map(ident, name="body")
    loop.feedback(body.filter(not_one, name="first"))
    with pytest.raises(GraphError, match="loop 'l' is already closed by feedback from 'first'"):
        loop.feedback(body.filter(not_one, name="second"))


def test_a_forward_feedback_edge_between_different_parallelisms_is_rejected() -> None:
    flow = Dataflow("f", parallelism=2)
    loop = numbers(flow).iterate(name="l")
    body = loop.stream.rebalance().map(ident, name="wide", parallelism=3)
    loop.feedback(body.filter(not_one, name="back"))
    body.filter(is_one, name="done").collect("out")
    with pytest.raises(GraphError, match="feedback edge of loop 'l' from 'back': a forward"):
        flow.validate()
    # the fix the message names works
    flow2 = Dataflow("f2", parallelism=2)
    loop2 = numbers(flow2).iterate(name="l")
    body2 = loop2.stream.rebalance().map(ident, name="wide", parallelism=3)
    loop2.feedback(body2.filter(not_one, name="back").rebalance())
    body2.filter(is_one, name="done").collect("out")
    flow2.validate()


def test_feedback_from_another_dataflow_is_rejected() -> None:
    flow, other = Dataflow("f"), Dataflow("g")
    loop = numbers(flow).iterate(name="l")
    with pytest.raises(GraphError, match="belongs to another Dataflow"):
        loop.feedback(numbers(other))


# -- back-edges -----------------------------------------------------------------------------
def test_the_feedback_edge_is_the_back_edge_of_a_simple_loop() -> None:
    plan = collatz_flow().plan()
    assert back_edge_steps(plan) == {("again", "loop")}
    assert_acyclic_without_back_edges(plan)
    head_tasks = [t for t in plan.tasks if t.back_edge_inputs]
    assert [t.task_id for t in head_tasks] == ["loop[0]", "loop[1]"]
    for t in head_tasks:  # forward feedback: one back-edge channel per head subtask
        assert len(t.back_edge_inputs) == 1 and len(t.regular_inputs) == 1


def test_a_keyed_feedback_edge_is_partly_a_tree_edge_of_the_task_graph() -> None:
    # DFS: numbers[0] -> loop[0] -> again[0] -> loop[1] enters loop[1] through the
    # feedback channel again[0]->loop[1] (a tree edge, aligned); the other three feedback
    # channels point to a task on the stack: back-edges, logged.
    plan = collatz_flow(keyed_feedback=True).plan()
    assert back_edge_steps(plan) == {("again", "loop")}
    back = {
        (plan.tasks[c.source_task].task_id, plan.tasks[c.target_task].task_id)
        for c in plan.channels
        if c.back_edge
    }
    assert back == {("again[0]", "loop[0]"), ("again[1]", "loop[0]"), ("again[1]", "loop[1]")}
    assert_acyclic_without_back_edges(plan)


def test_a_loop_chained_into_one_task_feeds_back_to_itself() -> None:
    flow = Dataflow("f")
    loop = numbers(flow).iterate(name="l")
    body = loop.stream.map(ident, name="body")
    loop.feedback(body)
    body.filter(is_one, name="exit").collect("out")
    plan = flow.plan()
    (channel,) = [c for c in plan.channels if c.back_edge]
    assert channel.source_task == channel.target_task
    assert_acyclic_without_back_edges(plan)


def test_nested_loops_each_get_their_back_edge() -> None:
    flow = Dataflow("nested", parallelism=2)
    outer = numbers(flow).iterate(name="outer")
    inner = outer.stream.map(ident, name="outer_body").iterate(name="inner")
    inner_body = inner.stream.map(ident, name="inner_body")
    inner.feedback(inner_body.filter(not_one, name="inner_again"))
    inner_exit = inner_body.filter(is_one, name="inner_exit")
    outer.feedback(inner_exit.filter(not_one, name="outer_again").key_by(ident))
    inner_exit.filter(is_one, name="done").collect("out")
    plan = flow.plan()
    assert back_edge_steps(plan) == {("inner_again", "inner"), ("outer_again", "outer")}
    assert_acyclic_without_back_edges(plan)


def test_sequential_loops_each_get_their_back_edge() -> None:
    flow = Dataflow("chained", parallelism=2)
    first = numbers(flow).iterate(name="first")
    body1 = first.stream.map(ident, name="body1")
    first.feedback(body1.filter(not_one, name="again1"))
    second = body1.filter(is_one, name="exit1").iterate(name="second")
    body2 = second.stream.map(ident, name="body2")
    second.feedback(body2.filter(not_one, name="again2"))
    body2.filter(is_one, name="exit2").collect("out")
    plan = flow.plan()
    assert back_edge_steps(plan) == {("again1", "first"), ("again2", "second")}
    assert_acyclic_without_back_edges(plan)


def test_a_loop_body_with_an_outside_input_still_leaves_a_dag() -> None:
    flow = Dataflow("joined", parallelism=2)
    edges = numbers(flow, "edges")
    loop = numbers(flow, "labels").iterate(name="loop")
    joined = loop.stream.union(edges, name="join")
    body = joined.key_by(ident).reduce(lambda a, b: b, name="propagate")
    loop.feedback(body.filter(not_one, name="again"))
    body.filter(is_one, name="done").collect("out")
    plan = flow.plan()
    assert back_edge_steps(plan)  # the cycle is cut somewhere
    assert_acyclic_without_back_edges(plan)


def test_explain_marks_back_edge_channels() -> None:
    text = collatz_flow(keyed_feedback=True).plan().explain()
    marked = [line for line in text.splitlines() if "[back-edge" in line]
    assert len(marked) == 1 and "hash -> 'loop'" in marked[0], text
    assert "3 of 4 channels" in marked[0], text


def test_an_acyclic_plan_has_no_back_edges() -> None:
    flow = Dataflow("f", parallelism=2)
    numbers(flow).key_by(ident).reduce(lambda a, b: b, name="r").collect("out")
    plan = flow.plan()
    assert not plan.has_loops and not any(t.back_edge_inputs for t in plan.tasks)


def test_aligned_timeout_needs_an_aligned_mode() -> None:
    with pytest.raises(GraphError, match="aligned_timeout applies to aligned"):
        Dataflow("x", snapshot_mode="at_least_once", aligned_timeout=1.0)
    with pytest.raises(GraphError, match="aligned_timeout must be >= 0"):
        Dataflow("x", aligned_timeout=-1)

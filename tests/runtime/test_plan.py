"""Chaining, tasks and channels of the physical plan (runtime.plan.build_plan)."""

from __future__ import annotations

import pytest

from runtime.api.dataflow import Dataflow
from runtime.graph import Partitioning
from runtime.plan import JobPlan
from runtime.sources import GeneratorSource


def ident(x: object) -> object:
    return x


def keep(x: object) -> bool:
    return True


def last(a: object, b: object) -> object:
    return b


def gen() -> GeneratorSource:
    return GeneratorSource(ident, 100)


def chain_names(plan: JobPlan) -> list[list[str]]:
    return [[plan.steps[s].name for s in c.step_ids] for c in plan.chains]


def keyed_plan(p1: int = 2, p2: int = 2, chaining: bool = True) -> JobPlan:
    flow = Dataflow("keyed", parallelism=p1, chaining=chaining)
    (
        flow.source(gen(), name="src")
        .map(ident, name="m")
        .key_by(ident)
        .reduce(last, name="count", parallelism=p2)
        .collect("out")
    )
    return flow.plan()


def test_equal_parallelism_forward_steps_form_one_chain() -> None:
    flow = Dataflow("chain", parallelism=3)
    flow.source(gen(), name="src").map(ident, name="m").filter(keep, name="f").collect("out")
    plan = flow.plan()
    assert chain_names(plan) == [["src", "m", "f", "out"]]
    assert [t.task_id for t in plan.tasks] == ["src[0]", "src[1]", "src[2]"]
    assert plan.channels == []
    assert all(t.inputs == [] and t.outputs == [] for t in plan.tasks)


def test_key_by_breaks_the_chain_and_keyed_step_chains_with_its_sink() -> None:
    plan = keyed_plan()
    assert chain_names(plan) == [["src", "m"], ["count", "out"]]
    assert [t.task_id for t in plan.tasks] == ["src[0]", "src[1]", "count[0]", "count[1]"]
    assert {c.partitioning for c in plan.channels} == {Partitioning.HASH}


def test_keyed_step_with_sink_of_other_parallelism_does_not_chain() -> None:
    flow = Dataflow("keyed", parallelism=2)
    (
        flow.source(gen(), name="src")
        .key_by(ident)
        .reduce(last, name="count")
        .rebalance()
        .collect("out", parallelism=1)
    )
    assert chain_names(flow.plan()) == [["src"], ["count"], ["out"]]


def test_different_parallelism_breaks_the_chain() -> None:
    flow = Dataflow("par", parallelism=2)
    flow.source(gen(), name="src").rebalance().map(ident, name="m", parallelism=3).collect("out")
    plan = flow.plan()
    assert chain_names(plan) == [["src"], ["m", "out"]]
    assert len(plan.channels) == 2 * 3
    assert {c.partitioning for c in plan.channels} == {Partitioning.REBALANCE}


def test_rebalance_of_equal_parallelism_breaks_the_chain() -> None:
    flow = Dataflow("par", parallelism=2)
    flow.source(gen(), name="src").rebalance().map(ident, name="m").collect("out")
    assert chain_names(flow.plan()) == [["src"], ["m", "out"]]


def test_fan_out_starts_new_chains() -> None:
    flow = Dataflow("fan", parallelism=2)
    src = flow.source(gen(), name="src")
    src.map(ident, name="a").collect("out_a")
    src.map(ident, name="b").collect("out_b")
    plan = flow.plan()
    assert chain_names(plan) == [["src"], ["a", "out_a"], ["b", "out_b"]]
    # Two forward edges of parallelism 2: one channel per subtask each.
    assert len(plan.channels) == 4
    src0 = plan.task_by_id("src[0]")
    assert len(src0.outputs) == 2
    assert [o.target_task_ids for o in src0.outputs] == [["a[0]"], ["b[0]"]]


def test_union_is_not_chained_to_its_inputs() -> None:
    flow = Dataflow("union", parallelism=2)
    a = flow.source(gen(), name="a")
    b = flow.source(gen(), name="b")
    a.union(b, name="u").map(ident, name="m").collect("out")
    plan = flow.plan()
    assert chain_names(plan) == [["a"], ["b"], ["u", "m", "out"]]
    u0 = plan.task_by_id("u[0]")
    assert len(u0.inputs) == 2  # forward from a[0] and from b[0]
    assert len(plan.channels) == 4


def test_chaining_off_gives_one_chain_per_step() -> None:
    flow = Dataflow("nochain", parallelism=2, chaining=False)
    flow.source(gen(), name="src").map(ident, name="m").filter(keep, name="f").collect("out")
    plan = flow.plan()
    assert chain_names(plan) == [["src"], ["m"], ["f"], ["out"]]
    assert len(plan.tasks) == 8
    assert len(plan.channels) == 3 * 2  # three forward edges, p channels each


def test_task_ids_and_indexes() -> None:
    plan = keyed_plan(2, 3)
    assert [(t.index, t.task_id, t.subtask) for t in plan.tasks] == [
        (0, "src[0]", 0),
        (1, "src[1]", 1),
        (2, "count[0]", 0),
        (3, "count[1]", 1),
        (4, "count[2]", 2),
    ]
    assert [t.task_id for t in plan.source_tasks] == ["src[0]", "src[1]"]


def test_forward_channels() -> None:
    flow = Dataflow("fwd", parallelism=3, chaining=False)
    flow.source(gen(), name="src").collect("out")
    plan = flow.plan()
    assert len(plan.channels) == 3
    for ch in plan.channels:
        src, dst = plan.tasks[ch.source_task], plan.tasks[ch.target_task]
        assert src.subtask == dst.subtask
        assert ch.partitioning is Partitioning.FORWARD


@pytest.mark.parametrize(("p1", "p2"), [(1, 1), (2, 3), (3, 2), (4, 4)])
def test_hash_channels_connect_every_pair(p1: int, p2: int) -> None:
    plan = keyed_plan(p1, p2)
    assert len(plan.channels) == p1 * p2
    pairs = {(c.source_task, c.target_task) for c in plan.channels}
    assert len(pairs) == p1 * p2
    for t in plan.tasks:
        if t.task_id.startswith("src"):
            (out,) = t.outputs
            assert out.partitioning is Partitioning.HASH
            assert out.key_fn is ident
            assert out.target_task_ids == [f"count[{d}]" for d in range(p2)]
            # Indexed by target subtask.
            assert [plan.tasks[plan.channels[c].target_task].subtask for c in out.channels] == list(
                range(p2)
            )
        else:
            assert len(t.inputs) == p1


def test_broadcast_channels() -> None:
    flow = Dataflow("bc", parallelism=2)
    flow.source(gen(), name="src").broadcast().map(ident, name="m", parallelism=3).collect("out")
    plan = flow.plan()
    assert len(plan.channels) == 6
    assert {c.partitioning for c in plan.channels} == {Partitioning.BROADCAST}


def test_resolve_task_by_any_step_of_its_chain() -> None:
    plan = keyed_plan()
    assert plan.resolve_task("src[1]").task_id == "src[1]"
    assert plan.resolve_task("m[1]").task_id == "src[1]"
    assert plan.resolve_task("out[0]").task_id == "count[0]"
    assert plan.resolve_task("count[1]").index == 3


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("nope[0]", r"no step named 'nope' \(steps: src, m, count, out\)"),
        ("count[2]", r"step 'count' has parallelism 2, subtasks are 0\.\.1"),
        ("count[-1]", r"subtasks are 0\.\.1"),
        ("count", r"must look like 'step\[subtask\]'"),
        ("count[x]", r"subtask 'x' is not an int"),
    ],
)
def test_resolve_task_errors(ref: str, message: str) -> None:
    plan = keyed_plan()
    with pytest.raises(ValueError, match=message):
        plan.resolve_task(ref)


def test_task_by_id_unknown() -> None:
    with pytest.raises(KeyError):
        keyed_plan().task_by_id("m[0]")


def test_explain_mentions_every_task_and_the_partitioning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flow = Dataflow("explained", parallelism=2)
    (
        flow.source(gen(), name="src")
        .map(ident, name="m")
        .key_by(ident)
        .reduce(last, name="count", parallelism=3)
        .collect("out")
    )
    text = flow.explain()
    assert capsys.readouterr().out.strip() == text
    assert "'explained'" in text
    assert "5 tasks, 2 chains, 6 channels" in text
    for task in ("src[0]", "src[1]", "count[0]", "count[1]", "count[2]"):
        assert task in text
    assert "source 'src' -> map 'm'" in text
    assert "reduce 'count' -> sink 'out'" in text
    assert "out: hash -> 'count' (3 channels per subtask)" in text


def test_plan_validates_first() -> None:
    flow = Dataflow("bad")
    flow.source(gen(), name="src")
    with pytest.raises(ValueError, match="no sink"):
        flow.plan()
